"""Load the bundled models compiled, bench-style; helpers for A/B and profiling."""
import json, sys, time, os
sys.path.insert(0, "/work/main")
import torch
from engine.session import Session
from engine.bench.suite import BenchSetup, decode_once
from engine.variants import DrafterOptions
from engine.sampling import SamplingConfig

METHODS = ["vanilla", "medusa", "eagle", "eagle3"]

def load(methods=METHODS, target=None):
    s = Session.load(target, {}, methods + ["ar"], device="cpu", dtype="bfloat16",
                     compile=True, progress=lambda d, t, w: print(w, file=sys.stderr, flush=True) if w.startswith("compiling") else None)
    return s

def setup_for(session, budget="auto", max_new=128, **opts):
    return BenchSetup(session.target, session.parts, DrafterOptions(**opts), SamplingConfig(), max_new,
                      draft_budget=budget, compiled=session.compiled)

def prompts():
    rows = [json.loads(l) for l in open("/work/main/docs/bench-offsuite/prompts.jsonl")]
    return rows

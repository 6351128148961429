"""Shared set-up for in-process A/B scripts: the bundled session compiled in bf16, a BenchSetup, suite prompts."""
from pathlib import Path
import torch
torch.set_grad_enabled(False)
from engine.session import Session
from engine.bench.suite import BenchSetup
from engine.variants import DrafterOptions
from engine.sampling import SamplingConfig
from engine.train.prompts import load_prompt_suite


def load(methods):
    return Session.load(None, {}, methods, dtype="bfloat16", compile=True)


def setup_for(s, budget="auto", max_new=32, **opts):
    return BenchSetup(s.target, s.parts, DrafterOptions(**opts), SamplingConfig(), max_new, draft_budget=budget,
                      compiled=s.compiled)


def prompts(n=16):
    ps = load_prompt_suite(Path("/work/main/resources/prompts/suite.jsonl"))
    return ps[:: max(1, len(ps) // n)][:n]

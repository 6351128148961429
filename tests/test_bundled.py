"""The bundled demo family: loads with plain transformers calls, matches its model card, drafts usefully."""

import json
import random
import re
import weakref

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from engine.budget.draft_budget import DraftBudget, FullBudget
from engine.decoding.loop import Decoder
from engine.drafters.dflash import DFlashDrafter
from engine.drafters.eagle import EagleDrafter
from engine.drafters.eagle3 import Eagle3Drafter
from engine.drafters.lookahead import LookaheadDrafter
from engine.drafters.medusa import MedusaDrafter
from engine.drafters.mtp import MtpDrafter
from engine.drafters.vanilla import VanillaDrafter
from engine.heads.dflash import load_dflash_head
from engine.heads.eagle import load_eagle_head
from engine.heads.eagle3 import load_eagle3_head
from engine.heads.medusa import load_medusa_heads
from engine.heads.mtp import load_mtp_head
from engine.models.loading import BUNDLED, BUNDLED_DRAFT, BUNDLED_TARGET, RESOURCES
from engine.registry import traits
from engine.train.data.corpus import stdlib_corpus
from engine.train.data.prompts import load_prompt_suite
from engine.train.loop.lm import heldout_loss
from engine.train.recipes.demo import encode_files
from tests.conftest import PARALLEL

MODELS = RESOURCES / "models"
SUITE = RESOURCES / "prompts" / "suite.jsonl"


@pytest.fixture(scope="module")
def bundled():
    torch.set_num_threads(1 if PARALLEL else 2)  # another worker uses the other core
    target = AutoModelForCausalLM.from_pretrained(BUNDLED_TARGET, dtype=torch.float32).eval()
    draft = AutoModelForCausalLM.from_pretrained(BUNDLED_DRAFT, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(BUNDLED_TARGET)
    yield target, draft, tok
    torch.set_num_threads(1)


def test_folders_are_complete_and_small():
    for folder in (BUNDLED_TARGET, BUNDLED_DRAFT):
        for name in ("config.json", "model.safetensors", "generation_config.json", "tokenizer.json"):
            assert (folder / name).exists(), folder / name
    demo = sum(p.stat().st_size for p in MODELS.rglob("*.safetensors") if "smollm2" not in p.parts)
    assert demo < 120 * 2**20  # the demo family with its DFlash draft (14 MB) and MTP layer (7 MB)
    smollm2 = sum(p.stat().st_size for p in (MODELS / "smollm2").rglob("*.safetensors"))
    assert smollm2 < 80 * 2**20  # SmolLM2's own parts only (its weights are installed, never committed): 75 MiB
    assert json.loads((BUNDLED_TARGET / "config.json").read_text())["dtype"] == "bfloat16"


def test_tokenizer_round_trips(bundled):
    _, _, tok = bundled
    text = 'def f(x):\n    """Double x."""\n    return x * 2  # ünïcode ok\n'
    ids = tok(text)["input_ids"]
    assert ids[0] == tok.bos_token_id
    assert tok.decode(ids, skip_special_tokens=True) == text
    assert {tok.bos_token_id, tok.eos_token_id, tok.pad_token_id} <= set(range(len(tok)))


@pytest.mark.slow
def test_heldout_loss_matches_model_card(bundled):
    target, _, tok = bundled
    training = json.loads((MODELS / "training.json").read_text())
    corpus = stdlib_corpus()
    if corpus.digest != training["corpus"]["file_list_sha256"]:
        pytest.skip("this interpreter's standard library differs from the one the models were trained on")
    stream = encode_files(tok, corpus.heldout)
    loss = heldout_loss(target, stream, seq_len=512, windows=32)
    card = (MODELS / "README.md").read_text()
    card_loss = float(re.search(r"held-out loss \(nats/token\) \| ([0-9.]+)", card).group(1))
    assert abs(loss - card_loss) / card_loss < 0.05, (loss, card_loss)


DRAFTERS = {
    "vanilla": lambda target, draft: VanillaDrafter(draft, gamma=4),
    "medusa": lambda target, draft: MedusaDrafter(load_medusa_heads(BUNDLED / "medusa", target)),
    "eagle": lambda target, draft: EagleDrafter(load_eagle_head(BUNDLED / "eagle", target)),
    "eagle3": lambda target, draft: Eagle3Drafter(load_eagle3_head(BUNDLED / "eagle3", target)),
    "dflash": lambda target, draft: DFlashDrafter(load_dflash_head(BUNDLED / "dflash", target)),
    "mtp": lambda target, draft: MtpDrafter(load_mtp_head(BUNDLED / "mtp", target)),
    "lookahead": lambda target, draft: LookaheadDrafter(),
    "lookahead-jacobi-only": lambda target, draft: LookaheadDrafter(window=5, ngram=3, guesses=5, context_ngrams=False),
}


_PLAIN: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # target -> {(prompt ids, new tokens): tokens}


def plain_tokens(target, ids: tuple, eos, new: int = 32) -> list[int]:
    """Plain greedy decoding of `new` tokens after `ids`, once per target and prompt in this process: every drafter's
    test compares with it."""
    known = _PLAIN.setdefault(target, {})
    if (ids, new) not in known:
        known[ids, new] = Decoder(target, max_new_tokens=new, eos_token_ids=eos).generate(list(ids)).tokens
    return known[ids, new]


@pytest.mark.slow
@pytest.mark.parametrize("method", DRAFTERS)
def test_bundled_drafters_are_lossless_and_accept(bundled, method):
    """Each bundled drafter reproduces plain greedy decoding in float32 and gets tau above 1.5."""
    target, draft, tok = bundled
    drafter = DRAFTERS[method](target, draft)
    emitted = steps = 0
    for rec in load_prompt_suite(SUITE)[::20][:4]:
        ids = tok(rec["prompt"])["input_ids"]
        ref = plain_tokens(target, tuple(ids), tok.eos_token_id)
        res = Decoder(target, drafter, max_new_tokens=32, eos_token_ids=tok.eos_token_id).generate(ids)
        assert res.tokens == ref, rec["id"]
        steps += res.summary.steps
        emitted += sum(len(e.tokens) for e in res.events[1:])
    # the bundled DFlash draft is the least trained part (its card): it must still accept, not match the heads
    assert emitted / steps > (1.1 if method in ("lookahead-jacobi-only", "dflash") else 1.5)


def test_prompt_suite_is_heldout_and_varied():
    records = load_prompt_suite(SUITE)
    assert len(records) >= 60
    assert len({r["category"] for r in records}) >= 6
    assert len({r["id"] for r in records}) == len(records)
    corpus = stdlib_corpus()
    heldout = {p.relative_to(corpus.root).as_posix() for p in corpus.heldout}
    assert all(r["source"] in heldout for r in records)
    assert all(r["prompt"].strip() for r in records)


class RandomCaps(FullBudget):
    """A depth cap drawn at random every step, 0 (a plain step) included, and half the drafted steps narrow (the
    tree's greedy spine only): the hardest schedule for a drafter's state, which must stay consistent whatever size
    and shape its drafts are."""

    name = "random"

    def __init__(self) -> None:
        self.rng = random.Random(0)

    def choose(self, left: int | None = None) -> int | None:
        cap = self.rng.choice([None, 0, 0, 1, 2, 3])
        self.narrow = cap != 0 and self.rng.random() < 0.5
        return cap


@pytest.mark.slow
@pytest.mark.parametrize("method", DRAFTERS)
@pytest.mark.parametrize("budget", [RandomCaps, DraftBudget])
def test_draft_budgets_change_only_the_draft_size(bundled, method, budget, monkeypatch):
    """Capped drafts, plain steps in between included, give plain greedy decoding's output token for token."""
    import engine.decoding.loop

    if method.startswith("lookahead"):  # forwards priced as a GPU's (flat in width): the window is worth opening,
        # whatever another worker was doing while this one timed its forwards
        monkeypatch.setattr(
            engine.decoding.loop, "measured_once", lambda t, rows, widths, cancel=None: dict.fromkeys(widths, 0.01)
        )
    target, draft, tok = bundled
    drafter = DRAFTERS[method](target, draft)
    budgeted = traits(drafter.name).depth_cap == "always"  # what the drafter's spec declares
    caps, narrowed = set(), False
    for rec in load_prompt_suite(SUITE)[5::40][:2]:
        ids = tok(rec["prompt"])["input_ids"]
        ref = plain_tokens(target, tuple(ids), tok.eos_token_id, 40)
        res = Decoder(target, drafter, max_new_tokens=40, eos_token_ids=tok.eos_token_id, budget=budget()).generate(ids)
        assert res.tokens == ref, rec["id"]
        caps |= {e.budget.depth_cap if e.budget else "none" for e in res.events[1:]}
        narrowed = narrowed or any(e.budget and e.budget.narrow for e in res.events[1:])
        if budgeted:
            assert res.summary.settings["draft_budget"] == budget.name
    if not budgeted:  # n-gram drafters opt out of depth caps; lookahead gates its window instead
        if method.startswith("lookahead"):  # window steps (None) and maybe plain steps (0), never a depth
            assert None in caps and caps <= {None, 0}, caps
        else:
            assert caps == {"none"}
        return
    if budget is RandomCaps:
        assert 0 in caps and None in caps and narrowed, method  # plain steps ran, uncapped ones and narrow ones

"""Every method on a tiny random model of each family transformers ships that people run in 2026: greedy output
equal to the target's own uncached forward (8 tokens, a repetitive prompt), or a one-line refusal, never a traceback.
The results are docs/METHODS.md's family x method table; `GLANCE_WRITE_TABLE=1 python -m pytest
tests/test_families.py` writes it again after a change."""

import os
from pathlib import Path

import pytest
import torch
import transformers as tf
from transformers.cache_utils import DynamicLayer

from engine.decoding.loop import Decoder
from engine.drafters.assistant import AssistantDrafter
from engine.drafters.dflash import DFlashDrafter
from engine.drafters.eagle import EagleDrafter
from engine.drafters.eagle3 import Eagle3Drafter
from engine.drafters.lookahead import LookaheadDrafter
from engine.drafters.medusa import MedusaDrafter
from engine.drafters.mtp import MtpDrafter
from engine.drafters.prompt_lookup import PromptLookupDrafter
from engine.drafters.suffix import SuffixDrafter
from engine.drafters.vanilla import VanillaDrafter
from engine.errors import GlanceError
from engine.heads.assistant import load_assistant_head
from engine.heads.eagle3 import Eagle3Head
from engine.heads.mtp import MtpHead
from engine.runtime.cache import is_recurrent, new_cache
from tests.conftest import VOCAB, tiny_model
from tests.test_dflash import random_head as random_dflash
from tests.test_dflash import recomputed
from tests.test_eagle import random_head
from tests.test_lookahead import LOOPY
from tests.test_medusa import random_heads

DOC = Path(__file__).resolve().parents[1] / "docs" / "METHODS.md"
START, END = "<!-- family table: tests/test_families.py -->", "<!-- end of the family table -->"
NEW = 8
SHAPE = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=128,
)
FAMILIES = {  # transformers' model type: what the tiny config changes (attention among the first four layers)
    "qwen3_5_text": {},
    "qwen3_next": {},
    "nemotron_h": {},
    "jamba": {"attn_layer_offset": 1, "attn_layer_period": 2},
    "falcon_h1": {"mamba_d_ssm": 64, "mamba_n_heads": 4, "mamba_d_state": 16, "mamba_chunk_size": 16},
    "granitemoehybrid": {
        "layer_types": ["mamba", "attention", "mamba", "attention"],
        "mamba_d_state": 16,
        "mamba_n_heads": 4,
        "mamba_chunk_size": 16,
    },
    "mamba2": {"num_heads": 4, "head_dim": 32, "state_size": 16, "n_groups": 1, "chunk_size": 16},
    "lfm2": {},
    "gpt_oss": {"head_dim": 16},
    "olmo3": {},
    "smollm3": {"pad_token_id": 0},
    "gemma4_text": {
        "head_dim": 16,
        "global_head_dim": 16,
        "hidden_size_per_layer_input": 8,
        "vocab_size_per_layer_input": VOCAB,
        "num_kv_shared_layers": 2,
        "layer_types": ["sliding_attention", "full_attention"] * 2,
    },
}
TREES = ("medusa", "eagle", "eagle3", "suffix")  # drafters that propose trees: a recurrent target verifies the spine


def makers(assistant: Path):
    return {
        "ar": lambda t: None,
        "vanilla": lambda t: VanillaDrafter(tiny_model("llama", seed=3, sharpen=4.0), gamma=3),
        "medusa": lambda t: MedusaDrafter(random_heads(t), "cpu_16"),
        "eagle": lambda t: EagleDrafter(random_head(t), top_k=3, depth=3, total_tokens=8),
        "eagle3": lambda t: Eagle3Drafter(Eagle3Head.for_target(t, torch.arange(0, VOCAB, 2)).eval()),
        "dflash": lambda t: DFlashDrafter(random_dflash(t)),
        "mtp": lambda t: MtpDrafter(MtpHead(t).eval(), 3),
        "assistant": lambda t: AssistantDrafter(load_assistant_head(assistant, t), 3),
        "lookahead": lambda t: LookaheadDrafter(window=3, ngram=3, guesses=3),
        "prompt_lookup": lambda t: PromptLookupDrafter(2, 4),
        "suffix": lambda t: SuffixDrafter(),
    }


def family_row(family: str, assistant: Path) -> tuple[str, dict[str, str]]:
    torch.manual_seed(0)
    target = tf.AutoModelForCausalLM.from_config(tf.AutoConfig.for_model(family, **(SHAPE | FAMILIES[family]))).eval()
    layers = getattr(new_cache(target.config), "layers", [])
    recurrent = any(is_recurrent(layer) for layer in layers)
    attention = any(isinstance(layer, DynamicLayer) for layer in layers)  # Falcon-H1's layers hold both
    kind = "hybrid" if recurrent and attention else "recurrent only" if recurrent else "attention"
    ref = recomputed(target, LOOPY, NEW)
    row = {}
    for method, make in makers(assistant).items():
        if method == "assistant" and not family.startswith("gemma4"):
            row[method] = "–"
            continue
        try:
            tokens = Decoder(target, make(target), max_new_tokens=NEW, eos_token_ids=[]).generate(LOOPY).tokens
        except GlanceError:
            row[method] = "refused"
            continue
        assert tokens == ref, (family, method)
        row[method] = (
            "exact" if not recurrent else "spine" if method in TREES else "plain" if method == "lookahead" else "exact"
        )
    return kind, row


def render(rows: dict) -> str:
    methods = list(next(iter(rows.values()))[1])
    lines = ["| family | kind | " + " | ".join(m.replace("_", " ") for m in methods) + " |"]
    lines.append("|---|---|" + "---|" * len(methods))
    for family, (kind, row) in rows.items():
        lines.append(f"| `{family}` | {kind} | " + " | ".join(row[m] for m in methods) + " |")
    return "\n".join(lines)


@pytest.mark.slow
def test_every_family_runs_every_method_exactly_or_refuses_and_the_docs_say_so(tmp_path):
    from tests.test_assistant import save_assistant

    save_assistant(tmp_path / "assistant")
    rows = {family: family_row(family, tmp_path / "assistant") for family in FAMILIES}
    table = render(rows)
    text = DOC.read_text()
    before, rest = text.split(START)
    _, after = rest.split(END)
    if os.environ.get("GLANCE_WRITE_TABLE") == "1":
        DOC.write_text(f"{before}{START}\n{table}\n{END}{after}")
    else:
        assert rest.split(END)[0].strip() == table, (
            "the table moved: GLANCE_WRITE_TABLE=1 pytest tests/test_families.py"
        )

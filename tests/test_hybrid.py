"""Hybrid targets with recurrent state (Gated DeltaNet: Qwen3.5, Qwen3-Next; Mamba: Nemotron-H, Jamba, Falcon-H1,
Granite 4): every chain drafter is lossless against the target's own uncached forward, with rejected drafts undone
by replay (states restored, the kept tokens run again); trees verify their greedy spine; what is not supported yet
(batches, a recurrent draft model, an attention-free model whose own cached forward fails) is refused in one line
before anything runs."""

import pytest
import torch
import transformers as tf

from engine.decoding.loop import Decoder
from engine.drafters.eagle import EagleDrafter
from engine.drafters.lookahead import LookaheadDrafter
from engine.drafters.prompt_lookup import PromptLookupDrafter
from engine.drafters.vanilla import VanillaDrafter
from engine.errors import GlanceError
from tests.conftest import VOCAB, tiny_model
from tests.test_dflash import recomputed
from tests.test_eagle import random_head
from tests.test_families import SHAPE  # the tiny shape every family test shares
from tests.test_lookahead import LOOPY

NEW = 12
# each family with attention in its first four layers (Jamba's and Granite's defaults have none there)
FAMILIES = {
    "qwen3_5_text": {},  # Gated DeltaNet
    "nemotron_h": {},  # Mamba-2
    "jamba": {"attn_layer_offset": 1, "attn_layer_period": 2},  # Mamba
}


def hybrid(family: str, **extra) -> torch.nn.Module:
    torch.manual_seed(0)
    config = tf.AutoConfig.for_model(family, **(SHAPE | FAMILIES.get(family, {}) | extra))
    return tf.AutoModelForCausalLM.from_config(config).eval()


def rejected_some(res) -> bool:
    """Whether a run verified a draft and kept only part of it: the steps the replay undoes."""
    return any(e.draft_tokens and len(e.accepted_nodes) < len(e.draft_tokens) for e in res.events[1:])


@pytest.mark.parametrize("family", FAMILIES)
def test_chain_drafters_are_lossless_on_hybrid_targets(family):
    target = hybrid(family)
    draft = tiny_model("llama", seed=3, sharpen=4.0)  # a full-attention draft of the same vocabulary
    makers = {
        "ar": lambda: None,
        "prompt_lookup": lambda: PromptLookupDrafter(2, 4),
        "vanilla": lambda: VanillaDrafter(draft, gamma=3),
        "lookahead": lambda: LookaheadDrafter(window=3, ngram=3, guesses=3),  # its window cannot ride along: none
    }
    replayed = False
    for prompt in ([1, 2, 3], LOOPY):
        ref = recomputed(target, prompt, NEW)
        for method, make in makers.items():
            res = Decoder(target, make(), max_new_tokens=NEW, eos_token_ids=[]).generate(prompt)
            assert res.tokens == ref, (family, method, prompt)
            replayed = replayed or rejected_some(res)
    assert replayed  # some verification kept part of its draft, and the state was put back


def test_head_drafters_are_lossless_on_a_hybrid_target_and_trees_verify_their_spine():
    """EAGLE's and Medusa's trees verify their greedy spine; EAGLE-3, DFlash and MTP (around the target's own layer
    kind) read a hybrid's features and stay exact."""
    from engine.drafters.dflash import DFlashDrafter
    from engine.drafters.eagle3 import Eagle3Drafter
    from engine.drafters.medusa import MedusaDrafter
    from engine.drafters.mtp import MtpDrafter
    from engine.heads.eagle3 import Eagle3Head
    from engine.heads.mtp import MtpHead
    from tests.test_dflash import random_head as random_dflash
    from tests.test_medusa import random_heads

    target = hybrid("qwen3_5_text")
    ref = recomputed(target, LOOPY, NEW)
    makers = {
        "eagle": lambda: EagleDrafter(random_head(target), top_k=3, depth=3, total_tokens=8),
        "medusa": lambda: MedusaDrafter(random_heads(target), "cpu_16"),
        "eagle3": lambda: Eagle3Drafter(Eagle3Head.for_target(target, torch.arange(0, VOCAB, 2)).eval()),
        "dflash": lambda: DFlashDrafter(random_dflash(target)),
        "mtp": lambda: MtpDrafter(MtpHead(target).eval(), 3),
    }
    for method, make in makers.items():
        res = Decoder(target, make(), max_new_tokens=NEW, eos_token_ids=[]).generate(LOOPY)
        assert res.tokens == ref, method
        assert all(list(e.draft_parents) == list(range(-1, len(e.draft_tokens) - 1)) for e in res.events[1:]), method


def test_what_hybrid_targets_cannot_do_yet_is_refused_in_one_line():
    target = hybrid("qwen3_next")
    with pytest.raises(GlanceError, match="one prompt at a time") as err:
        Decoder(target, None, max_new_tokens=4).generate_batch([[1, 2], [3, 4]])
    assert "\n" not in str(err.value)
    with pytest.raises(GlanceError, match="keeps recurrent state"):  # a hybrid draft model: its cache is not undone
        VanillaDrafter(target, gamma=2)
    for family in ("jamba", "granitemoehybrid"):  # their default first four layers: no attention at all
        torch.manual_seed(0)
        model = tf.AutoModelForCausalLM.from_config(tf.AutoConfig.for_model(family, **SHAPE)).eval()
        with pytest.raises(GlanceError, match="no attention layer"):
            Decoder(model, None, max_new_tokens=4).generate([1, 2, 3])


def test_sampling_on_a_hybrid_target_follows_its_distribution():
    """Leviathan's rule with replay: the second token (drafted, then verified) follows the target's distribution."""
    from tests.test_sampling_exact import second_token_pvalue

    target = hybrid("jamba", vocab_size=12, eos_token_id=None)
    drafter = VanillaDrafter(tiny_model("llama", seed=9, vocab=12, sharpen=6.0), gamma=2)  # q differs from p
    assert second_token_pvalue(target, drafter, [3, 7, 1], 3, drafted=1, n=400) > 1e-3


@pytest.mark.gui
def test_the_window_races_a_hybrid_target(qtbot, tmp_path):
    """A tiny Qwen3.5 folder as the window's target: the lanes that need no part race and match plain decoding."""
    from transformers import AutoTokenizer

    from engine.models.loading import BUNDLED_TARGET
    from tests.test_app import make_window, run_race

    folder = tmp_path / "qwen35"
    torch.manual_seed(0)
    config = tf.AutoConfig.for_model("qwen3_5_text", **(SHAPE | {"vocab_size": 8192}))
    tf.AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    AutoTokenizer.from_pretrained(BUNDLED_TARGET).save_pretrained(folder)
    win = make_window(qtbot, tmp_path, target=str(folder), max_new=12)
    try:
        assert win.models is not None, win.banner.text()
        run_race(qtbot, win, ["ar", "prompt_lookup", "suffix"])
        texts = {n: lane.text() for n, lane in win.lanes.items()}
        assert texts["ar"].strip() and len(set(texts.values())) == 1, texts
        assert "chains, rejections replayed" in win.lanes["suffix"].header.text().replace("\xa0", " ")
        assert not win.banner.isVisible() or not win.banner.text(), win.banner.text()
    finally:
        win.close()
    assert not win.thread.thread.isRunning()

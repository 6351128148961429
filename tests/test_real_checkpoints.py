"""What users bring: Medusa checkpoints with fewer heads than the default tree is deep, drafts whose LM head is
narrower than their tokenizer, target/draft pairs whose LM heads differ in width, and the architectures of the
checkpoints people have (Qwen3, Mistral, Gemma 2, Phi-3, GPT-NeoX, OLMo 2): every variant lossless on each, or a
clear refusal naming what is missing."""

from __future__ import annotations

import pytest
import torch

from engine.decoder import Decoder
from engine.drafters.medusa import TREES, MedusaDrafter
from engine.drafters.vanilla import VanillaDrafter
from engine.errors import GlanceError
from tests.conftest import VOCAB
from tests.test_lossless import NEW, PROMPTS, reference
from tests.test_medusa import random_heads


@pytest.mark.parametrize("num_heads", [3, 4, 5])
def test_default_medusa_tree_adapts_to_the_heads_present(num_heads):
    from tests.conftest import tiny_model

    target = tiny_model("llama", seed=0, sharpen=4.0)
    heads = random_heads(target, k=num_heads)
    drafter = MedusaDrafter(heads)  # the default tree, 4 deep
    assert max(len(p) for p in drafter.paths) == min(4, num_heads)
    assert drafter.settings()["tree_nodes"] == len(drafter.paths)
    if num_heads < 4:
        assert "trimmed" in drafter.settings()["tree"]
        assert len(drafter.paths) < len(TREES["cpu_24"])
    for prompt in PROMPTS:
        assert Decoder(target, drafter, max_new_tokens=NEW).generate(prompt).tokens == reference(target, prompt)
    with pytest.raises(GlanceError, match="3 heads"):  # a tree the user spelled out is refused, not trimmed
        if num_heads == 3:
            MedusaDrafter(heads, tree="[[0], [0, 0], [0, 0, 0], [0, 0, 0, 0]]")
        else:
            raise GlanceError("3 heads")


def test_a_draft_narrower_than_its_tokenizer_is_accepted_when_it_covers_the_target(model_folders, tmp_path):
    """The very model accepted as the target, with a tokenizer one entry longer than its LM head, is a valid draft."""
    from transformers import AutoTokenizer, LlamaForCausalLM

    from engine.models import check_same_vocabulary, load_model

    folder = tmp_path / "narrow"
    tok = AutoTokenizer.from_pretrained(model_folders["target"])
    tok.add_tokens(["<extra_entry>"])
    model = LlamaForCausalLM.from_pretrained(model_folders["target"])
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    assert len(tok) == model.get_output_embeddings().weight.shape[0] + 1
    target = load_model(folder, dtype="float32")
    draft = load_model(folder, dtype="float32")
    check_same_vocabulary(target, draft)  # no error: the draft reads every token the target can emit


def padded_head(model, real: int) -> None:
    """Give the LM head a bias that keeps rows past `real` from ever winning, as trained padding rows never do."""
    old = model.get_output_embeddings()
    head = torch.nn.Linear(old.in_features, old.out_features, bias=True)
    with torch.no_grad():
        head.weight.copy_(old.weight)
        head.bias.zero_()
        head.bias[real:] = -1e4
    model.config.tie_word_embeddings = False
    model.lm_head = head


@pytest.mark.parametrize("target_extra,draft_extra", [(128, 0), (0, 32)])
def test_target_and_draft_with_different_lm_head_widths_race_losslessly(target_extra, draft_extra):
    """Qwen2.5-7B pads its LM head to 152064 rows, 0.5B to 151936: the draft's distribution is padded or cut to
    the target's width and the output stays the target's own."""
    from tests.conftest import tiny_model

    target = tiny_model("qwen2", seed=0, vocab=VOCAB + target_extra, sharpen=4.0)
    padded_head(target, VOCAB)
    draft = tiny_model("qwen2", seed=3, vocab=VOCAB + draft_extra, sharpen=4.0)
    padded_head(draft, VOCAB)
    for prompt in PROMPTS:
        drafter = VanillaDrafter(draft, gamma=3, target_vocab=VOCAB + target_extra)
        assert Decoder(target, drafter, max_new_tokens=NEW).generate(prompt).tokens == reference(target, prompt)

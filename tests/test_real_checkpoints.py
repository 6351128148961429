"""What users bring: Medusa checkpoints with fewer heads than the default tree is deep, drafts whose LM head is
narrower than their tokenizer, target/draft pairs whose LM heads differ in width, and the architectures of the
checkpoints people have (Qwen3, Mistral, Gemma 2, Phi-3, GPT-NeoX, OLMo 2): every variant lossless on each, or a
clear refusal naming what is missing."""

from __future__ import annotations

import pytest
import torch

from engine.decoding.loop import Decoder
from engine.drafters.eagle import EagleDrafter
from engine.drafters.lookahead import LookaheadDrafter
from engine.drafters.medusa import TREES, MedusaDrafter
from engine.drafters.prompt_lookup import PromptLookupDrafter
from engine.drafters.vanilla import VanillaDrafter
from engine.errors import GlanceError
from tests.conftest import SMALL, VOCAB, perturbed_copy
from tests.test_eagle import random_head
from tests.test_lookahead import LOOPY
from tests.test_lossless import NEW, PROMPTS, reference
from tests.test_medusa import random_heads


@pytest.mark.parametrize("num_heads", [3, 4, 5])
def test_default_medusa_tree_adapts_to_the_heads_present(num_heads, tmp_path):
    from engine.heads.medusa import load_medusa_heads
    from tests.conftest import tiny_model

    target = tiny_model("llama", seed=0, sharpen=4.0)
    random_heads(target, k=num_heads).save(tmp_path)  # the published FasterDecoding layout
    heads = load_medusa_heads(tmp_path, target)
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

    from engine.models.loading import check_same_vocabulary, load_model

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


def arch_config(arch: str, window: int = 96):
    """Tiny configs of the architectures people bring, with their distinguishing features switched on."""
    import transformers as tf

    common = dict(vocab_size=VOCAB, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    llama_like = dict(**SMALL, **common)
    if arch == "qwen3":
        return tf.Qwen3Config(head_dim=16, **llama_like)
    if arch == "mistral":  # a sliding window that the runs stay within (test_sliding_windows_... goes past it)
        return tf.MistralConfig(sliding_window=window, **llama_like)
    if arch == "gemma2":  # logit soft-capping, tied embeddings, alternating sliding and global layers
        return tf.Gemma2Config(
            head_dim=16,
            sliding_window=window,
            final_logit_softcapping=30.0,
            attn_logit_softcapping=50.0,
            tie_word_embeddings=True,
            **llama_like,
        )
    if arch == "phi3":
        return tf.Phi3Config(**llama_like)
    if arch == "gpt_neox":
        return tf.GPTNeoXConfig(**{k: v for k, v in SMALL.items() if k != "num_key_value_heads"}, **common)
    if arch == "olmo2":
        return tf.Olmo2Config(**llama_like)
    raise ValueError(arch)


NEW_ARCHS = ["qwen3", "mistral", "gemma2", "phi3", "gpt_neox", "olmo2"]


def arch_model(arch: str, seed: int = 0, window: int = 96) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    try:  # as engine.models.loading.load_model does: sdpa where supported, eager otherwise (Gemma 2)
        model = AutoModelForCausalLM.from_config(arch_config(arch, window), attn_implementation="sdpa").eval()
    except ValueError:
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(arch_config(arch, window), attn_implementation="eager").eval()
    head = model.get_output_embeddings()
    if not model.config.tie_word_embeddings:  # peaked distributions, so drafts get accepted
        head.weight = torch.nn.Parameter(head.weight.detach().clone() * 4.0)
    return model


@pytest.mark.parametrize("arch", NEW_ARCHS)
def test_every_variant_is_lossless_on_the_architectures_people_bring(arch):
    target = arch_model(arch)
    draft = perturbed_copy(target, 0.3)
    heads, head = random_heads(target), random_head(target)
    makers = {
        "ar": lambda: None,
        "vanilla": lambda: VanillaDrafter(draft, gamma=3),
        "medusa": lambda: MedusaDrafter(heads, "cpu_16"),
        "eagle": lambda: EagleDrafter(head, top_k=3, depth=3, total_tokens=8),
        "lookahead": lambda: LookaheadDrafter(window=3, ngram=3, guesses=3),
        "prompt_lookup": lambda: PromptLookupDrafter(3, 6),
    }
    for prompt in PROMPTS + [LOOPY]:
        ref = reference(target, prompt)
        for method, make in makers.items():
            out = Decoder(target, make(), max_new_tokens=NEW).generate(prompt).tokens
            assert out == ref, (arch, method, prompt)


@pytest.mark.parametrize("arch", ["mistral", "gemma2"])
def test_a_run_past_a_sliding_window_is_refused_before_it_starts(arch):
    target = arch_model(arch, window=16)
    decoder = Decoder(target, LookaheadDrafter(window=3, ngram=3, guesses=3), max_new_tokens=NEW)
    with pytest.raises(GlanceError, match="sliding window of 16 tokens"):
        next(decoder.run([1, 2, 3]))
    draft = VanillaDrafter(arch_model(arch, seed=1, window=16), gamma=3)
    with pytest.raises(GlanceError, match="the draft model attends through a sliding window"):
        next(Decoder(arch_model(arch, window=4096), draft, max_new_tokens=8).run([1, 2, 3]))

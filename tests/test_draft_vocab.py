"""EAGLE's draft vocabulary: the head reads its candidates from some rows of the target's LM head only. Output stays
the target's (greedy and sampled, one row and batched); the vocabulary saves, loads and is checked."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.decoding.loop import Decoder
from engine.drafters.eagle import EagleDrafter
from engine.errors import GlanceError
from engine.heads.eagle import DRAFT_VOCAB, load_eagle_head
from engine.heads.readout import top_candidates
from tests.conftest import batch_decoder, tiny_model
from tests.test_eagle import random_head, trained_head
from tests.test_lossless import NEW, PROMPTS, reference
from tests.test_sampling_exact import second_token_pvalue


@pytest.fixture(scope="module")
def target_and_head():
    target = tiny_model("llama", sharpen=4.0)
    return target, trained_head(target)


def test_the_read_out_is_those_rows_of_the_lm_head(target_and_head):
    target, head = target_and_head
    ids = torch.tensor([7, 1, 30, 4, 12])  # unsorted: kept sorted
    x = torch.randn(2, 3, target.config.hidden_size)
    full = head.logits(x)
    head.set_draft_vocab(ids)
    try:
        assert torch.equal(head.draft_ids, ids.sort().values)
        assert torch.allclose(head.logits(x), full[..., ids.sort().values], atol=1e-5)
        values, top = top_candidates(head, x, 3)
        assert set(head.to_target(top).flatten().tolist()) <= set(ids.tolist())
        assert EagleDrafter(head).settings()["draft_vocab"] == 5
    finally:
        head.set_draft_vocab(None)
    assert torch.equal(head.logits(x), full) and EagleDrafter(head).settings()["draft_vocab"] == "full"


@pytest.mark.parametrize("mode", [dict(dynamic=True), dict(dynamic=True, top_k=3, depth=3, total_tokens=8)])
def test_greedy_is_lossless_over_a_draft_vocabulary(target_and_head, mode):
    """Half the vocabulary, including tokens the target picks and missing others: drafts that cannot hold the
    target's token are rejected, the rest accepted, output the target's, alone and batched."""
    target, head = target_and_head
    V = target.config.vocab_size
    picked = {t for p in PROMPTS for t in reference(target, p)}
    ids = torch.tensor(sorted(set(range(0, V, 2)) | set(sorted(picked)[::2])))
    assert picked - set(ids.tolist()) and picked & set(ids.tolist())  # some of the target's tokens are outside
    head.set_draft_vocab(ids)
    try:
        taus = []
        for prompt in PROMPTS:
            res = Decoder(target, EagleDrafter(head, **mode), max_new_tokens=NEW).generate(prompt)
            assert res.tokens == reference(target, prompt)
            taus.append(res.summary.mean_accepted_length)
            assert all(set(e.draft_tokens) <= set(ids.tolist()) for e in res.events[1:])
        assert max(taus) > 1.0  # drafts from the vocabulary were accepted
        batch = batch_decoder(target, lambda: EagleDrafter(head, **mode), max_new_tokens=NEW).generate_batch(
            PROMPTS, rows=2
        )
        assert [batch.tokens[i] for i in range(len(PROMPTS))] == [reference(target, p) for p in PROMPTS]
    finally:
        head.set_draft_vocab(None)


def test_sampling_stays_exact_over_a_draft_vocabulary():
    V = 12
    prompt = [3, 7, 1]
    target = tiny_model("llama", seed=0, vocab=V, sharpen=6.0)
    head = random_head(target)
    head.set_draft_vocab(torch.tensor([0, 2, 3, 5, 8, 11]))
    drafter = EagleDrafter(head, top_k=3, depth=2, total_tokens=6)
    assert second_token_pvalue(target, drafter, prompt, new=4, drafted=2) > 1e-3


def test_the_vocabulary_saves_loads_and_bad_files_are_refused(target_and_head, tmp_path):
    target, head = target_and_head
    ids = torch.tensor([1, 4, 9, 16])
    head.set_draft_vocab(ids)
    try:
        head.save(tmp_path / "h")
    finally:
        head.set_draft_vocab(None)
    loaded = load_eagle_head(tmp_path / "h", target)
    assert torch.equal(loaded.draft_ids, ids)
    assert "readout.weight" not in load_file(str(tmp_path / "h" / "model.safetensors"))  # the target's rows
    loaded.set_draft_vocab(None)
    loaded.save(tmp_path / "h")  # saved without one: no stale file left behind
    assert not (tmp_path / "h" / DRAFT_VOCAB).exists() and load_eagle_head(tmp_path / "h", target).draft_ids is None

    V = target.config.vocab_size
    bad = [
        ({"draft_ids": torch.tensor([0, V])}, "another model"),
        ({"draft_ids": torch.tensor([3, 3, 5])}, "repeats"),
        ({"draft_ids": torch.tensor([[1, 2]])}, "list of token ids"),
        ({"ids": torch.tensor([1, 2])}, "no tensor draft_ids"),
    ]
    for tensors, message in bad:
        save_file(tensors, str(tmp_path / "h" / DRAFT_VOCAB))
        with pytest.raises(GlanceError, match=message):
            load_eagle_head(tmp_path / "h", target)
    (tmp_path / "h" / DRAFT_VOCAB).write_bytes(b"not safetensors")
    with pytest.raises(GlanceError, match="not a readable safetensors"):
        load_eagle_head(tmp_path / "h", target)


def test_training_and_the_command_write_a_vocabulary(model_folders, tmp_path):
    from engine.cli import main
    from engine.train.recipes.eagle import train_eagle

    data = tmp_path / "corpus"
    data.mkdir()
    for i in range(3):
        (data / f"f{i}.py").write_text("def add(a, b):\n    return a + b\n\nclass Point:\n    x: int\n" * 100)
    target = str(model_folders["target"])
    report = train_eagle(target, tmp_path / "h", steps=1, data=str(data), batch_size=2, seq_len=32, draft_vocab=24)
    assert report["draft_vocab"] == 24 and 0.5 < report["heldout_vocab_coverage"] <= 1.0
    from engine.models.loading import load_model

    model = load_model(target).model
    assert len(load_eagle_head(tmp_path / "h", model).draft_ids) == 24
    assert (
        main(
            [
                "train",
                "draft-vocab",
                "--target",
                target,
                "--head",
                str(tmp_path / "h"),
                "--data",
                str(data),
                "--size",
                "10",
            ]
        )
        == 0
    )
    assert len(load_eagle_head(tmp_path / "h", model).draft_ids) == 10
    from engine.heads.medusa import MedusaHeads, load_medusa_heads

    MedusaHeads.for_target(model, 2, 1, shared_lm_head=True).save(tmp_path / "m")  # Medusa's folder: its vocabulary
    argv = ["train", "draft-vocab", "--target", target, "--head", str(tmp_path / "m"), "--like", str(tmp_path / "h")]
    assert main(argv) == 0
    assert torch.equal(
        load_medusa_heads(tmp_path / "m", model).draft_ids, load_eagle_head(tmp_path / "h", model).draft_ids
    )
    assert (
        main(["train", "draft-vocab", "--target", target, "--head", str(tmp_path / "h"), "--like", str(tmp_path)]) == 2
    )  # neither a vocabulary nor a d2t there: a clear error


def test_training_medusa_writes_a_vocabulary(model_folders, tmp_path):
    """`train medusa` gives its heads a draft vocabulary as `train eagle` does (--draft-vocab 0: none)."""
    from engine.heads.medusa import load_medusa_heads
    from engine.models.loading import load_model
    from engine.train.recipes.medusa import train_medusa

    data = tmp_path / "corpus.py"
    data.write_text("def add(a, b):\n    return a + b\n\nclass Point:\n    x: int\n" * 300)
    target = str(model_folders["target"])
    model = load_model(target).model
    for size, expect in ((24, 24), (0, None)):
        out = tmp_path / f"m{size}"
        report = train_medusa(target, out, 2, 1, 1, str(data), batch_size=2, seq_len=32, draft_vocab=size)
        assert report["draft_vocab"] == expect
        ids = load_medusa_heads(out, model).draft_ids
        assert (ids is None) if expect is None else len(ids) == expect
        assert (out / DRAFT_VOCAB).exists() == (expect is not None)


@pytest.mark.slow
@pytest.mark.parametrize("shared", [True, False])
def test_medusa_reads_those_rows_and_stays_lossless(shared):
    """Heads sharing the target's LM head read its rows once; heads with their own projections read their own
    rows. Copies of the LM head (zero blocks) predict the target's next tokens, so drafts inside the vocabulary get
    accepted and those outside cannot be drafted; output is the target's alone and batched, and the read-out
    compiled (Medusa's graph over the draft vocabulary) drafts what the eager one does."""
    from engine.drafters.medusa import MedusaDrafter
    from engine.heads.compiled_readout import compile_readout, uncompile_readout
    from engine.heads.medusa import MedusaHeads

    target = tiny_model("llama", sharpen=4.0)
    heads = MedusaHeads.for_target(target, 4, 1, shared_lm_head=shared).eval()
    V = target.config.vocab_size
    x = torch.randn(3, target.config.hidden_size)
    full, first = heads.logits(x), heads.first_logits(x)
    prompt = [5, 5, 5, 5]
    picked = reference(target, prompt)
    ids = torch.tensor(sorted(set(range(0, V, 3)) | set(sorted(set(picked))[::2])))
    assert set(picked) - set(ids.tolist())
    heads.set_draft_vocab(ids)
    assert torch.allclose(heads.logits(x), full[..., ids], atol=1e-5)
    assert torch.allclose(heads.first_logits(x), first[..., ids], atol=1e-5)
    assert MedusaDrafter(heads).settings()["draft_vocab"] == len(ids)
    res = Decoder(target, MedusaDrafter(heads, "cpu_16"), max_new_tokens=NEW).generate(prompt)
    assert res.tokens == picked
    assert res.summary.mean_accepted_length > 1.0
    assert all(set(e.draft_tokens) <= set(ids.tolist()) for e in res.events[1:])
    batch = batch_decoder(target, lambda: MedusaDrafter(heads, "cpu_16"), max_new_tokens=NEW).generate_batch(
        PROMPTS, rows=2
    )
    assert [batch.tokens[i] for i in range(len(PROMPTS))] == [reference(target, p) for p in PROMPTS]
    eager = [e.draft_tokens for e in Decoder(target, MedusaDrafter(heads), max_new_tokens=NEW).generate(prompt).events]
    report = compile_readout(heads, MedusaDrafter(heads).topk)
    try:
        assert report.compiled, report.line()
        compiled = Decoder(target, MedusaDrafter(heads), max_new_tokens=NEW).generate(prompt)
        assert [e.draft_tokens for e in compiled.events] == eager
    finally:
        uncompile_readout(heads)
    heads.set_draft_vocab(None)
    assert torch.equal(heads.logits(x), full)


def test_medusa_sampling_stays_exact_over_a_draft_vocabulary():
    from engine.drafters.medusa import MedusaDrafter
    from tests.test_medusa import random_heads

    V = 12
    prompt = [5, 6, 5, 6]
    target = tiny_model("llama", seed=0, vocab=V, sharpen=6.0)
    heads = random_heads(target, k=3, scale=2.0)
    heads.set_draft_vocab(torch.tensor([0, 1, 5, 6, 7, 10]))
    drafter = MedusaDrafter(heads, [(0,), (1,), (2,), (0, 0), (0, 1), (1, 0)])
    assert second_token_pvalue(target, drafter, prompt, new=3, drafted=3) > 1e-3  # three depth-1 candidates


def test_medusa_vocabulary_saves_and_loads(tmp_path):
    from engine.heads.medusa import MedusaHeads, load_medusa_heads

    target = tiny_model("llama")
    heads = MedusaHeads.for_target(target, 2, 1, shared_lm_head=False)
    heads.set_draft_vocab(torch.tensor([2, 3, 11]))
    heads.save(tmp_path / "m")
    loaded = load_medusa_heads(tmp_path / "m", target)
    assert torch.equal(loaded.draft_ids, torch.tensor([2, 3, 11])) and len(list(loaded)) == 2  # two heads, no more
    save_file({"draft_ids": torch.tensor([1, target.config.vocab_size + 4])}, str(tmp_path / "m" / DRAFT_VOCAB))
    with pytest.raises(GlanceError, match="another model"):
        load_medusa_heads(tmp_path / "m", target)


def test_training_on_from_a_head_keeps_its_vocabulary_and_starts_its_curve_where_it_was(model_folders, tmp_path):
    """`train eagle --from` and `train medusa --from` go on training trained heads: the draft vocabulary stays, the
    curve's first point (step 0) is the old head's held-out accuracy, and training.json says where it started."""
    from engine.cli import main
    from engine.heads.medusa import load_medusa_heads
    from engine.models.loading import load_model
    from engine.train.recipes.eagle import train_eagle

    data = tmp_path / "corpus.py"
    data.write_text("def add(a, b):\n    return a + b\n\nclass Point:\n    x: int\n" * 300)
    target = str(model_folders["target"])
    model = load_model(target).model
    first = train_eagle(target, tmp_path / "e1", steps=2, data=str(data), batch_size=2, seq_len=32, draft_vocab=24)
    common = ["--target", target, "--data", str(data), "--steps", "2", "--draft-vocab", "7"]
    assert main(["train", "eagle", *common, "--from", str(tmp_path / "e1"), "--out", str(tmp_path / "e2")]) == 0
    report = json.loads((tmp_path / "e2" / "training.json").read_text())
    assert report["started_from"] == str(tmp_path / "e1") and report["draft_vocab"] == 24
    assert torch.equal(
        load_eagle_head(tmp_path / "e2", model).draft_ids, load_eagle_head(tmp_path / "e1", model).draft_ids
    )
    curve = [json.loads(line) for line in (tmp_path / "e2" / "curve.jsonl").read_text().splitlines()]
    assert [p["step"] for p in curve] == [0, 2] and curve[0]["top1"] == [a["top1"] for a in first["heldout_accuracy"]]

    assert main(["train", "medusa", *common, "--heads", "2", "--out", str(tmp_path / "m1")]) == 0
    assert (
        main(
            ["train", "medusa", *common, "--heads", "3", "--from", str(tmp_path / "m1"), "--out", str(tmp_path / "m2")]
        )
        == 0
    )
    heads = load_medusa_heads(tmp_path / "m2", model)
    assert heads.num_heads == 2 and len(heads.draft_ids) == 7  # the old heads' shape and vocabulary win
    assert json.loads((tmp_path / "m2" / "training.json").read_text())["started_from"] == str(tmp_path / "m1")

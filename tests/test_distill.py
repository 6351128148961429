"""The distilled vanilla draft: cut from the target, trained a few steps, stored as layers only, rebuilt into an
ordinary model folder that races losslessly against the target."""

import json

import torch
from safetensors.torch import load_file

from engine.decoding.sampling import SamplingConfig
from engine.models.draft_layers import LAYERS_FILE, assemble_draft
from engine.session import RaceSettings, Session
from engine.train.recipes.distill import kept_layers, train_draft


def assert_vanilla_matches_plain(session: Session) -> None:
    """24 greedy float32 tokens of the session's vanilla lane equal plain decoding's."""
    settings = RaceSettings(methods=["ar", "vanilla"], max_new_tokens=24, sampling=SamplingConfig())
    ids = session.encode("def add(", chat=False)
    tokens = {m: session.decoder(m, settings).generate(ids).tokens for m in ("ar", "vanilla")}
    assert tokens["vanilla"] == tokens["ar"] and len(tokens["ar"]) == 24


def test_kept_layers_are_evenly_spaced_with_both_ends():
    assert kept_layers(30, 4) == [0, 10, 19, 29]
    assert kept_layers(2, 4) == [0, 1]
    assert kept_layers(8, 1) == [7]


def test_distilled_draft_stores_only_its_layers_and_races_losslessly(model_folders, tmp_path):
    data = tmp_path / "corpus.txt"
    data.write_text("def add(a, b):\n    return a + b\n\nclass Point:\n    x: int\n    y: int\n" * 200)
    out = tmp_path / "draft_layers"
    report = train_draft(str(model_folders["target"]), out, layers=1, steps=3, data=str(data), batch_size=2, seq_len=32)
    assert report["layers"] == 1 and report["target_layers"] == [1] and report["steps"] == 3
    stored = load_file(str(out / LAYERS_FILE))
    assert "model.embed_tokens.weight" not in stored and "lm_head.weight" not in stored
    assert all(v.dtype == torch.bfloat16 for v in stored.values())
    assert json.loads((out / "draft.json").read_text())["target_layers"] == [1]
    # resume: the checkpoint holds all steps, nothing is retrained
    again = train_draft(str(model_folders["target"]), out, layers=1, steps=3, data=str(data), batch_size=2, seq_len=32)
    assert again["heldout_top1_agreement"] == report["heldout_top1_agreement"]
    assert all(torch.equal(v, load_file(str(out / LAYERS_FILE))[k]) for k, v in stored.items())

    full = assemble_draft(out, model_folders["target"], tmp_path / "draft")
    assert (full / "tokenizer.json").exists()
    target_weights = load_file(str(model_folders["target"] / "model.safetensors"))
    draft_weights = load_file(str(full / "model.safetensors"))
    for key in ("model.embed_tokens.weight", "lm_head.weight"):  # untied target: both are shared, not retrained
        assert torch.equal(draft_weights[key], target_weights[key].to(torch.bfloat16))

    session = Session.load(str(model_folders["target"]), {"draft": str(full)}, ["ar", "vanilla"], dtype="float32")
    assert_vanilla_matches_plain(session)


def test_training_goes_on_from_a_users_own_draft_and_refuses_another_vocabulary(model_folders, tmp_path):
    import pytest

    from engine.errors import GlanceError

    data = tmp_path / "corpus.txt"
    data.write_text("def add(a, b):\n    return a + b\n\nclass Point:\n    x: int\n    y: int\n" * 200)
    target, start = str(model_folders["target"]), model_folders["copy"]
    out = tmp_path / "tuned"
    report = train_draft(target, out, steps=3, data=str(data), batch_size=2, seq_len=32, start_from=str(start))
    assert report["started_from"] == str(start) and report["steps"] == 3 and report["target_layers"] == []
    assert 0.0 <= report["heldout_top1_agreement_before"] <= 1.0
    before, after = load_file(str(start / "model.safetensors")), load_file(str(out / "model.safetensors"))
    assert set(after) <= set(before) and all(v.dtype == torch.bfloat16 for v in after.values())
    moved = [k for k in after if not torch.equal(after[k], before[k].to(torch.bfloat16))]
    assert "model.embed_tokens.weight" in moved and any(".layers." in k for k in moved)  # every weight trains
    tokenizer_config = json.loads((out / "tokenizer_config.json").read_text())
    assert "local_files_only" not in tokenizer_config and "trust_remote_code" not in tokenizer_config  # how, not what

    session = Session.load(target, {"draft": str(out)}, ["ar", "vanilla"], dtype="float32")
    assert_vanilla_matches_plain(session)

    with pytest.raises(GlanceError, match="vocabulary"):
        train_draft(target, tmp_path / "x", steps=1, data=str(data), start_from=str(model_folders["other_vocab"]))


def test_a_draft_vocabulary_narrows_the_drafts_head_and_goes_on_from_stored_layers(model_folders, tmp_path):
    """`draft_vocab`: the LM head reads the most frequent training tokens only, the vocabulary travels with the
    stored layers into the rebuilt folder, the vanilla lane loads it narrowed and stays lossless; going on from
    stored layers keeps their layers and vocabulary and saves layers again."""
    from engine.heads.draft_vocab import DRAFT_VOCAB

    data = tmp_path / "corpus.txt"
    data.write_text("def add(a, b):\n    return a + b\n\nclass Point:\n    x: int\n    y: int\n" * 200)
    target = str(model_folders["target"])
    out = tmp_path / "narrow"
    report = train_draft(target, out, layers=1, steps=2, data=str(data), batch_size=2, seq_len=32, draft_vocab=40)
    assert report["draft_vocab"] == 40 and 0.5 < report["heldout_vocab_coverage"] <= 1.0
    assert (out / DRAFT_VOCAB).exists() and "lm_head.weight" not in load_file(str(out / LAYERS_FILE))

    more = train_draft(
        target, tmp_path / "more", steps=2, data=str(data), batch_size=2, seq_len=32, start_from=str(out)
    )
    assert more["draft_vocab"] == 40 and more["kept_from"] == str(out) and more["target_layers"] == [1]
    assert 0.0 <= more["heldout_top1_agreement_before"] <= 1.0
    assert load_file(str(tmp_path / "more" / DRAFT_VOCAB))["draft_ids"].tolist() == (
        load_file(str(out / DRAFT_VOCAB))["draft_ids"].tolist()
    )

    full = assemble_draft(tmp_path / "more", model_folders["target"], tmp_path / "draft")
    assert (full / DRAFT_VOCAB).exists()

    session = Session.load(target, {"draft": str(full)}, ["ar", "vanilla"], dtype="float32")
    draft = session.parts["draft"]
    assert draft.draft_ids is not None and draft.model.get_output_embeddings().weight.shape[0] == 40
    assert_vanilla_matches_plain(session)


def test_the_rebuilt_draft_follows_its_stored_layers(model_folders, tmp_path):
    """New layers in the same folder (a retrained bundled draft) rebuild the model folder; the same ones do not."""
    data = tmp_path / "corpus.txt"
    data.write_text("def add(a, b):\n    return a + b\n" * 200)
    out = tmp_path / "layers"
    train_draft(str(model_folders["target"]), out, layers=1, steps=1, data=str(data), batch_size=2, seq_len=32)
    full = assemble_draft(out, model_folders["target"], tmp_path / "draft")
    built = (full / "model.safetensors").stat().st_mtime_ns
    assert assemble_draft(out, model_folders["target"], full) == full
    assert (full / "model.safetensors").stat().st_mtime_ns == built  # current: not rebuilt
    layers = load_file(str(out / LAYERS_FILE))
    changed = {k: (v + 1 if k.endswith("norm.weight") else v) for k, v in layers.items()}
    from safetensors.torch import save_file

    save_file(changed, str(out / LAYERS_FILE))
    assemble_draft(out, model_folders["target"], full)
    rebuilt = load_file(str(full / "model.safetensors"))
    assert torch.equal(rebuilt["model.norm.weight"], changed["model.norm.weight"])

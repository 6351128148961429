"""`train eagle3`: a fresh head, then training that goes on from it (`--from`) with its own draft vocabulary."""

import torch
from safetensors.torch import load_file


def test_eagle3_training_goes_on_from_a_trained_head_and_keeps_its_vocabulary(model_folders, tmp_path):
    from engine.train.recipes.eagle3 import train_eagle3

    data = tmp_path / "corpus.txt"
    data.write_text("def add(a, b):\n    return a + b\n\nclass Point:\n    x: int\n    y: int\n" * 200)
    target = str(model_folders["target"])
    first = tmp_path / "first"
    train_eagle3(target, first, steps=2, data=str(data), draft_vocab=64, ttt_steps=2, batch_size=2, seq_len=32)
    report = train_eagle3(
        target,
        tmp_path / "more",
        steps=2,
        data=str(data),
        draft_vocab=8,
        ttt_steps=2,
        batch_size=2,
        seq_len=32,
        start_from=str(first),
    )
    assert report["started_from"] == str(first) and report["draft_vocab"] == 64  # the head's, not the argument
    before, after = load_file(str(first / "model.safetensors")), load_file(str(tmp_path / "more" / "model.safetensors"))
    assert set(before) == set(after) and torch.equal(before["d2t"], after["d2t"])
    assert not torch.equal(before["fc.weight"], after["fc.weight"])  # it trained on

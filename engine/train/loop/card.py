"""Render the bundled models' card (resources/models/README.md) from training.json and evaluation.json."""

from __future__ import annotations

import json
import math
from pathlib import Path


def _fmt_params(n: int) -> str:
    return f"{n / 1e6:.1f}M"


def render_card(training: dict, evaluation: dict) -> str:
    c, t, d = training["corpus"], training["target"], training["draft"]
    acc, cost = evaluation["acceptance"], evaluation["step_costs"]
    cpu = evaluation.get("cpu", training["machine"]["cpu"])
    lines = [
        "# Bundled demo models",
        "",
        "A tokenizer, a target and a draft trained from scratch by `python main.py train demo` on the Python",
        "standard library's own source, so the app and the tests run on a fresh machine with no model hub.",
        "Each folder loads with plain `AutoModelForCausalLM.from_pretrained` / `AutoTokenizer.from_pretrained`.",
        "",
        "## Corpus",
        "",
        f"- Source: {c['source']}, Python {c['python_version']}.",
        f"- Files: {c['files_train']} train, {c['files_heldout']} held out; split rule: {c['split_rule']}.",
        f"- Tokens (byte-level BPE, vocabulary {t['architecture']['vocab']}): {c['tokens_train']:,} train, "
        f"{c['tokens_heldout']:,} held out.",
        f"- File-list digest (sha256): `{c['file_list_sha256']}`.",
        "",
        "## Models",
        "",
        "| | target | draft |",
        "|---|---|---|",
        f"| architecture | Llama, {t['architecture']['layers']} layers, hidden {t['architecture']['hidden']}, "
        f"MLP {t['architecture']['mlp']}, {t['architecture']['heads']} heads, tied embeddings "
        f"| Llama, {d['architecture']['layers']} layers, hidden {d['architecture']['hidden']}, "
        f"MLP {d['architecture']['mlp']}, {d['architecture']['heads']} heads, tied embeddings |",
        f"| parameters | {_fmt_params(t['parameters'])} | {_fmt_params(d['parameters'])} |",
        f"| training tokens | {t['train']['tokens']:,} ({t['train']['steps']} steps of "
        f"{t['train']['batch_size']} x {t['train']['seq_len']}) | {d['train']['tokens']:,} "
        f"({d['train']['steps']} steps of {d['train']['batch_size']} x {d['train']['seq_len']}) |",
        f"| training wall time | {t['train_wall_seconds'] / 60:.1f} min | {d['train_wall_seconds'] / 60:.1f} min |",
        f"| held-out loss (nats/token) | {t['heldout_loss']:.4f} | {d['heldout_loss']:.4f} |",
        f"| held-out perplexity | {math.exp(t['heldout_loss']):.2f} | {math.exp(d['heldout_loss']):.2f} |",
        f"| one decoding step ({cost['dtype']}, {cost['threads']} threads) | {cost['target_ms_per_token']} ms "
        f"(8-token verify: {cost['target_ms_verify_8']} ms) | {cost['draft_ms_per_token']} ms "
        f"({cost['draft_over_target']:.2f} of a target step) |",
        "",
        f"Trained on {training['machine']['cores']} CPU cores ({cpu}), torch "
        f"{training['machine']['torch']}, {t['train'].get('precision', 'bf16 autocast')}, "
        f"AdamW (lr {t['train']['lr']} cosine to "
        f"{t['train']['min_lr']}, weight decay {t['train']['weight_decay']}), seed {training['seed']}. "
        "Held-out loss: mean cross-entropy over the first 32 non-overlapping 512-token windows of the held-out "
        "stream, measured on the exported bfloat16 weights loaded in float32 "
        "(`engine/train/loop/lm.py: heldout_loss`).",
        "",
        *_distillation_lines(evaluation),
        "## Speculative decoding with this pair",
        "",
        f"Vanilla speculative decoding, greedy, gamma {acc['settings']['gamma']}, {acc['dtype']}, up to "
        f"{acc['max_new_tokens']} new tokens on each of the {acc['prompts']} held-out prompts of "
        "`resources/prompts/suite.jsonl`:",
        "",
        f"- draft acceptance rate: **{acc['acceptance_rate']:.3f}** (accepted / proposed draft tokens)",
        f"- mean accepted length (tau): **{acc['mean_accepted_length']:.3f}** tokens per target forward",
        f"- output identical to plain greedy decoding on every prompt: {acc['outputs_identical_to_plain_greedy']}",
        "",
        "| category | tau |",
        "|---|---|",
        *[f"| {k} | {v:.2f} |" for k, v in acc["tau_by_category"].items()],
        "",
        *_medusa_section(evaluation),
        *_eagle_section(evaluation),
        *_eagle3_section(evaluation),
        *_dflash_section(evaluation),
        *_mtp_section(evaluation),
        *_lookahead_section(evaluation),
        "## Sample greedy completions (target, float32)",
        "",
    ]
    for s in evaluation["samples"]:
        lines += ["```python", s["prompt"] + s["completion"], "```", ""]
    lines += [
        "## Reproduce",
        "",
        "```bash",
        f"python main.py train demo --out runs/demo --tokens {t['train']['tokens']} "
        f"--draft-tokens {d['train']['tokens']} --seed {training['seed']}",
        *_distillation_reproduce(evaluation),
        *_medusa_reproduce(evaluation),
        "python main.py train card --models runs/demo   # measures and writes runs/demo/README.md",
        "```",
        "",
        "## SmolLM2-135M-Instruct's parts",
        "",
        "The draft, Medusa, EAGLE, EAGLE-3, DFlash and MTP parts trained for the real model that `python main.py "
        "models install smollm2`",
        "installs have their own card: [smollm2/README.md](smollm2/README.md).",
    ]
    return "\n".join(lines) + "\n"


def _distillation_lines(evaluation: dict) -> list[str]:
    """The draft's training after `train demo`, if it went on (`train draft --from`, forward KL to the target)."""
    dist = evaluation.get("draft_distillation")
    if not dist:
        return []
    return [
        f"The draft then went on for {dist['steps']} steps ({dist['tokens']:,} tokens) distilled from the target: "
        "`python main.py train draft "
        f"--target target --from draft --steps {dist['steps']}` (forward KL to the target's next-token "
        "distribution, every weight trained). Its top-1 agreement with the target's greedy token on held-out "
        f"windows went from {dist['heldout_top1_agreement_before']:.3f} to {dist['heldout_top1_agreement']:.3f}; "
        "the loss, perplexity and step rows above are the draft's from-scratch training.",
        "",
    ]


def _distillation_reproduce(evaluation: dict) -> list[str]:
    dist = evaluation.get("draft_distillation")
    if not dist:
        return []
    return [
        f"python main.py train draft --target runs/demo/target --from runs/demo/draft --steps {dist['steps']} "
        "--out runs/demo/draft-distilled   # then the draft/ folder"
    ]


def _medusa_section(evaluation: dict) -> list[str]:
    med = evaluation.get("medusa")
    if not med:
        return []
    tr, acc = med["training"], med["acceptance"]
    lines = [
        "## Medusa heads (`medusa/`)",
        "",
        f"{tr['heads']} heads of {tr['layers']} residual block(s) each on the target's last hidden state, "
        + (
            'sharing the target\'s frozen LM head (`"shared_lm_head": true`, so the folder stays small), '
            if tr["shared_lm_head"]
            else "each with its own vocabulary projection, "
        )
        + f"trained by `python main.py train medusa` for {tr['steps']} steps ({tr['tokens']:,} tokens) of "
        "self-distillation: head k learns the target's own greedy token k + 2 positions ahead on the training split.",
        "",
        "| head | predicts | held-out top-1 | top-5 |",
        "|---|---|---|---|",
        *[
            f"| {a['head']} | token t+{a['head'] + 2} | {a['top1']:.3f} | {a['top5']:.3f} |"
            for a in tr["heldout_accuracy"]
        ],
        "",
        f"Greedy Medusa decoding with the `{acc['settings']['tree']}` tree ({acc['settings']['tree_nodes']} nodes), "
        f"{acc['dtype']}, up to {acc['max_new_tokens']} new tokens on each of the {acc['prompts']} held-out prompts: "
        f"mean accepted length **{acc['mean_accepted_length']:.3f}**, acceptance rate {acc['acceptance_rate']:.3f}, "
        f"output identical to plain greedy on every prompt: {acc['outputs_identical_to_plain_greedy']}."
        f"{_draft_vocab_line(acc['settings'], tr)}",
        "",
        "| category | tau |",
        "|---|---|",
        *[f"| {k} | {v:.2f} |" for k, v in acc["tau_by_category"].items()],
        "",
    ]
    return lines


def _eagle_section(evaluation: dict) -> list[str]:
    eg = evaluation.get("eagle")
    if not eg:
        return []
    tr, acc = eg["training"], eg["acceptance"]
    st = acc["settings"]
    return [
        "## EAGLE head (`eagle/`)",
        "",
        "One Llama decoder layer (no input norm) over cat(embedding of token t+1, target feature at t), predicting the "
        "target's next last-hidden-state; the target's frozen embeddings and LM head read tokens from it. Trained by "
        f"`python main.py train eagle` for {tr['steps']} steps ({tr['tokens']:,} tokens): smooth-L1 on the feature + "
        "0.1 x cross-entropy against the target's distribution, uniform noise on input features.",
        "",
        "| draft depth | held-out top-1 agreement with the target's greedy token |",
        "|---|---|",
        *[f"| {a['depth']} | {a['top1']:.3f} |" for a in tr["heldout_accuracy"]],
        "",
        f"Greedy EAGLE-2 decoding (top_k {st.get('top_k')}, depth {st.get('depth')}, total_tokens "
        f"{st.get('total_tokens')}), {acc['dtype']}, up to {acc['max_new_tokens']} new tokens on each of the "
        f"{acc['prompts']} held-out prompts: mean accepted length **{acc['mean_accepted_length']:.3f}**, acceptance "
        f"rate {acc['acceptance_rate']:.3f}, output identical to plain greedy on every prompt: "
        f"{acc['outputs_identical_to_plain_greedy']}.{_draft_vocab_line(st, tr)}",
        "",
        "| category | tau |",
        "|---|---|",
        *[f"| {k} | {v:.2f} |" for k, v in acc["tau_by_category"].items()],
        "",
    ]


def _draft_vocab_line(settings: dict, training: dict) -> str:
    """What the EAGLE head drafted over in the measured run: its draft vocabulary (and where it came from)."""
    size = settings.get("draft_vocab")
    if not isinstance(size, int):
        return ""
    source = (training.get("draft_vocab") or {}).get("source")
    return (
        f" It drafts over a {size:,}-token draft vocabulary (`draft_vocab.safetensors`"
        + (f": {source}" if source else "")
        + "), read from those rows of the LM head."
    )


def _eagle3_section(evaluation: dict) -> list[str]:
    e3 = evaluation.get("eagle3")
    if not e3:
        return []
    tr, acc = e3["training"], e3["acceptance"]
    st = acc["settings"]
    return [
        "## EAGLE-3 head (`eagle3/`)",
        "",
        f"One decoder layer over [embedding of token t+1 ; fc(inputs of target layers {tr['feature_layers']})], "
        f"drafting over its own {tr['draft_vocab']}-token vocabulary (the most frequent training tokens; they cover "
        f"{tr['heldout_vocab_coverage']:.1%} of held-out tokens), mapped to target ids through `d2t`. Trained by "
        f"`python main.py train eagle3` for {tr['steps']} steps ({tr['tokens']:,} tokens) with training-time test "
        f"over {tr['ttt_steps']} unrolled steps: cross-entropy against the target's distribution on the draft "
        "vocabulary, weighted 0.8^step.",
        "",
        "| draft depth | held-out top-1 agreement with the target's greedy token |",
        "|---|---|",
        *[f"| {a['depth']} | {a['top1']:.3f} |" for a in tr["heldout_accuracy"]],
        "",
        f"Greedy EAGLE-3 decoding (top_k {st.get('top_k')}, depth {st.get('depth')}, total_tokens "
        f"{st.get('total_tokens')}), {acc['dtype']}, up to {acc['max_new_tokens']} new tokens on each of the "
        f"{acc['prompts']} held-out prompts: mean accepted length **{acc['mean_accepted_length']:.3f}**, acceptance "
        f"rate {acc['acceptance_rate']:.3f}, output identical to plain greedy on every prompt: "
        f"{acc['outputs_identical_to_plain_greedy']}.",
        "",
        "| category | tau |",
        "|---|---|",
        *[f"| {k} | {v:.2f} |" for k, v in acc["tau_by_category"].items()],
        "",
    ]


def _measured_line(name: str, acc: dict) -> str:
    """The measured greedy race of a part over the card's prompts, in one sentence."""
    return (
        f"Greedy {name} decoding ({', '.join(f'{k} {v}' for k, v in acc['settings'].items())}), {acc['dtype']}, up to "
        f"{acc['max_new_tokens']} new tokens on each of the {acc['prompts']} held-out prompts, every draft verified "
        f"(no budget): mean accepted length **{acc['mean_accepted_length']:.3f}**, acceptance rate "
        f"{acc['acceptance_rate']:.3f}, output identical to plain greedy on every prompt: "
        f"{acc['outputs_identical_to_plain_greedy']}."
    )


def _dflash_section(evaluation: dict) -> list[str]:
    d = evaluation.get("dflash")
    if not d:
        return []
    tr, acc = d["training"], d["acceptance"]
    vocab = f"a {tr['draft_vocab']:,}-token draft vocabulary" if tr.get("draft_vocab") else "the whole vocabulary"
    return [
        "## DFlash block drafter (`dflash/`)",
        "",
        f"{tr['draft_layers']} draft layer(s) shaped like the target's, reading the outputs of target layers "
        f"{tr['target_layer_ids']} as extra keys and values; one forward fills a block of {tr['block_size']} (the "
        f"pending token, then masks, id {tr['mask_token_id']}), read out over {vocab} through the target's LM head. "
        f"Trained by `python main.py train dflash` for {tr['steps']} steps ({tr['tokens']:,} tokens, "
        f"{tr['blocks_per_window']} blocks anchored at random in each window), cross-entropy against the target's "
        "distribution at every block position weighted exp(-(k - 1) / 7).",
        "",
        "| block position | held-out top-1 | held-out run kept through it |",
        "|---|---|---|",
        *[f"| {a['depth']} | {a['top1']:.3f} | {a['accepted']:.3f} |" for a in tr["heldout_acceptance"]],
        "",
        f"Teacher-forced, these give an expected tau of {tr['heldout_expected_tau']:.2f} at the full block. "
        + _measured_line("DFlash", acc),
        "",
    ]


def _mtp_section(evaluation: dict) -> list[str]:
    m = evaluation.get("mtp")
    if not m:
        return []
    tr, acc = m["training"], m["acceptance"]
    vocab = f"a {tr['draft_vocab']:,}-token draft vocabulary" if tr.get("draft_vocab") else "the whole vocabulary"
    return [
        "## MTP layer (`mtp/`)",
        "",
        f"One {tr['layer_class']} (the target's own kind, started from its last layer) over [enorm(embedding of "
        "token t+1) ; hnorm(the target's last hidden state at t)], drafting token t+2 through the target's LM head "
        f"over {vocab}; chained on its own output at decoding. Trained by `python main.py train mtp` for "
        f"{tr['steps']} steps ({tr['tokens']:,} tokens), teacher-forced, against the target's distribution. Held-out "
        f"top-1 of its first draft: {tr['heldout_accuracy'][0]['top1']:.3f}.",
        "",
        _measured_line("MTP", acc),
        "",
    ]


def _lookahead_section(evaluation: dict) -> list[str]:
    la = evaluation.get("lookahead")
    if not la:
        return []
    st = la["settings"]
    return [
        "## Lookahead decoding (no extra weights)",
        "",
        f"Greedy lookahead decoding (window {st['window']}, n-gram {st['ngram']}, {st['guesses']} guesses per step, "
        f"prompt and output n-grams pooled too: {st['context_ngrams']}), {la['dtype']}, up to {la['max_new_tokens']} "
        f"new tokens on each of the {la['prompts']} held-out prompts: mean accepted length "
        f"**{la['mean_accepted_length']:.3f}**, acceptance rate {la['acceptance_rate']:.3f}, output identical to "
        f"plain greedy on every prompt: {la['outputs_identical_to_plain_greedy']}.",
        "",
        "| category | tau |",
        "|---|---|",
        *[f"| {k} | {v:.2f} |" for k, v in la["tau_by_category"].items()],
        "",
    ]


def _medusa_reproduce(evaluation: dict) -> list[str]:
    if not evaluation.get("medusa"):
        return []
    tr = evaluation["medusa"]["training"]
    lines = [
        f"python main.py train medusa --target runs/demo/target --heads {tr['heads']} --layers {tr['layers']} "
        f"--steps {tr['steps']} --out runs/demo/medusa"
    ]
    if evaluation.get("eagle"):
        lines.append(
            f"python main.py train eagle --target runs/demo/target --steps {evaluation['eagle']['training']['steps']}"
            " --out runs/demo/eagle"
        )
    if evaluation.get("eagle3"):
        tr = evaluation["eagle3"]["training"]
        lines.append(
            f"python main.py train eagle3 --target runs/demo/target --steps {tr['steps']} --draft-vocab "
            f"{tr['draft_vocab']} --ttt-steps {tr['ttt_steps']} --out runs/demo/eagle3"
        )
    return lines


def refresh_card(models: Path, sections: list[str]) -> str:
    """Re-measure only the given drafting sections (vanilla, medusa, eagle, eagle3, dflash, mtp, lookahead) of an
    existing
    evaluation.json and rewrite README.md: after retraining heads or the draft (`train draft --from`, whose
    training.json in draft/ the card then quotes) or changing a drafter's defaults, without re-measuring the rest."""
    from engine.train.data.prompts import load_prompt_suite
    from engine.train.loop.evaluate import speculative_acceptance

    models = Path(models)
    training = json.loads((models / "training.json").read_text())
    evaluation = json.loads((models / "evaluation.json").read_text())
    prompts = load_prompt_suite(Path(__file__).resolve().parents[3] / "resources" / "prompts" / "suite.jsonl")
    for name in sections:
        acc = speculative_acceptance(models, prompts, method=name)
        if name == "lookahead":
            evaluation["lookahead"] = acc
        elif name == "vanilla":
            evaluation["acceptance"] = acc
            distilled = models / "draft" / "training.json"
            if distilled.exists():
                evaluation["draft_distillation"] = json.loads(distilled.read_text())
        else:
            trained = json.loads((models / name / "training.json").read_text())
            evaluation[name] = {"training": trained, "acceptance": acc}
    (models / "evaluation.json").write_text(json.dumps(evaluation, indent=2))
    card = render_card(training, evaluation)
    (models / "README.md").write_text(card)
    return card


def write_card(models: Path) -> str:
    """Measure the family in `models`, store evaluation.json beside training.json, and write README.md."""
    from engine.runtime.machine import cpu_name
    from engine.train.data.prompts import load_prompt_suite
    from engine.train.loop.evaluate import samples, speculative_acceptance, step_costs

    models = Path(models)
    training = json.loads((models / "training.json").read_text())
    prompt_file = models / "prompts.jsonl"
    if not prompt_file.exists():
        prompt_file = Path(__file__).resolve().parents[3] / "resources" / "prompts" / "suite.jsonl"
    prompts = load_prompt_suite(prompt_file)
    evaluation = {
        "cpu": cpu_name(),
        "step_costs": step_costs(models),
        "acceptance": speculative_acceptance(models, prompts),
        "samples": samples(models),
    }
    if (models / "medusa" / "training.json").exists():
        evaluation["medusa"] = {
            "training": json.loads((models / "medusa" / "training.json").read_text()),
            "acceptance": speculative_acceptance(models, prompts, method="medusa"),
        }
    for name in ("eagle", "eagle3", "dflash", "mtp"):
        if (models / name / "training.json").exists():
            evaluation[name] = {
                "training": json.loads((models / name / "training.json").read_text()),
                "acceptance": speculative_acceptance(models, prompts, method=name),
            }
    evaluation["lookahead"] = speculative_acceptance(models, prompts, method="lookahead")
    (models / "evaluation.json").write_text(json.dumps(evaluation, indent=2))
    card = render_card(training, evaluation)
    (models / "README.md").write_text(card)
    return card

"""Training: `commands.py` (the `train` CLI) over three packages. `data/` is what recipes train on (corpora, ShareGPT,
chat rendering, prompt suites, the demo tokenizer), `loop/` what they share (the loop and its checkpoints, precision,
curves, draft vocabularies, evaluation, model cards), `recipes/` one file per method: what it trains and its loss."""

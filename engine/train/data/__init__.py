"""What every recipe trains on: the stdlib and ShareGPT corpora, chat rendering for training text, the prompt
suites, and the demo tokenizer."""

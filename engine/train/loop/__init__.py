"""What every recipe shares: the training loop with its resumable checkpoints, mixed precision, held-out curves, the
draft vocabulary, evaluation and the model cards."""

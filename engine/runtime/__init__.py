"""How the target runs: compiled forwards, KV caches, attention, packed weights, timing."""

"""The speculative loop: propose, verify, commit, for B rows at once."""

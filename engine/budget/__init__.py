"""How deep each step drafts: the cost-aware budget and lookahead's window."""

"""One file per method's recipe: what it trains and its loss, over the shared data (engine.train.data) and loop
(engine.train.loop)."""

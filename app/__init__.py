"""Glance's Qt front end: a thin layer that renders the engine's event stream."""

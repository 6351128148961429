"""What a run leaves: events, statistics, session logs and the tables made from them."""

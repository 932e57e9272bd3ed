"""specheads.train."""

"""specheads.data."""

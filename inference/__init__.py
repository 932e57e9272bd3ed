"""specheads.inference."""

"""The command lines (`specheads.scripts`): each file runs as `python scripts/NAME.py`, and `cli.py` is the installed
`specheads` command over all of them. They are thin: the work lives in heads/, data/, train/ and inference/."""

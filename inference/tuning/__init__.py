"""Choosing a draft's tree for this machine: medusa_tree (a static tree from rank statistics and timings,
scripts/build_tree.py) and eagle_tree (an EAGLE-2 dynamic tree shape, scripts/tune_eagle_tree.py)."""

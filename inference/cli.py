"""argparse types for the decoding command lines (chat.py, bench.py): the shared ones (data/arguments.py) and the
tree's.
"""

from __future__ import annotations

import argparse

from specheads.data.arguments import (float_in, int_at_least, int_or_auto, min_prob, non_negative_float,  # noqa: F401
                                      non_negative_int, positive_int, top_p)

from .tree import TreeError, parse_tree


def tree_json(text: str) -> str:
    """A static tree as JSON rank paths, checked for shape (kept as the text given); what the heads allow (depth,
    ranks) is checked once they are loaded."""
    try:
        parse_tree(text)
    except TreeError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text

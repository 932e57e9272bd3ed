"""Keep only the accepted path of a verified tree in a transformers Cache.

After the tree forward the cache ends with one entry per tree node. The accepted nodes
(root first, each a descendant of the previous) are moved to the front of that block and
the rest is cut with the Cache's own `crop`, so the cache again holds one contiguous
sequence with correct positions (in a batch: every row its own path, one gather per layer).
"""

from __future__ import annotations

import inspect

import torch


def cache_argument_name(model) -> str:
    """The forward keyword for the KV cache: transformers 5.x renames `past_key_values` to `cache`."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def prepare_cache_for_rollback(cache) -> None:
    """Sliding-window layers must keep past states so that `crop` can roll them back."""
    for layer in getattr(cache, "layers", []):
        record = getattr(layer, "activate_past_recording", None)  # transformers versions that have it
        if getattr(layer, "is_sliding", False) and record is not None:
            record()


def keep_accepted_paths(cache, num_tree_nodes: int, accepted: list[torch.Tensor]) -> int:
    """Each row's accepted nodes to the front of the last `num_tree_nodes` cache slots; the block is cut to the
    longest path, whose length is returned.

    One gather per layer for the whole batch. A row whose path is shorter than the longest keeps whatever
    the gather puts in its remaining slots; the batched decoder masks them for that row."""
    kept = max(len(path) for path in accepted)
    order = torch.arange(kept, device=accepted[0].device).repeat(len(accepted), 1)
    for i, path in enumerate(accepted):
        order[i, :len(path)] = path
    in_place = bool((order == torch.arange(kept, device=order.device)).all())  # every path is 0, 1, 2, ...
    for layer in () if in_place else cache.layers:
        if getattr(layer, "keys", None) is None:
            raise NotImplementedError(f"cannot roll back cache layers of type {type(layer).__name__}")
        start = layer.keys.shape[-2] - num_tree_nodes  # this layer's copy of the block
        for name in ("keys", "values"):
            states = getattr(layer, name)
            index = order[:, None, :, None].expand(-1, states.shape[1], -1, states.shape[-1])
            states[:, :, start:start + kept] = states[:, :, start:start + num_tree_nodes].gather(2, index)
    if num_tree_nodes > kept:
        cache.crop(-(num_tree_nodes - kept))
    return kept


def keep_accepted_path(cache, num_tree_nodes: int, accepted_nodes: torch.Tensor) -> None:
    """The single-sequence case: move the accepted nodes' states to the front of the tree block, drop the rest."""
    keep_accepted_paths(cache, num_tree_nodes, [accepted_nodes])

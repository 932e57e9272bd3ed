"""Keep only the accepted path of a verified tree in a transformers Cache.

After the tree forward the cache ends with one entry per tree node. The accepted nodes
(root first, each a descendant of the previous) are moved to the front of that block and
the rest is cut with the Cache's own `crop`, so the cache again holds one contiguous
sequence with correct positions.
"""

from __future__ import annotations

import torch


def prepare_cache_for_rollback(cache) -> None:
    """Sliding-window layers must keep past states so that `crop` can roll them back."""
    for layer in getattr(cache, "layers", []):
        if getattr(layer, "is_sliding", False) and hasattr(layer, "activate_past_recording"):
            layer.activate_past_recording()


def keep_accepted_path(cache, num_tree_nodes: int, accepted_nodes: torch.Tensor) -> None:
    """Move the accepted nodes' key/value states to the front of the tree block and drop the rest."""
    kept = len(accepted_nodes)
    is_prefix = bool((accepted_nodes == torch.arange(kept, device=accepted_nodes.device)).all())
    if not is_prefix:  # node indices are contiguous when the accepted path is 0, 1, 2, ...
        source = accepted_nodes - num_tree_nodes  # offsets from the end of the cache
        for layer in cache.layers:
            if getattr(layer, "keys", None) is None:
                raise NotImplementedError(f"cannot roll back cache layers of type {type(layer).__name__}")
            start = layer.keys.shape[-2] - num_tree_nodes
            layer.keys[..., start:start + kept, :] = layer.keys[..., source + layer.keys.shape[-2], :]
            layer.values[..., start:start + kept, :] = layer.values[..., source + layer.values.shape[-2], :]
    if num_tree_nodes > kept:
        cache.crop(-(num_tree_nodes - kept))

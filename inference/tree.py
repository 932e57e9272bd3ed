"""Static candidate trees as rank paths, and the tensors a verification step needs.

A tree is a list of paths of top-k ranks: (0,) is head 1's best token, (0, 1) is head 2's
second-best token placed under it. Node 0 is the root (the token the base model chose last);
every path is one more node. From the paths alone we derive, once per tree:

  attention_mask   [N, N] bool: node i sees node j iff j is i or an ancestor of i
  depths           [N]: 0 for the root; position id = prefix length + depth
  candidate_index  [N]: where each node's token sits in the flat candidate list
                   [root, head-1 top-k ..., head-2 top-k ..., ...]
  retrieve_indices [P, D+1]: node indices along each root-to-leaf path, padded with -1
"""

from __future__ import annotations

import heapq
import json
from dataclasses import dataclass

import torch

Tree = list[tuple[int, ...]]


class TreeError(ValueError):
    pass


def validate_tree(paths, num_heads: int, top_k: int) -> Tree:
    """Check a tree and return its paths sorted so that every parent precedes its children."""
    tree = []
    for path in paths:
        path = tuple(path)
        if not path:
            raise TreeError("empty path: the root is implicit, list only its descendants")
        if any(isinstance(rank, bool) or not isinstance(rank, int) or rank < 0 for rank in path):
            raise TreeError(f"path {path}: ranks must be non-negative integers")
        tree.append(path)
    seen = set()
    for path in tree:
        if path in seen:
            raise TreeError(f"duplicate path {path}")
        seen.add(path)
    for path in tree:
        if len(path) > num_heads:
            raise TreeError(f"path {path} has depth {len(path)} but there are only {num_heads} heads")
        if max(path) >= top_k:
            raise TreeError(f"path {path} uses rank {max(path)} but candidates are top-{top_k}")
        if len(path) > 1 and path[:-1] not in seen:
            raise TreeError(f"path {path} is an orphan: its parent {path[:-1]} is not in the tree")
    return sorted(tree, key=lambda p: (len(p), p))


def parse_tree(text: str) -> Tree:
    """A tree written as JSON (a list of rank paths, e.g. [[0], [1], [0, 0]]), checked for shape: a TreeError with
    one line otherwise. Whether the heads can fill it (depth, ranks) is check_tree_fits' question."""
    try:
        paths = json.loads(text)
    except json.JSONDecodeError as err:
        raise TreeError(f"not valid JSON ({err.msg.removesuffix(' at')} at column {err.colno})") from None
    if not isinstance(paths, list):
        raise TreeError(f"must be a JSON list of rank paths like [[0], [1], [0, 0]], got {text.strip()[:40]}")
    for path in paths:
        if not isinstance(path, list):
            raise TreeError(f"path {json.dumps(path)[:40]} must be a list of ranks like [0, 1]")
    depth = max((len(path) for path in paths), default=0)
    return validate_tree(paths, depth, top_k=1 + max((r for p in paths for r in p if type(r) is int), default=0))


def check_tree_fits(paths, num_heads: int, vocab_size: int) -> None:
    """Can heads with num_heads heads over vocab_size tokens fill this tree? A TreeError naming the path otherwise."""
    for path in paths:
        path = tuple(path)
        if len(path) > num_heads:
            raise TreeError(f"path {list(path)} has depth {len(path)} but there are only {num_heads} heads")
        if path and max(path) >= vocab_size:
            raise TreeError(f"path {list(path)} uses rank {max(path)} but the heads rank only {vocab_size} tokens "
                            f"(ranks 0..{vocab_size - 1})")


@dataclass
class TreeBuffers:
    paths: Tree
    top_k: int
    attention_mask: torch.Tensor
    depths: torch.Tensor
    candidate_index: torch.Tensor
    retrieve_indices: torch.Tensor
    parent: torch.Tensor  # [N] index of each node's parent (-1 for the root)

    @property
    def num_nodes(self) -> int:
        return len(self.paths) + 1

    def to(self, device) -> "TreeBuffers":
        return TreeBuffers(self.paths, self.top_k, *(t.to(device) for t in (
            self.attention_mask, self.depths, self.candidate_index, self.retrieve_indices, self.parent)))


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """bool "may attend" -> the additive float mask transformers takes as a 4D attention mask (0 or dtype min)."""
    mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    return mask.masked_fill(~allowed, torch.finfo(dtype).min)


def build_tree_buffers(paths, num_heads: int, top_k: int) -> TreeBuffers:
    tree = validate_tree(paths, num_heads, top_k)
    index = {(): 0, **{path: i + 1 for i, path in enumerate(tree)}}
    n = len(tree) + 1
    attention_mask = torch.zeros(n, n, dtype=torch.bool)
    depths = torch.zeros(n, dtype=torch.long)
    candidate_index = torch.zeros(n, dtype=torch.long)
    parent = torch.full((n,), -1, dtype=torch.long)
    attention_mask[0, 0] = True
    for path in tree:
        i = index[path]
        depths[i] = len(path)
        candidate_index[i] = 1 + (len(path) - 1) * top_k + path[-1]
        parent[i] = index[path[:-1]]
        for cut in range(len(path) + 1):
            attention_mask[i, index[path[:cut]]] = True
    leaves = [p for p in tree if not any(q[:-1] == p for q in tree)] or [()]
    depth = max((len(p) for p in tree), default=0)
    retrieve = torch.full((len(leaves), depth + 1), -1, dtype=torch.long)
    for row, leaf in enumerate(leaves):
        for cut in range(len(leaf) + 1):
            retrieve[row, cut] = index[leaf[:cut]]
    return TreeBuffers(tree, top_k, attention_mask, depths, candidate_index, retrieve, parent)


# FasterDecoding/Medusa's default tree, `mc_sim_7b_63` (medusa/model/medusa_choices.py): 63 nodes, depth 4, top-10.
MEDUSA_DEFAULT_TREE: Tree = [tuple(p) for p in (
    [0], [0, 0], [1], [0, 1], [2], [0, 0, 0], [1, 0], [0, 2], [3], [0, 3], [4], [0, 4], [2, 0], [0, 5], [0, 0, 1],
    [5], [0, 6], [6], [0, 7], [0, 1, 0], [1, 1], [7], [0, 8], [0, 0, 2], [3, 0], [0, 9], [8], [9], [1, 0, 0],
    [0, 2, 0], [1, 2], [0, 0, 3], [4, 0], [2, 1], [0, 0, 4], [0, 0, 5], [0, 0, 0, 0], [0, 1, 1], [0, 0, 6],
    [0, 3, 0], [5, 0], [1, 3], [0, 0, 7], [0, 0, 8], [0, 0, 9], [6, 0], [0, 4, 0], [1, 4], [7, 0], [0, 1, 2],
    [2, 0, 0], [3, 1], [2, 2], [8, 0], [0, 5, 0], [1, 5], [1, 0, 1], [0, 2, 1], [9, 0], [0, 6, 0], [0, 0, 0, 1],
    [1, 6], [0, 7, 0])]


def default_medusa_tree(num_heads: int, vocab_size: int | None = None) -> Tree:
    """The tree for heads that carry none: Medusa's default (MEDUSA_DEFAULT_TREE, what its code falls back to),
    cut to the paths `num_heads` heads can fill (depth <= heads, ranks < vocabulary). Cutting keeps every
    ancestor: a parent is shorter than its child and its ranks are among the child's."""
    return [path for path in MEDUSA_DEFAULT_TREE
            if len(path) <= num_heads and (vocab_size is None or max(path) < vocab_size)]


def chain_tree(depth: int) -> Tree:
    """Top-1 of each head, one after another."""
    return [tuple([0] * d) for d in range(1, depth + 1)]


def tree_from_accuracies(rank_accuracy: list[list[float]], num_nodes: int) -> Tree:
    """Medusa's greedy construction: grow the tree by the node most likely to be accepted.

    rank_accuracy[d][r] = probability that head d+1's rank-r token is the right one. A node's
    acceptance probability is the product along its path, so a child never beats its parent
    and taking nodes best-first keeps the tree closed under ancestors.
    """
    heap = [(-rank_accuracy[0][r], (r,)) for r in range(len(rank_accuracy[0]))]
    heapq.heapify(heap)
    tree = []
    while heap and len(tree) < num_nodes:
        neg_p, path = heapq.heappop(heap)
        tree.append(path)
        depth = len(path)
        if depth < len(rank_accuracy):
            for r, acc in enumerate(rank_accuracy[depth]):
                heapq.heappush(heap, (neg_p * acc, path + (r,)))
    return validate_tree(tree, len(rank_accuracy), max(len(row) for row in rank_accuracy))


def expected_tau(tree: Tree, rank_accuracy: list[list[float]]) -> float:
    """Expected tokens per step: the bonus token plus each node's chance of being accepted."""
    tau = 1.0
    for path in tree:
        p = 1.0
        for depth, rank in enumerate(path):
            p *= rank_accuracy[depth][rank]
        tau += p
    return tau


def path_frequencies(ranks: torch.Tensor, max_rank: int) -> dict[tuple[int, ...], float]:
    """Empirical acceptance probability of every rank path seen in `ranks`.

    ranks[i, d] is the rank of the true token among head d+1's candidates at sample i (-1 when
    not in the top `max_rank`). Path (r1..rm) is accepted at sample i iff ranks[i, :m] == (r1..rm),
    so its frequency is exact for these samples: no independence assumption between heads, which
    would undervalue deep paths (a head is more often right when the one before it was).
    """
    counts: dict[tuple[int, ...], int] = {}
    for row in ranks.tolist():
        path = ()
        for rank in row:
            if rank < 0 or rank >= max_rank:
                break
            path = path + (rank,)
            counts[path] = counts.get(path, 0) + 1
    total = max(ranks.shape[0], 1)
    return {path: count / total for path, count in counts.items()}


def tree_from_path_frequencies(frequencies: dict[tuple[int, ...], float], num_nodes: int) -> Tree:
    """The `num_nodes` most frequently accepted paths; closed under ancestors since a prefix is never rarer."""
    ranked = sorted(frequencies.items(), key=lambda item: (-item[1], len(item[0]), item[0]))
    tree = [path for path, _ in ranked[:num_nodes]]
    depth = max((len(p) for p in tree), default=0)
    top_k = max((max(p) for p in tree), default=0) + 1
    return validate_tree(tree, max(depth, 1), top_k)


def buffers_from_parents(parents: list[int]) -> TreeBuffers:
    """Buffers of a per-step tree given as parent pointers (parents[0] = -1, parents[i] < i).

    For trees that change every step (lookahead windows, n-gram tries): O(nodes × depth), no
    sorting or validation of rank paths. Node order is kept as given; a node's rank path records
    its order among its siblings, and candidate_index is the identity (tokens come per node).
    """
    n = len(parents)
    if n == 0 or parents[0] != -1 or any(not 0 <= p < i for i, p in enumerate(parents[1:], start=1)):
        raise TreeError("parents must start with -1 (the root) and point to earlier nodes")
    paths: list[tuple[int, ...]] = [()]
    child_count = [0] * n
    attention_mask = torch.zeros(n, n, dtype=torch.bool)
    attention_mask[0, 0] = True
    for i in range(1, n):
        p = parents[i]
        paths.append(paths[p] + (child_count[p],))
        child_count[p] += 1
        attention_mask[i] = attention_mask[p]
        attention_mask[i, i] = True
    depths = torch.tensor([len(path) for path in paths], dtype=torch.long)
    leaves = [i for i in range(n) if child_count[i] == 0]
    retrieve = torch.full((len(leaves), int(depths.max()) + 1), -1, dtype=torch.long)
    for row, leaf in enumerate(leaves):
        chain = [leaf]
        while parents[chain[-1]] >= 0:
            chain.append(parents[chain[-1]])
        retrieve[row, : len(chain)] = torch.tensor(chain[::-1])
    return TreeBuffers(paths[1:], max(max(child_count), 1), attention_mask, depths,
                       torch.arange(n, dtype=torch.long), retrieve, torch.tensor(parents, dtype=torch.long))

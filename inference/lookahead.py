"""Lookahead decoding (Fu et al., ICML 2024) as a candidate source: Jacobi guesses and n-gram checks in one forward.

The lookahead branch is a 2D window of N−1 levels × W columns of guessed tokens; the token at
(level j, column i) sits at position t + i + j (t = the root's position, level 0 column 0 is the root
itself). It sees the prefix, level 0 up to column i, and its own column up to level j, so the window is
a tree: level 0 is a chain from the root and each column hangs off it (the mask of the paper, Fig. 2).
One Jacobi iteration = the base's argmax at the last level: column i then yields the n-gram
(level 0..N−2 of column i, new token), stored in a pool keyed by its first token (at most G per key).
The verification branch is a trie of the pool's n-grams that start with the root. Both branches form
one tree, so TreeDecoder verifies it in the same forward (greedy: lossless; a Jacobi guess that
matches is accepted too), and `observe` advances the window: one level per accepted token, the new
last level from this forward's outputs (then copies of level 0, as in llama.cpp's lookahead example).
Tokens per forward: 1 + (W − 1) + W(N − 2) window tokens + up to G(N − 1) verification tokens.
"""

from __future__ import annotations

import random

import torch

from .source import CandidateSource
from .tree import buffers_from_parents


class LookaheadCandidates(CandidateSource):
    stateful, reads_verify_logits, copyable = True, True, False

    def __init__(self, window: int = 5, ngram: int = 4, pool: int | None = None, device="cpu", seed: int = 0):
        if window < 1 or ngram < 2:
            raise ValueError("lookahead needs window >= 1 and ngram >= 2")
        self.window, self.ngram = window, ngram
        self.pool_size = window if pool is None else pool  # G = W, as in the paper
        self.device, self.seed = device, seed
        self.begin(None, None, None)

    def begin(self, sampling, warpers, generator):
        """New generation: empty pool, window guessed on the first step from the prompt's tokens."""
        self.pool: dict[int, list[tuple[int, ...]]] = {}
        self.levels: list[list[int]] | None = None
        self._last_level_nodes: list[int] = []
        self._root = None

    def _init_levels(self, context: list[int]) -> list[list[int]]:
        rng = random.Random(self.seed)  # guesses only steer speed; fixed for reproducible timings
        return [[rng.choice(context) for _ in range(self.window)] for _ in range(self.ngram - 1)]

    def propose(self, root: int, hidden: torch.Tensor, context: list[int]):
        if self.levels is None:
            self.levels = self._init_levels(context + [root])
        tokens, parents = [root], [-1]
        # verification branch: the pool's n-grams after the root, as a trie
        trie: dict[tuple[int, int], int] = {}
        for gram in self.pool.get(root, ()):
            node = 0
            for token in gram:
                child = trie.get((node, token))
                if child is None:
                    child = trie[(node, token)] = len(tokens)
                    tokens.append(token)
                    parents.append(node)
                node = child
        # lookahead branch: level 0 is a chain from the root, each column hangs below its level-0 token
        grid = [[0] * self.window for _ in self.levels]
        for level, row in enumerate(self.levels):
            for column in range(self.window):
                if level == 0 and column == 0:
                    continue  # the root
                parent = grid[0][column - 1] if level == 0 else grid[level - 1][column]
                grid[level][column] = len(tokens)
                tokens.append(row[column])
                parents.append(parent)
        self._last_level_nodes = grid[-1]
        self._root = root
        return torch.tensor(tokens, device=self.device), buffers_from_parents(parents).to(self.device)

    def observe(self, logits: torch.Tensor, accepted: torch.Tensor):
        """Collect this iteration's n-grams, then shift the window by the number of tokens accepted."""
        new_level = logits[self._last_level_nodes].argmax(dim=-1).tolist()
        levels = self.levels
        for column in range(self.window):
            first = self._root if column == 0 else levels[0][column]
            gram = tuple(row[column] for row in levels[1:]) + (new_level[column],)
            grams = self.pool.setdefault(first, [])
            if gram not in grams:
                grams.append(gram)
                if len(grams) > self.pool_size:
                    grams.pop(0)  # oldest out
        levels = levels[1:] + [new_level]
        for _ in range(len(accepted) - 1):  # more tokens than one Jacobi step advances: refill from level 0
            levels = levels[1:] + [list(levels[0])]
        self.levels = levels

"""Our decoder with the draft an engine runs: a chain of k tokens, the draft's top-1 at each step.

vLLM drafts chains: Medusa's heads 1..k each propose their top-1 token; an EAGLE draft runs k steps, each
on its own previous top-1; a DFlash drafter runs once on the anchor and k mask slots. Here the same chains go through our verifier (a Medusa tree [[0], [0, 0], ...];
an EAGLE-2 tree of top_k 1, depth k and k + 1 nodes with the root), so that acceptance lengths compare.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specheads.heads.kinds import kind_of

from ..decoder import TreeDecoder
from ..methods import MethodOptions, build_decoder
from ..tree import chain_tree


def chain_decoder(model, draft, k: int) -> TreeDecoder:
    """A decoder that drafts what a chain-drafting engine drafts: k tokens, top-1 each (heads.kinds says how: an
    EAGLE draft grows a one-wide dynamic tree k deep; Medusa heads and a DFlash block a static chain)."""
    if k < 1:
        raise ValueError(f"a chain drafts k >= 1 tokens, got {k}")
    kind = kind_of(draft)
    limit = kind.chain_limit(draft) if kind.chain_limit else None
    if limit is not None and k > limit:
        raise ValueError(f"{kind.title} draft at most {limit} tokens per step, not k={k}")
    if kind.chain == "dynamic":
        options = MethodOptions(eagle_tree={"top_k": 1, "depth": k, "total_tokens": k + 1, "min_prob": 0.0})
    else:
        options = MethodOptions(tree=chain_tree(k))
    return build_decoder(kind.method, model, draft, options)


@dataclass
class ChainRun:
    tokens: list[list[int]]
    step_lengths: list[int]  # tokens produced by each verify step, bonus included, over all prompts
    k: int

    @property
    def acceptance_length(self) -> float:
        """Mean tokens per verify step: what vLLM reports as its mean acceptance length."""
        return sum(self.step_lengths) / len(self.step_lengths) if self.step_lengths else 1.0

    @property
    def accepted_per_position(self) -> list[int]:
        """How many steps accepted draft position i (0-based), as vLLM counts per position."""
        return [sum(1 for n in self.step_lengths if n - 1 > i) for i in range(self.k)]


def run_chain(model, draft, prompts: list[list[int]], k: int, max_new_tokens: int, eos_token_ids=()) -> ChainRun:
    """Greedy-decode each prompt (token ids) with the k-token chain; tokens and per-step lengths."""
    decoder = chain_decoder(model, draft, k)
    tokens, lengths = [], []
    for ids in prompts:
        tokens.append(decoder.generate_ids(torch.tensor([ids]), max_new_tokens, eos_token_ids=eos_token_ids))
        lengths.extend(decoder.stats.accepted_lengths)
    return ChainRun(tokens, lengths, k)

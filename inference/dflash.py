"""A DFlash block drafter as a candidate source: one drafter forward per step proposes the whole block.

The drafter keeps the keys and values of its *context*: the base's fused features at every position the base has
verified (`commit` appends the accepted positions' states, projected once per draft layer, as vLLM's
precompute_and_store_context_kv does). `propose(root)` runs the drafter once on [root, mask, ..., mask] at the
positions after the context; the output at block position j is a distribution over the token j places after the
root. The tree is static, as Medusa's: rank paths over those per-position top-k lists (depth d = block position d),
by default the chain of top-1 tokens (what vLLM drafts). The block runs with as many mask slots as the tree is
deep (vLLM: num_speculative_tokens of them), at most block_size - 1; inside the block attention is not causal, so a
shorter block drafts differently, as in vLLM. Which nodes are proposed never changes the output.
"""

from __future__ import annotations

import copy

import torch

from .source import CandidateSource
from .tree import TreeBuffers, build_tree_buffers, chain_tree, check_tree_fits


class DFlashCandidates(CandidateSource):
    """DFlash drafter + a static tree over its per-position top-k: a feature-level draft (it reads the base's
    states, `commit` after every verify) with a context cache of its own per generation (stateful, spawn)."""

    stateful = True

    def __init__(self, draft, model, tree=None):
        config = draft.config
        self.draft = draft.to(device=model.device, dtype=model.dtype).eval()
        self.embed = model.get_input_embeddings()
        self.lm_head = model.get_output_embeddings()
        self.feature_layers = tuple(config.feature_layers)
        tree = chain_tree(config.num_draft_tokens) if tree is None else [tuple(path) for path in tree]
        check_tree_fits(tree, config.num_draft_tokens, config.vocab_size)
        self.top_k = max((max(path) for path in tree), default=0) + 1
        self.buffers: TreeBuffers = build_tree_buffers(tree, config.num_draft_tokens, self.top_k).to(model.device)
        self.depth = int(self.buffers.depths.max())
        self.mask_token_id = config.mask_token_id
        self.device, self.dtype = model.device, model.dtype
        self.begin()

    @classmethod
    def for_model(cls, model, draft, tree=None) -> "DFlashCandidates":
        """With `tree`, else the tree stored with the drafter (metadata "tree"), else the top-1 chain."""
        if tree is None:
            tree = draft.metadata.get("tree")
        return cls(draft, model, tree)

    def begin(self, *unused) -> None:
        """A new generation: forget the previous one's context."""
        self.context = [None] * len(self.draft.layers)  # per layer (keys, values) [1, kv_heads, committed, d]
        self.committed = 0

    def spawn(self) -> "DFlashCandidates":
        twin = copy.copy(self)  # shares the drafter, embeddings and lm_head; begin() gives it its own context
        twin.begin()
        return twin

    @torch.inference_mode()
    def commit(self, next_tokens: list[int], states: list[torch.Tensor]) -> None:
        """The base's states at the newly verified positions (states[l]: [n, H] of feature layer l) join the
        context, projected into every draft layer's keys and values."""
        n = len(next_tokens)
        fused = self.draft.fuse([s[None].to(self.dtype) for s in states])
        positions = torch.arange(self.committed, self.committed + n, device=self.device)[None]
        for layer, (keys, values) in enumerate(self.draft.context_kv(fused, positions)):
            if self.context[layer] is not None:
                keys = torch.cat([self.context[layer][0], keys], dim=2)
                values = torch.cat([self.context[layer][1], values], dim=2)
            self.context[layer] = (keys, values)
        self.committed += n

    @torch.inference_mode()
    def block_outputs(self, root: int, slots: int | None = None) -> torch.Tensor:
        """The drafter's outputs [slots, H] for the `slots` tokens after `root` (default block_size - 1), one
        forward over [root, mask * slots]."""
        if self.committed == 0:
            raise RuntimeError("DFlashCandidates.propose before commit: the decoder must commit the prompt first")
        size = 1 + (slots or self.draft.config.num_draft_tokens)
        ids = torch.full((1, size), self.mask_token_id, dtype=torch.long, device=self.device)
        ids[0, 0] = root
        positions = torch.arange(self.committed, self.committed + size, device=self.device)[None]
        visible = torch.ones(1, self.committed, dtype=torch.bool, device=self.device)
        out = self.draft(self.embed(ids), positions, self.context, self.draft.block_mask(visible, size))
        return out[0, 1:]

    @torch.inference_mode()
    def propose(self, root: int, hidden: torch.Tensor, context: list[int]):
        if self.depth == 0:
            return torch.tensor([root], device=self.device), self.buffers
        logits = self.lm_head(self.block_outputs(root, self.depth))  # [depth, V]
        top = logits.topk(self.top_k, dim=-1).indices.flatten()
        flat = torch.cat([torch.tensor([root], device=self.device), top])
        return flat[self.buffers.candidate_index], self.buffers

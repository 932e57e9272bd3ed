"""What a candidate source is: the contract between draft tokens and the verifier.

Every way of drafting (Medusa heads, prompt lookup, an EAGLE draft, a self-draft model, lookahead, and their
combinations) is a `CandidateSource`. The decoders (decoder.TreeDecoder, batched.BatchedTreeDecoder) talk to
a source only through this contract; what a source needs and can do is declared by four class attributes, not
discovered:

    feature_layers       base hidden states it reads (empty: none). A source that reads them is a feature-level
                         draft (EAGLE): after every verify it is handed the accepted tokens with the base's states
                         at their positions (`commit`).
    stateful             it keeps per-generation state: `begin` starts a generation, and a batch gives each row a
                         copy of its own (`spawn`).
    reads_verify_logits  it learns from every tree node's logits after the verify forward (`observe`); the decoder
                         then keeps every node's logits (no lazy lm_head), and it cannot share a tree with others.
    own_acceptance       its drafts are sampled, not point masses: at T > 0 its own exact rule
                         (`lossless_accept`) replaces the standard one.
    copyable             `spawn` gives an independent copy (stateless sources: itself).

Subclass `CandidateSource` (a Protocol with defaults) and override what differs; the defaults describe a
stateless source such as Medusa heads or prompt lookup.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from .acceptance import lossless_accept
from .tree import TreeBuffers


@runtime_checkable
class CandidateSource(Protocol):
    feature_layers: tuple[int, ...] = ()
    stateful: bool = False
    reads_verify_logits: bool = False
    own_acceptance: bool = False
    copyable: bool = True

    def propose(self, root: int, hidden: torch.Tensor, context: list[int]) -> tuple[torch.Tensor, TreeBuffers]:
        """The next step's tree: node tokens (node 0 = root, the token the base chose last) and its buffers.
        hidden: the base's last hidden state at the root's parent; context: every token in the cache."""
        ...

    def begin(self, sampling, warpers, generator) -> None:
        """A new generation starts (sampling config, its logits warpers, the decoder's random generator)."""

    def commit(self, tokens: list[int], states: list[torch.Tensor]) -> None:
        """Feature-level drafts: the tokens just accepted (bonus last) and the base's `feature_layers` states at
        the positions they were read from."""

    def observe(self, logits: torch.Tensor, accepted) -> None:
        """reads_verify_logits sources: every node's logits of the verify forward and the accepted path."""

    def lossless_accept(self, tokens, probs, children, generator=None):
        """own_acceptance sources override this; the standard rule otherwise."""
        return lossless_accept(tokens, probs, children, generator)

    def spawn(self) -> "CandidateSource":
        """A copy for one batch row."""
        if self.stateful:
            raise ValueError(f"{type(self).__name__} keeps per-generation state but cannot give each batch row a "
                             "copy of its own (spawn)")
        return self


def follows_features(source: CandidateSource) -> bool:
    """Whether the decoder must hand this source base states and accepted tokens (`commit`)."""
    return bool(source.feature_layers)

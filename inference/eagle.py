"""EAGLE-2 dynamic draft trees from an EAGLE draft head, for the same verifier as Medusa.

The draft keeps its own KV cache of *committed* entries: at position t it has read the base's feature
f_t and the token x_{t+1}. After each verification the decoder commits the accepted tokens with the
base's features at their positions (`commit`), so the draft always continues from real features.
Then `propose` grows a tree best-first by cumulative log-probability (EAGLE-2):
  level 1: the draft's top-k after the last committed entry;
  level j: run the draft on the current frontier (the k best nodes so far at depth j), attending to the
           committed entries and each node's own ancestors; every node's top-k children join the pool
           and the k best children (by cumulative log-probability) become the next frontier;
  finally keep the best `total_tokens - 1` nodes of the pool. A child never outscores its parent, so
  the kept nodes always include their ancestors (ties are broken toward shallower nodes).
With `min_prob` > 0 the tree also shrinks where the draft is unsure: a node whose cumulative draft
probability is below min_prob is neither expanded nor verified, and drafting stops early when the whole
frontier is. Where a verified token and a draft step cost real time (a small base on a CPU) this skips
the draft steps and tree nodes that would rarely be accepted. The draft's probability ranks nodes by their
chance of acceptance (EAGLE-2's observation) but, trained on the base's sampling distribution, it is not that
chance at T=0, so the threshold is measured per machine (scripts/tune_eagle_tree.py). Which nodes are
proposed never changes the output, only the speed.
Tree entries are cropped from the draft cache before the next commit.
"""

from __future__ import annotations

import copy
import math

import torch
from transformers import DynamicCache

from .acceptance import lossless_accept
from .source import CandidateSource
from .tree import additive_mask, buffers_from_parents


def select_tree_nodes(scores: list[float], depths: list[int], parents: list[int], budget: int,
                      min_score: float = -math.inf) -> list[int]:
    """Indices (root 0 first, parents before children) of the `budget` best non-root nodes scoring at least
    `min_score`, plus the root.

    Ties go to shallower nodes, then earlier ones, so a node never displaces its own ancestor."""
    eligible = [i for i in range(1, len(scores)) if scores[i] >= min_score]
    order = sorted(eligible, key=lambda i: (-scores[i], depths[i], i))[:budget]
    chosen = set(order)
    for i in order:  # defensive: ancestors of every chosen node must be in (they are when scores are monotone)
        p = parents[i]
        while p > 0:
            if p not in chosen:
                raise AssertionError(f"dynamic tree node {i} was chosen without its ancestor {p}")
            p = parents[p]
    return [0] + sorted(order, key=lambda i: (depths[i], i))


def check_tree_settings(top_k: int, depth: int, total_tokens: int, min_prob: float = 0.0) -> None:
    """Refuse an EAGLE-2 tree shape that cannot be built (ValueError naming the setting)."""
    if top_k < 1 or depth < 1 or total_tokens < 2:
        raise ValueError("EAGLE trees need top_k >= 1, depth >= 1 and total_tokens >= 2")
    if not 0.0 <= min_prob < 1.0:
        raise ValueError(f"EAGLE tree min_prob must be in [0, 1), got {min_prob}")


class EagleCandidates(CandidateSource):
    """EAGLE draft + EAGLE-2 dynamic tree as a candidate source of TreeDecoder: a feature-level draft with a
    cache of its own per generation (stateful), copied per batch row (spawn)."""

    stateful = True

    def __init__(self, draft, model, top_k: int = 8, depth: int = 5, total_tokens: int = 32, min_prob: float = 0.0):
        check_tree_settings(top_k, depth, total_tokens, min_prob)
        ranked = draft.config.draft_vocab_size or draft.config.vocab_size
        if top_k > ranked:
            raise ValueError(f"EAGLE tree top_k {top_k} exceeds the {ranked} tokens the draft ranks")
        self.draft = draft.to(device=model.device, dtype=model.dtype).eval()
        self.draft.set_attention("sdpa")  # its masks are built in the draft's dtype below
        self.embed = model.get_input_embeddings()
        self.lm_head = model.get_output_embeddings()
        self.feature_layers = tuple(draft.config.feature_layers)  # the decoder hands us these hidden states
        self.top_k, self.depth, self.total_tokens = top_k, depth, total_tokens
        self.width = top_k  # frontier nodes expanded per level
        self.min_score = math.log(min_prob) if min_prob > 0 else -math.inf  # on cumulative log-probabilities
        self.device, self.dtype = model.device, model.dtype
        self.begin()

    def begin(self, *unused) -> None:
        """A new generation: forget the previous one's cache."""
        self.cache = DynamicCache()
        self.committed = 0
        self.last_output = None

    def spawn(self) -> "EagleCandidates":
        """Another source over the same draft and tree settings with a cache of its own: batched decoding
        keeps one per row, since rows accept different tokens and so commit different entries."""
        twin = copy.copy(self)  # shares the draft, embeddings and lm_head; begin() gives it its own cache
        twin.begin()
        return twin

    def _drop_tree_entries(self) -> None:
        extra = self.cache.get_seq_length() - self.committed
        if extra > 0:
            self.cache.crop(-extra)

    def _mask(self, visible: torch.Tensor) -> torch.Tensor:
        """bool [n, keys] -> additive [1, 1, n, keys] in the draft's dtype."""
        return additive_mask(visible.to(self.device), self.dtype)[None, None]

    @torch.inference_mode()
    def commit(self, next_tokens: list[int], states: list[torch.Tensor]) -> None:
        """Append entries (f_t, x_{t+1}) for the newly accepted positions: states[l] is [n, H] of feature layer l."""
        self._drop_tree_entries()
        n = len(next_tokens)
        features = self.draft.fuse([s[None].to(self.dtype) for s in states])
        embeddings = self.embed(torch.tensor([next_tokens], device=self.device))
        positions = torch.arange(self.committed, self.committed + n, device=self.device)[None]
        visible = torch.ones(n, self.committed + n, dtype=torch.bool, device=self.device)
        visible[:, self.committed:] = torch.ones(n, n, dtype=torch.bool, device=self.device).tril()
        out = self.draft(features, embeddings, positions, self._mask(visible), self.cache)
        self.committed += n
        self.last_output = out[0, -1]

    def _top_children(self, outputs: torch.Tensor):
        """Draft outputs [n, H] -> top-k (log-probabilities, target token ids), each [n, k]."""
        logits = self.draft.logits(outputs, self.lm_head).float()
        top = logits.topk(self.top_k, dim=-1)  # log_softmax keeps the order: normalise the k winners only
        return top.values - logits.logsumexp(dim=-1, keepdim=True), self.draft.draft_to_target(top.indices)

    def _children(self, outputs: torch.Tensor, nodes: list[int]):
        """Each of `nodes`' children (draft outputs [n, H], one row per node) -> ([n, k] log-probabilities,
        [n, k] target token ids): the draft's top-k."""
        return self._top_children(outputs)

    def _keep(self, scores: list[float], depths: list[int], parents: list[int]) -> list[int]:
        """The nodes verified (root first, parents before children): the best total_tokens - 1 of the pool."""
        return select_tree_nodes(scores, depths, parents, self.total_tokens - 1, self.min_score)

    @torch.inference_mode()
    def propose(self, root: int, hidden: torch.Tensor, context: list[int]):
        if self.last_output is None:
            raise RuntimeError("EagleCandidates.propose before commit: the decoder must commit the prompt first")
        self._drop_tree_entries()
        tokens, parents, scores, depths = [root], [-1], [0.0], [0]
        slots = {0: []}  # node -> the draft-cache entries of its ancestors and itself (nodes the draft has run on)
        logp, ids = self._children(self.last_output[None], [0])
        frontier = [1 + i for i, lp in enumerate(logp[0].tolist()) if lp >= self.min_score]  # sorted descending
        tokens += ids[0].tolist()
        scores += logp[0].tolist()
        parents += [0] * self.top_k
        depths += [1] * self.top_k
        frontier = sorted(frontier, key=lambda node: -scores[node])[: self.width]  # top-k children come sorted
        frontier_inputs = self.last_output.expand(len(frontier), -1)
        for level in range(1, self.depth):
            if not frontier:  # every open node is below min_prob: deeper ones would be too
                break
            # Run the draft on the frontier (depth `level`): each node sees the committed entries, its ancestors, itself.
            first_slot = self.cache.get_seq_length()  # committed entries, then earlier levels' nodes
            keys = first_slot + len(frontier)
            visible = torch.zeros(len(frontier), keys, dtype=torch.bool)
            visible[:, : self.committed] = True
            for row, node in enumerate(frontier):
                slots[node] = slots[parents[node]] + [first_slot + row]
                visible[row, slots[node]] = True
            embeddings = self.embed(torch.tensor([[tokens[i] for i in frontier]], device=self.device))
            positions = torch.full((1, len(frontier)), self.committed + level - 1, device=self.device)
            outputs = self.draft(frontier_inputs[None], embeddings, positions,
                                 self._mask(visible), self.cache)[0]
            logp, ids = self._children(outputs, frontier)
            # Children of frontier row r are nodes first_child + r*k .. + k-1, in the order of their rows.
            first_child = len(tokens)
            child_scores = (torch.tensor([scores[i] for i in frontier])[:, None] + logp.cpu()).flatten()
            tokens += ids.flatten().tolist()
            scores += child_scores.tolist()
            parents += [node for node in frontier for _ in range(self.top_k)]
            depths += [level + 1] * child_scores.numel()
            # The `width` best children (a stable sort: ties go to the earlier node) above min_prob form the next
            # frontier.
            order = torch.sort(child_scores, descending=True, stable=True)
            best = order.indices[: self.width][order.values[: self.width] >= self.min_score]
            frontier = (first_child + best).tolist()
            frontier_inputs = outputs[best // self.top_k]
        chosen = self._keep(scores, depths, parents)
        new_index = {node: i for i, node in enumerate(chosen)}
        buffers = buffers_from_parents([-1] + [new_index[parents[node]] for node in chosen[1:]])
        return torch.tensor([tokens[node] for node in chosen], device=self.device), buffers.to(self.device)


class SampledEagleCandidates(EagleCandidates):
    """An EAGLE draft whose tree children are *sampled* from its distribution at T > 0, for lossless sampling
    that accepts more than top-k children do.

    A top-k child x is accepted with probability p(x) (a point mass proposes it); a child drawn from the draft's
    q is accepted with probability min(1, p(x)/q(x)), so where the base's distribution is spread and the draft
    follows it, sampling keeps far more (p = q accepts always, where the top-1 child gets p's largest mass).
    Each expanded node gets `top_k` children drawn without replacement (Gumbel-top-k on log q, the decoder's
    random generator) and remembers q; `lossless_accept` runs recursive rejection sampling without
    replacement over them (acceptance.lossless_accept with proposals). For that rule to stay exact, which
    children a node has must not depend on the children's own tokens, so nothing is pruned after sampling: the
    tree is `top_k` children per expanded node, the `width` best nodes (cumulative log q) expanded per level,
    `depth` levels (top_k + (depth - 1) * width * top_k nodes). Which nodes get expanded may depend on their
    own tokens: an accepted node's next token comes from p whether its children are tried or not.
    At T = 0 the children are the draft's top-k (no noise) and the greedy rule verifies them.
    The defaults (2 children, 1 node expanded per level, 4 levels: 8 nodes) were the fastest of five shapes at T=1
    on the tune split (SmolLM2-135M, its EAGLE-3 draft, one CPU thread; docs/results.md).
    """

    own_acceptance = True

    def __init__(self, draft, model, top_k: int = 2, width: int = 1, depth: int = 4):
        if width < 1:
            raise ValueError(f"sampled EAGLE tree width must be >= 1, got {width}")
        super().__init__(draft, model, top_k=top_k, depth=depth, total_tokens=top_k + (depth - 1) * width * top_k + 1)
        self.width = width
        self.target_ids = self.draft.draft_to_target(torch.arange(self.draft.config.draft_vocab_size
                                                                  or self.draft.config.vocab_size, device=self.device))

    def begin(self, sampling=None, warpers=None, generator=None) -> None:
        super().begin()
        self.temperature = sampling.temperature if sampling is not None else 0.0
        self.generator = generator
        self.proposals: dict[int, torch.Tensor] = {}  # pool node -> the draft's q its children were drawn from

    def _children(self, outputs: torch.Tensor, nodes: list[int]):
        if self.temperature <= 0:
            return self._top_children(outputs)
        logits = self.draft.logits(outputs, self.lm_head).float()
        logq = torch.log_softmax(logits / self.temperature, dim=-1)
        uniform = torch.rand(logq.shape, generator=self.generator, dtype=torch.float64).clamp(min=1e-300)
        keys = logq.cpu().double() - torch.log(-torch.log(uniform))  # Gumbel-top-k: k draws without replacement
        picks = keys.topk(self.top_k, dim=-1).indices.to(logq.device)  # in the order they were drawn
        for row, node in enumerate(nodes):
            self.proposals[node] = logq[row].exp()
        return logq.gather(-1, picks), self.draft.draft_to_target(picks)

    def _keep(self, scores, depths, parents) -> list[int]:
        return list(range(len(scores)))  # nothing pruned: pruning by the children's own q would bias them

    def propose(self, root: int, hidden: torch.Tensor, context: list[int]):
        self.proposals = {}
        return super().propose(root, hidden, context)

    def lossless_accept(self, tokens, probs, children, generator=None):
        vocab = probs.shape[-1]
        proposals = {}
        for node, q in self.proposals.items():
            full = torch.zeros(vocab, dtype=torch.float64, device=probs.device)
            full.index_add_(0, self.target_ids.to(probs.device), q.double().to(probs.device))
            proposals[node] = full
        return lossless_accept(tokens, probs, children, generator, proposals)

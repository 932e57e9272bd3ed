"""Where draft tokens come from. Every source fills a tree that the same verifier checks.

A source proposes, for the next step, the node tokens of a tree (node 0 is the root: the token
the base model chose last) together with that tree's buffers. Sources:

- MedusaCandidates: the heads' top-k per future position, placed by a static tree (same every step).
- PromptLookupCandidates: the tokens that followed the latest earlier occurrence of the last n-gram
  (n = max..1) in prompt + output, as a chain; training-free.
- NoCandidates: the root alone, i.e. plain decoding.
- MergedCandidates: several sources in one tree; FallbackCandidates: the first source that proposes anything.
- lookup_with_heads: prompt lookup and draft heads together, trusting the lookup by the length of its match.
"""

from __future__ import annotations

import copy
import warnings

import torch

from .source import CandidateSource, follows_features
from .tree import TreeBuffers, build_tree_buffers, chain_tree, check_tree_fits, default_medusa_tree


class NoCandidates(CandidateSource):
    """Plain decoding: one token per base forward."""

    def __init__(self, device="cpu"):
        self.buffers = build_tree_buffers([], num_heads=0, top_k=1).to(device)

    def propose(self, root: int, hidden: torch.Tensor, context: list[int]):
        return torch.tensor([root], device=self.buffers.depths.device), self.buffers


class MedusaCandidates(CandidateSource):
    """Medusa heads + a static tree of rank paths."""

    def __init__(self, heads, tree, lm_head, device="cpu"):
        tree = [tuple(path) for path in tree]
        check_tree_fits(tree, heads.config.num_heads, heads.config.projected_vocab_size)  # ranks within top-k's reach
        self.heads = heads
        self.lm_head = lm_head
        self.top_k = max((max(path) for path in tree), default=0) + 1
        self.buffers: TreeBuffers = build_tree_buffers(tree, heads.config.num_heads, self.top_k).to(device)
        self.depth = int(self.buffers.depths.max())
        self._root = torch.zeros(1, dtype=torch.long, device=device)

    @classmethod
    def for_model(cls, model, heads, tree=None) -> "MedusaCandidates":
        """The heads on the model's device and dtype with `tree`, else the tree stored with the heads, else (heads
        that carry none, e.g. a published FasterDecoding folder) Medusa's default cut to their heads, with a warning."""
        if tree is None:
            tree = heads.metadata.get("tree")
            if tree is None:
                tree = default_medusa_tree(heads.config.num_heads, heads.config.projected_vocab_size)
                warnings.warn(f"the heads carry no tree: using Medusa's default (mc_sim_7b_63) cut to their "
                              f"{heads.config.num_heads} heads, {len(tree)} nodes; pass tree= / --tree, or build one "
                              f"for them with scripts/build_tree.py", stacklevel=2)
        heads.to(device=model.device, dtype=model.dtype).eval()
        return cls(heads, tree, model.get_output_embeddings(), model.device)

    def propose(self, root: int, hidden: torch.Tensor, context: list[int]):
        if self.depth == 0:
            return torch.tensor([root], device=hidden.device), self.buffers
        head_logits = self.heads(hidden[None], self.lm_head)[: self.depth, 0]  # [D, V]
        top = self.heads.draft_to_token(head_logits.topk(self.top_k, dim=-1).indices.flatten())
        self._root[0] = root
        flat = torch.cat([self._root, top])
        return flat[self.buffers.candidate_index], self.buffers


class PromptLookupCandidates(CandidateSource):
    """Prompt lookup decoding as a candidate source: copy what followed the last n-gram before."""

    def __init__(self, max_ngram: int = 3, num_tokens: int = 10, device="cpu", *, min_ngram: int = 1):
        if not 1 <= min_ngram <= max_ngram or num_tokens < 1:
            raise ValueError(f"prompt lookup needs 1 <= min_ngram <= max_ngram and num_tokens >= 1 "
                             f"(got min_ngram={min_ngram}, max_ngram={max_ngram}, num_tokens={num_tokens})")
        self.max_ngram, self.min_ngram, self.num_tokens, self.device = max_ngram, min_ngram, num_tokens, device
        self._chains = [build_tree_buffers(chain_tree(n), num_heads=n, top_k=1).to(device)
                        for n in range(num_tokens + 1)]

    def lookup(self, context: list[int]) -> list[int]:
        """Tokens after the latest earlier match of the longest trailing n-gram, n = max_ngram..min_ngram
        (empty if none)."""
        for n in range(min(self.max_ngram, len(context) - 1), self.min_ngram - 1, -1):
            tail = context[-n:]
            for start in range(len(context) - n - 1, -1, -1):  # latest match first, excluding the tail itself
                if context[start:start + n] == tail:
                    follow = context[start + n: start + n + self.num_tokens]
                    if follow:
                        return follow
        return []

    def propose(self, root: int, hidden: torch.Tensor, context: list[int]):
        draft = self.lookup(context + [root])
        return torch.tensor([root] + draft, device=self.device), self._chains[len(draft)]


def merge_token_trees(proposals: list[tuple[torch.Tensor, TreeBuffers]]):
    """Union of several trees over the same root, merged where their token paths agree.

    Returns the merged node tokens and buffers (built for this step; children keep first-seen order).
    """
    index: dict[tuple[int, ...], int] = {(): 0}  # token path -> node number in `tokens`
    rank_of: dict[tuple[int, ...], tuple[int, ...]] = {(): ()}  # token path -> rank path in the merged tree
    rank_paths: list[tuple[int, ...]] = []
    tokens = [int(proposals[0][0][0])]
    child_count: dict[int, int] = {}
    for node_tokens, buffers in proposals:
        values = node_tokens.tolist()
        token_path: dict[int, tuple[int, ...]] = {0: ()}
        for node in range(1, buffers.num_nodes):
            path = token_path[int(buffers.parent[node])] + (values[node],)
            token_path[node] = path
            if path not in index:
                parent_index = index[path[:-1]]
                rank = child_count.get(parent_index, 0)
                child_count[parent_index] = rank + 1
                index[path] = len(tokens)
                tokens.append(values[node])
                rank_of[path] = rank_of[path[:-1]] + (rank,)
                rank_paths.append(rank_of[path])
    depth = max((len(p) for p in rank_paths), default=0)
    top_k = max(child_count.values(), default=1)
    merged = build_tree_buffers(rank_paths, num_heads=max(depth, 1), top_k=top_k)
    # build_tree_buffers orders nodes by (depth, ranks); put the tokens in that order
    order = {path: i + 1 for i, path in enumerate(merged.paths)}
    ordered = [tokens[0]] + [0] * len(rank_paths)
    for node_index, path in enumerate(rank_paths, start=1):
        ordered[order[path]] = tokens[node_index]
    return torch.tensor(ordered, device=proposals[0][0].device), merged.to(proposals[0][0].device)


class _CombinedSources(CandidateSource):
    """Shared by the ways of combining sources: per-generation hooks (`begin`) and a feature-level draft's
    `commit` are passed on, so an EAGLE draft keeps following the accepted tokens whichever source proposed
    them; `spawn` copies the combination for one batch row. Sources with their own acceptance rule or verify
    feedback (sps, lookahead) are refused: a combined tree is verified with the standard rules."""

    def __init__(self, *sources: CandidateSource):
        if len(sources) < 2:
            raise ValueError(f"{type(self).__name__} needs at least two sources")
        for source in sources:
            if source.own_acceptance or source.reads_verify_logits:
                raise ValueError(f"{type(source).__name__} brings its own acceptance or verify feedback; "
                                 f"it cannot be combined with other sources")
        if sum(follows_features(s) for s in sources) > 1:
            raise ValueError("at most one feature-level draft (e.g. EAGLE) among combined sources")
        self.stateful = any(s.stateful for s in sources)
        self.copyable = all(s.copyable for s in sources)
        self._use_sources(sources)

    def _use_sources(self, sources) -> None:
        """Also used by spawn: a copy commits to its own copy of the feature-level draft."""
        self.sources = tuple(sources)
        self._feature_source = next((s for s in self.sources if follows_features(s)), None)
        self.feature_layers = self._feature_source.feature_layers if self._feature_source else ()

    def begin(self, *args) -> None:
        for source in self.sources:
            source.begin(*args)

    def commit(self, tokens, states) -> None:
        self._feature_source.commit(tokens, states)  # called only when feature_layers is not empty

    def spawn(self):
        """A copy for one row of a batch: a feature-level draft inside gets a copy of its own (its own cache);
        stateless sources (heads, prompt lookup) are shared, and so is FallbackCandidates.steps_by_source
        (summed over the rows)."""
        if not self.stateful:
            return self
        for source in self.sources:
            if not source.copyable:
                source.spawn()  # raises, naming the source
        twin = copy.copy(self)
        twin._use_sources(s.spawn() for s in self.sources)
        return twin


class MergedCandidates(_CombinedSources):
    """Several sources in one tree, e.g. Medusa heads plus prompt lookup: one forward verifies both.

    require_first: propose the root alone unless the first source drafts something (the others are not asked),
    e.g. FallbackCandidates(MergedCandidates(lookup, few_heads_nodes, require_first=True), full_heads_tree):
    a lookup match plus a few head nodes, else the heads' whole tree."""

    def __init__(self, *sources, require_first: bool = False):
        super().__init__(*sources)
        self.require_first = require_first

    def propose(self, root: int, hidden: torch.Tensor, context: list[int]):
        first = self.sources[0].propose(root, hidden, context)
        if self.require_first and first[1].num_nodes == 1:
            return first
        proposals = [first] + [source.propose(root, hidden, context) for source in self.sources[1:]]
        drafting = [p for p in proposals if p[1].num_nodes > 1]  # a root-only tree adds nothing to a union
        if len(drafting) <= 1:  # one source's tree as it is (a static tree keeps its prebuilt buffers)
            return drafting[0] if drafting else first
        return merge_token_trees(drafting)


class FallbackCandidates(_CombinedSources):
    """The first source's tree when it proposes any token, else the next source's (e.g. prompt lookup, and the
    heads only where lookup finds nothing).

    Where verifying a token costs time (a small model on a CPU), a prompt-lookup chain that matched is usually
    worth more than a heads tree merged into it, and skipping the heads' drafting saves their time too. A
    feature-level draft (EAGLE) is still committed every step, so it can take over at any step."""

    def __init__(self, *sources):
        super().__init__(*sources)
        self.steps_by_source = [0] * len(sources)  # trees verified per source, summed over generations and rows

    def propose(self, root: int, hidden: torch.Tensor, context: list[int]):
        for i, source in enumerate(self.sources):
            tokens, buffers = source.propose(root, hidden, context)
            if buffers.num_nodes > 1 or i == len(self.sources) - 1:
                self.steps_by_source[i] += 1
                return tokens, buffers


def lookup_with_heads(heads, trusted_ngram: int = 2, trusted_tokens: int = 16, short_match_tokens: int = 6,
                      max_ngram: int = 3, device="cpu") -> FallbackCandidates:
    """Prompt lookup with draft heads (Medusa's or an EAGLE draft's tree), the lookup trusted by its match length.

    A lookup that matched the last `trusted_ngram`.. `max_ngram` tokens is verified alone, as a chain of up to
    `trusted_tokens`: such copies tend to run long, and the heads' tree would only add verify cost. A match on
    fewer tokens (one, by default) guesses right less often than the heads, so its shorter chain
    (`short_match_tokens`) is merged with the heads' tree; with no match at all the heads' tree is verified alone.
    On SmolLM2 this raised τ over "lookup chain whenever it matches, else the heads" (see the README results).
    """
    if not 1 < trusted_ngram <= max_ngram:
        raise ValueError(f"trusted_ngram must be in 2..max_ngram={max_ngram}, got {trusted_ngram}")
    trusted = PromptLookupCandidates(max_ngram, trusted_tokens, device, min_ngram=trusted_ngram)
    short = PromptLookupCandidates(trusted_ngram - 1, short_match_tokens, device)
    return FallbackCandidates(trusted, MergedCandidates(heads, short))

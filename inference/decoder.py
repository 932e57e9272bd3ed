"""Tree-speculative decoding with Medusa heads through the public transformers API.

One step, given the cache of everything accepted so far and the next (root) token:
  1. the heads, run on the hidden state of the last accepted token, propose top-k tokens per
     future position; the static tree picks which combinations to try;
  2. the base model scores every tree node in ONE forward: a 4D attention mask lets each node
     see the prefix and its own ancestors, explicit position ids put it at prefix + depth;
  3. an acceptance rule (acceptance.py) keeps the longest agreeing path plus a bonus token;
  4. the cache keeps only the accepted path (kv_cache.py) and the bonus token becomes the root.
With no heads (or an empty tree) the same loop is plain one-token-at-a-time decoding.
"""

from __future__ import annotations

import inspect
import time
from dataclasses import dataclass, field
from typing import Iterator

import torch
from transformers import DynamicCache, LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from .acceptance import children_lists, lazy_greedy_accept
from .candidates import MedusaCandidates, NoCandidates
from .kv_cache import cache_argument_name, keep_accepted_path, prepare_cache_for_rollback
from .source import CandidateSource, follows_features
from .tree import TreeBuffers, additive_mask
from .verify import accept, follow, position_budget, probabilities


@dataclass
class SamplingConfig:
    temperature: float = 0.0  # 0: greedy
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    acceptance: str = "auto"  # auto (greedy at T=0, lossless at T>0) | greedy | typical | lossless
    typical_epsilon: float = 0.09
    typical_delta: float = 0.3
    seed: int | None = None

    def __post_init__(self):
        if self.acceptance not in ("auto", "greedy", "typical", "lossless"):
            raise ValueError(f"acceptance must be auto, greedy, typical or lossless, got {self.acceptance!r}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")

    @property
    def rule(self) -> str:
        if self.temperature == 0:
            return "greedy"
        return "lossless" if self.acceptance in ("auto", "greedy") else self.acceptance

    def warpers(self) -> LogitsProcessorList:
        """HF's own warpers, in the order `generate` applies them, so sampling matches it exactly."""
        warpers = LogitsProcessorList()
        if self.temperature not in (0.0, 1.0):
            warpers.append(TemperatureLogitsWarper(self.temperature))
        if self.top_k:
            warpers.append(TopKLogitsWarper(top_k=self.top_k))
        if self.top_p < 1.0:
            warpers.append(TopPLogitsWarper(top_p=self.top_p))
        return warpers


@dataclass
class DecodeStats:
    base_forwards: int = 0
    new_tokens: int = 0
    accepted_lengths: list[int] = field(default_factory=list)  # tokens produced by each tree step
    seconds: float = 0.0
    step_seconds: float = 0.0  # tree steps only (prefill excluded)
    verify_seconds: float = 0.0  # of which: the base forward over the tree
    draft_seconds: float = 0.0  # of which: the heads proposing candidates

    @property
    def tau(self) -> float:
        """Tokens per base forward, bonus token included (plain decoding = 1.0)."""
        return self.new_tokens / max(self.base_forwards, 1)

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.seconds if self.seconds else 0.0


class TreeDecoder:
    """Speculative decoding over a candidate tree; the draft comes from a candidate source.

    TreeDecoder(model)                    plain decoding through the same loop
    TreeDecoder(model, heads, tree)       Medusa heads with a static tree (tree defaults to the heads' own)
    TreeDecoder(model, candidates=src)    any source from candidates.py (e.g. prompt lookup)
    """

    def __init__(self, model, heads=None, tree=None, candidates=None):
        self.model = model
        device = model.device
        if candidates is None and heads is not None:
            candidates = MedusaCandidates.for_model(model, heads, tree)
        self.candidates: CandidateSource = candidates or NoCandidates(device)
        self._commits = follows_features(self.candidates)
        self._cache_argument = cache_argument_name(model)
        parameters = inspect.signature(model.forward).parameters
        # The prefill needs logits at the last prompt position only.
        self._last_logits_only = {"logits_to_keep": 1} if "logits_to_keep" in parameters else {}
        # Greedy steps can skip the lm_head over the tree (lazy_greedy_accept projects one path) where the model
        # can return no logits and its lm_head is a plain Linear; sources that read every node's logits opt out.
        lm_head = model.get_output_embeddings()
        self._lazy_lm_head = lm_head if ("logits_to_keep" in parameters and isinstance(lm_head, torch.nn.Linear)
                                         and not self.candidates.reads_verify_logits) else None
        self._no_logits = {"logits_to_keep": torch.empty(0, dtype=torch.long, device=device)}
        self.stats = DecodeStats()

    # ---- pieces of a step -----------------------------------------------------------------

    def _forward(self, input_ids, position_ids, attention_mask, cache, **kwargs):
        out = self.model(input_ids=input_ids, position_ids=position_ids, attention_mask=attention_mask,
                         use_cache=True, output_hidden_states=True, **{self._cache_argument: cache}, **kwargs)
        self.stats.base_forwards += 1
        # Feature-level drafts (EAGLE) read hidden states of chosen layers at the accepted positions.
        self._features = [out.hidden_states[i][0] for i in self.candidates.feature_layers]
        return out.logits[0], out.hidden_states[-1][0]


    def _tree_parts(self, buffers: TreeBuffers):
        """Additive tree mask and children lists, kept on the buffers so a static tree builds them once
        (and a per-step tree, e.g. a merged one, is freed with its buffers)."""
        key = (self.model.dtype, self.model.device)
        parts = getattr(buffers, "_verify_parts", None)
        if parts is None or parts[0] != key:
            mask = additive_mask(buffers.attention_mask.to(self.model.device), self.model.dtype)
            parts = buffers._verify_parts = (key, mask, children_lists(buffers))
        return parts[1], parts[2]

    def _tree_attention_mask(self, tree_mask: torch.Tensor, prefix_length: int) -> torch.Tensor:
        """[1, 1, N, prefix + N]: every node sees the whole prefix, then its ancestors and itself."""
        prefix = torch.zeros((tree_mask.shape[0], prefix_length), dtype=tree_mask.dtype, device=tree_mask.device)
        return torch.cat([prefix, tree_mask], dim=1)[None, None]

    # ---- generation -----------------------------------------------------------------------

    @torch.inference_mode()
    def generate(self, input_ids: torch.Tensor, max_new_tokens: int, sampling: SamplingConfig | None = None,
                 eos_token_ids=()) -> Iterator[list[int]]:
        """Yield lists of new token ids as they are accepted; stop at EOS or max_new_tokens."""
        sampling = sampling or SamplingConfig()
        rule = sampling.rule
        warpers = sampling.warpers()  # built once per generation, not per step
        generator = None
        if rule != "greedy":
            generator = torch.Generator(device=self.model.device)
            generator.manual_seed(sampling.seed if sampling.seed is not None else torch.seed())
        eos = set(int(t) for t in eos_token_ids)
        self.stats = stats = DecodeStats()
        start = time.perf_counter()
        input_ids = input_ids.to(self.model.device)
        cache = DynamicCache(config=self.model.config)
        prepare_cache_for_rollback(cache)
        self.candidates.begin(sampling, warpers, generator)  # sources with per-generation state or own sampling

        # Prefill: the prompt's last position gives the first token and the heads' first guesses.
        length = input_ids.shape[1]
        max_new_tokens = position_budget(self.model, length, max_new_tokens)
        positions = torch.arange(length, device=input_ids.device)[None]
        logits, hidden = self._forward(input_ids, positions, None, cache, **self._last_logits_only)
        if rule == "greedy":
            root = int(logits[-1].argmax())
        else:
            root = int(torch.multinomial(probabilities(logits[-1:], warpers)[0], 1, generator=generator))
        last_hidden = hidden[-1]
        if self._commits:  # a feature-level draft reads the prompt: every position's states
            self.candidates.commit(input_ids[0, 1:].tolist() + [root], self._features)
        stats.draft_seconds = 0.0  # per-step figures count tree steps only
        context = input_ids[0].tolist()  # everything in the cache, for sources that look back
        produced = 0
        pending = [root]
        while True:
            # Emit what the last step accepted (its bonus token is the next root).
            emit = pending[: max_new_tokens - produced]
            stop = False
            for i, token in enumerate(emit):
                if token in eos:
                    emit, stop = emit[: i + 1], True
                    break
            produced += len(emit)
            stats.new_tokens = produced
            stats.seconds = time.perf_counter() - start
            if emit:
                yield emit
            if stop or produced >= max_new_tokens:
                return

            step_start = time.perf_counter()
            tokens, buffers = self.candidates.propose(root, last_hidden, context)
            tree_mask, children = self._tree_parts(buffers)
            verify_start = time.perf_counter()
            positions = (length + buffers.depths)[None]
            lazy = rule == "greedy" and self._lazy_lm_head is not None
            logits, hidden = self._forward(tokens[None], positions, self._tree_attention_mask(tree_mask, length), cache,
                                           **(self._no_logits if lazy else {}))
            if lazy:  # greedy from the hidden states; the path's logits count as part of the tree forward
                accepted, bonus = lazy_greedy_accept(tokens, hidden, self._lazy_lm_head, buffers, children)
                verify_end = time.perf_counter()
            else:
                verify_end = time.perf_counter()
                accepted, bonus = accept(rule, self.candidates, tokens, logits, buffers, children, sampling, warpers,
                                         generator)
            if self.candidates.reads_verify_logits:  # sources that learn from the verify forward
                self.candidates.observe(logits, accepted)
            keep_accepted_path(cache, buffers.num_nodes, accepted)
            length += len(accepted)
            last_hidden = hidden[accepted[-1]]
            context.append(root)
            follow_start = time.perf_counter()
            pending = follow(self.candidates, tokens, accepted, bonus, self._features)
            if self._commits:  # drafting work, though it runs after verify
                stats.draft_seconds += time.perf_counter() - follow_start
            context.extend(pending[:-1])
            root = bonus
            stats.accepted_lengths.append(len(pending))
            stats.step_seconds += time.perf_counter() - step_start
            stats.verify_seconds += verify_end - verify_start
            stats.draft_seconds += verify_start - step_start

    def generate_ids(self, input_ids, max_new_tokens, sampling=None, eos_token_ids=()) -> list[int]:
        return [t for chunk in self.generate(input_ids, max_new_tokens, sampling, eos_token_ids) for t in chunk]

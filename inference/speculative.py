"""Draft-model speculative sampling (Leviathan et al. 2211.17192) as a candidate source.

A draft model with the target's tokenizer proposes γ tokens one by one from its own KV cache; the
target scores the chain in one forward (a chain is a tree, so TreeDecoder verifies it). At T=0
drafts are the draft's argmax and greedy acceptance keeps the agreeing prefix; at T>0 drafts are
sampled from the draft's warped distribution q and `speculative_accept` applies min(1, p/q) with the
residual norm(max(0, p − q)), so the output is distributed exactly as sampling the target.

γ is fixed, or "auto": after every step the measured acceptance rate α and cost ratio c (one draft
forward ÷ one verify forward) pick the γ maximising (1 − α^{γ+1}) / ((1 − α)(γc + 1)).

`self_draft(model, n)` gives every target an offline draft: its first n layers, final norm and
lm_head, sharing the weights (an early exit; no training, so α is modest).
"""

from __future__ import annotations

import copy
import time
from collections import OrderedDict

import torch
from torch import nn
from transformers import DynamicCache

from .acceptance import speculative_accept
from .kv_cache import cache_argument_name, prepare_cache_for_rollback
from .source import CandidateSource
from .tree import build_tree_buffers, chain_tree


def self_draft(model, num_layers: int):
    """The target's first `num_layers` decoder layers + final norm + lm_head as a model of its own class.

    The modules are shared (no copy of weights); the config and generation config are copies, so the
    draft can be handed to HF's assisted generation. The draft's top modules carry no hooks, so a
    forward hook on the target (bench.py counts base forwards that way) does not count draft forwards.
    """
    inner_name = getattr(model, "base_model_prefix", "model")
    inner = getattr(model, inner_name)
    total = len(inner.layers)
    if not 1 <= num_layers <= total:
        raise ValueError(f"num_layers must be in 1..{total}, got {num_layers}")
    config = copy.deepcopy(model.config)
    config.num_hidden_layers = num_layers
    if getattr(config, "layer_types", None) is not None:
        config.layer_types = config.layer_types[:num_layers]

    def shallow(module: nn.Module) -> nn.Module:
        clone = copy.copy(module)  # shares parameters through the (copied) child dicts below
        clone._modules = OrderedDict(module._modules)
        for name, value in vars(module).items():
            if name.endswith("hooks") or name.endswith("hooks_always_called") or name.endswith("hooks_with_kwargs"):
                setattr(clone, name, type(value)())  # fresh, empty hook tables
        clone.config = config
        return clone

    draft_inner = shallow(inner)
    draft_inner.layers = nn.ModuleList(inner.layers[:num_layers])
    draft = shallow(model)
    setattr(draft, inner_name, draft_inner)
    draft.generation_config = copy.deepcopy(model.generation_config)
    return draft


def expected_tokens_per_step(alpha: float, gamma: int) -> float:
    """E[tokens per target forward] = (1 − α^{γ+1}) / (1 − α), bonus included (Leviathan Eq. 1)."""
    if alpha >= 1.0:
        return gamma + 1.0
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def best_gamma(alpha: float, cost_ratio: float, max_gamma: int) -> int:
    """The γ in 1..max_gamma maximising the expected speedup (1 − α^{γ+1}) / ((1 − α)(γc + 1))."""
    return max(range(1, max_gamma + 1),
               key=lambda g: expected_tokens_per_step(alpha, g) / (g * cost_ratio + 1.0))


class DraftModelCandidates(CandidateSource):
    """A draft model proposing a chain of γ tokens from its own KV cache (cropped on rejection).

    The cache is kept in step with the decoder's context by longest common prefix, so rejected
    drafts are cropped and accepted ones are not recomputed. Records α (mean Σ min(p, q) over the
    drafted positions; 1[argmax p = draft] at T=0) and c, which drive γ="auto".
    """

    stateful, reads_verify_logits, own_acceptance, copyable = True, True, True, False

    def __init__(self, draft_model, gamma: int | str = 4, max_gamma: int = 8, device="cpu"):
        if gamma != "auto" and (not isinstance(gamma, int) or gamma < 1):
            raise ValueError(f"gamma must be a positive int or 'auto', got {gamma!r}")
        self.draft = draft_model.eval()
        self._cache_argument = cache_argument_name(draft_model)
        self.adaptive = gamma == "auto"
        self.max_gamma = max_gamma if self.adaptive else gamma
        self.gamma = min(4, self.max_gamma) if self.adaptive else gamma
        self.device = device
        self._chains = [build_tree_buffers(chain_tree(n), num_heads=max(n, 1), top_k=1).to(device)
                        for n in range(self.max_gamma + 1)]
        # measured over the decoder's lifetime (scripts/sps_alpha.py reads them)
        self.alpha_sum = 0.0  # Σ over drafted positions of Σ_x min(p(x), q(x))
        self.alpha_count = 0
        self.draft_seconds = self.verify_seconds = 0.0
        self.draft_forwards = self.verify_forwards = 0
        self.begin(None, None, None)

    # ---- measurements -------------------------------------------------------------------------

    @property
    def alpha(self) -> float:
        return (self.alpha_sum + 1.0) / (self.alpha_count + 2.0)  # Laplace prior: 0.5 before any data

    @property
    def cost_ratio(self) -> float:
        if not self.draft_forwards or not self.verify_forwards:
            return 0.3
        return (self.draft_seconds / self.draft_forwards) / (self.verify_seconds / self.verify_forwards)

    # ---- the decoder's hooks ------------------------------------------------------------------

    def begin(self, sampling, warpers, generator):
        """New generation: fresh draft cache; sample drafts from warped q unless decoding greedily."""
        self.greedy = sampling is None or sampling.rule == "greedy"
        self.warpers, self.generator = warpers, generator
        self.cache = DynamicCache(config=self.draft.config)
        prepare_cache_for_rollback(self.cache)
        self.cached: list[int] = []
        self._draft_tokens = self._draft_probs = None

    def _sync(self, sequence: list[int]) -> list[int]:
        """Crop the draft cache to its common prefix with `sequence`; return the tokens still to feed."""
        common = 0
        for cached, token in zip(self.cached, sequence):
            if cached != token:
                break
            common += 1
        keep = min(common, len(sequence) - 1)  # feed at least one token to get the next distribution
        if keep < len(self.cached):
            self.cache.crop(keep - len(self.cached))  # transformers takes the count to drop, negated
            del self.cached[keep:]
        return sequence[keep:]

    @torch.inference_mode()
    def propose(self, root: int, hidden: torch.Tensor, context: list[int]):
        start = time.perf_counter()
        feed = self._sync(context + [root])
        drafted, probs = [], []
        for _ in range(self.gamma):
            position = len(self.cached)
            ids = torch.tensor([feed], device=self.device)
            positions = torch.arange(position, position + len(feed), device=self.device)[None]
            logits = self.draft(input_ids=ids, position_ids=positions, use_cache=True, logits_to_keep=1,
                                **{self._cache_argument: self.cache}).logits[0, -1:].float()
            self.cached.extend(feed)
            if self.greedy:
                token = int(logits[0].argmax())
            else:
                q = torch.softmax(self.warpers(None, logits), dim=-1)[0]
                token = int(torch.multinomial(q, 1, generator=self.generator))
                probs.append(q)
            drafted.append(token)
            feed = [token]
        self._draft_tokens = drafted
        self._draft_probs = torch.stack(probs) if probs else None
        self.draft_forwards += len(drafted)
        self.draft_seconds += time.perf_counter() - start
        self._verify_start = time.perf_counter()
        return torch.tensor([root] + drafted, device=self.device), self._chains[len(drafted)]

    def lossless_accept(self, tokens, probs, children, generator=None):
        """Leviathan's rule with the draft's q (TreeDecoder calls this instead of the point-mass rule)."""
        count, bonus = speculative_accept(tokens[1:], self._draft_probs, probs, generator)
        return torch.arange(count + 1, device=tokens.device), bonus

    def observe(self, logits: torch.Tensor, accepted: torch.Tensor):
        """Measure α on every drafted position and c on this step, then choose the next γ."""
        self.verify_seconds += time.perf_counter() - self._verify_start
        self.verify_forwards += 1
        gamma = len(self._draft_tokens)
        if self.greedy:
            agree = logits[:gamma].argmax(dim=-1).cpu() == torch.tensor(self._draft_tokens)
            self.alpha_sum += float(agree.sum())
        else:
            p = torch.softmax(self.warpers(None, logits[:gamma].float()), dim=-1).double()
            self.alpha_sum += float(torch.minimum(p, self._draft_probs.double()).sum())
        self.alpha_count += gamma
        if self.adaptive:
            self.gamma = best_gamma(self.alpha, self.cost_ratio, self.max_gamma)

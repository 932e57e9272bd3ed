"""Decoding methods by name: the one place a name becomes a decoder.

chat.py, SpeculativeGenerator, the benchmark (single-row and batched), build_tree.py and tune_eagle_tree.py all
build their decoders here, with one set of options (`MethodOptions`, filled from the command line by
`add_method_arguments` / `options_from_args`). Adding a method is one `register` call and its tests.

A method is either ours (`source`: a candidate source for TreeDecoder / BatchedTreeDecoder, None = plain
decoding) or a peer run through HF `generate` (`hf`: the extra `generate` arguments). `draft` says what it
decodes with: None (the base alone), "medusa" heads, an EAGLE draft of a variant ("eagle1", "eagle3"), or a
"dflash" block drafter.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from typing import Callable

from specheads.heads.kinds import kind_of

from .candidates import (FallbackCandidates, MedusaCandidates, MergedCandidates, PromptLookupCandidates,
                         lookup_with_heads)
from .cli import int_at_least, int_or_auto, min_prob, positive_int, tree_json
from .dflash import DFlashCandidates
from .eagle import EagleCandidates, SampledEagleCandidates
from .lookahead import LookaheadCandidates
from .source import CandidateSource
from .speculative import DraftModelCandidates, self_draft

PLD_COMBINE = ("by-match", "first", "merge")


@dataclass
class MethodOptions:
    """Every setting a method reads; one name each, whichever tool builds the method."""
    tree: list | None = None  # Medusa, DFlash: rank paths of the static tree; None = the tree stored with the heads
    # (DFlash without one: the chain of top-1 tokens)
    eagle_tree: dict = field(default_factory=dict)  # EAGLE-2 tree: top_k / depth / total_tokens / min_prob overrides
    eagle_sample: dict = field(default_factory=dict)  # *_sampled: top_k / width / depth overrides
    pld_tokens: int = 10  # prompt-lookup chain length (pld, hf_prompt_lookup, *_pld with combine first / merge)
    pld_combine: str = "by-match"  # *_pld: how lookup and the draft share a step (see with_lookup)
    pld_trusted_ngram: int = 2
    pld_trusted_tokens: int = 16
    pld_heads_tree: list | None = None  # medusa_pld with combine first: head nodes merged with a matching chain
    draft_layers: int | None = None  # sps / hf_assisted self-draft depth; None = a quarter of the base's layers
    gamma: int | str = "auto"
    lookahead_window: int = 5
    lookahead_ngram: int = 4
    lookahead_pool: int = 5

    def __post_init__(self):
        if self.pld_combine not in PLD_COMBINE:
            raise ValueError(f"pld_combine must be one of {', '.join(PLD_COMBINE)}, got {self.pld_combine!r}")
        if self.pld_heads_tree is not None and self.pld_combine != "first":
            raise ValueError("pld_heads_tree (--pld-heads-tree) goes with pld_combine 'first' (--pld-combine first)")


class Context:
    """What a method is built from: the base, the draft it decodes with (or None) and the options. The
    self-draft of sps / hf_assisted is built once per context, so both share it."""

    def __init__(self, model, draft=None, options: MethodOptions | None = None):
        self.model, self.draft, self.options = model, draft, options or MethodOptions()
        self._self_draft = None

    @property
    def device(self):
        return self.model.device

    @property
    def self_draft(self):
        """The base's first draft_layers layers + norm + lm_head, weights shared; not hooked by the base's
        forward counters, so its forwards do not count in τ."""
        if self._self_draft is None:
            layers = self.options.draft_layers or max(1, self.model.config.num_hidden_layers // 4)
            self._self_draft = self_draft(self.model, layers)
        return self._self_draft


@dataclass(frozen=True)
class Method:
    name: str
    help: str
    draft: str | None = None  # None | "medusa" | "eagle1" | "eagle3" | "dflash"
    source: Callable[[Context], CandidateSource | None] | None = None  # ours
    hf: Callable[[Context], dict] | None = None  # a peer through HF generate: extra generate() arguments
    batched: bool = False  # our batched decoder takes it (greedy)

    @property
    def ours(self) -> bool:
        return self.hf is None


METHODS: dict[str, Method] = {}


def register(name: str, help: str, **kwargs) -> Method:
    if name in METHODS:
        raise ValueError(f"method {name!r} is registered twice")
    METHODS[name] = method = Method(name, help, **kwargs)
    return method


def get_method(name: str) -> Method:
    try:
        return METHODS[name]
    except KeyError:
        raise ValueError(f"unknown method {name!r}; choose from {', '.join(METHODS)}") from None


# ---- the sources ---------------------------------------------------------------------------------------

def medusa_source(ctx: Context, tree=None) -> MedusaCandidates:
    """The heads' top-k placed by a static tree: `tree`, else options.tree, else the one stored with the heads."""
    return MedusaCandidates.for_model(ctx.model, ctx.draft, tree if tree is not None else ctx.options.tree)


def eagle_source(ctx: Context) -> EagleCandidates:
    """An EAGLE draft's dynamic tree: the settings stored with the draft, overridden by options.eagle_tree."""
    stored = ctx.draft.metadata.get("eagle_tree", {})
    return EagleCandidates(ctx.draft, ctx.model, **{**stored, **ctx.options.eagle_tree})


def sampled_eagle_source(ctx: Context) -> SampledEagleCandidates:
    """An EAGLE draft whose children are sampled from its distribution at T > 0 (options.eagle_sample)."""
    return SampledEagleCandidates(ctx.draft, ctx.model, **ctx.options.eagle_sample)


def dflash_source(ctx: Context) -> DFlashCandidates:
    """A DFlash drafter's block, one forward per step: options.tree, else the tree stored with it, else the chain."""
    return DFlashCandidates.for_model(ctx.model, ctx.draft, ctx.options.tree)


def with_lookup(draft_source: CandidateSource, ctx: Context, heads_on_match: CandidateSource | None = None):
    """A draft's source and prompt lookup as one source, combined as options.pld_combine says:
    by-match: a lookup chain alone when its match is long enough to trust, a short match merged with the draft's
    tree, else the draft's tree (candidates.lookup_with_heads); first: the lookup chain whenever it matches
    (merged with heads_on_match if given), else the draft's tree; merge: both in one tree every step."""
    o, device = ctx.options, ctx.device
    if o.pld_combine == "by-match":
        return lookup_with_heads(draft_source, o.pld_trusted_ngram, o.pld_trusted_tokens, device=device)
    lookup = PromptLookupCandidates(max_ngram=3, num_tokens=o.pld_tokens, device=device)
    if o.pld_combine == "merge":
        return MergedCandidates(draft_source, lookup)
    if heads_on_match is not None:
        return FallbackCandidates(MergedCandidates(lookup, heads_on_match, require_first=True), draft_source)
    return FallbackCandidates(lookup, draft_source)


def _medusa_pld(ctx: Context):
    small = medusa_source(ctx, ctx.options.pld_heads_tree) if ctx.options.pld_heads_tree else None
    return with_lookup(medusa_source(ctx), ctx, small)


def _prompt_lookup(ctx: Context):
    return PromptLookupCandidates(3, ctx.options.pld_tokens, ctx.device)


def _lookahead(ctx: Context):
    o = ctx.options
    return LookaheadCandidates(o.lookahead_window, o.lookahead_ngram, o.lookahead_pool, ctx.device)


def _sps(ctx: Context):
    return DraftModelCandidates(ctx.self_draft, ctx.options.gamma, device=ctx.device)


# ---- the registry ---------------------------------------------------------------------------------------

register("baseline", "HF generate: greedy or sampling, the reference", hf=lambda ctx: {})
register("hf_unpacked", "HF generate on stock PyTorch linears (without the CPU verify tuning's packed weights)",
         hf=lambda ctx: {})
register("prompt_lookup", "HF prompt lookup decoding (pld_tokens)",
         hf=lambda ctx: {"prompt_lookup_num_tokens": ctx.options.pld_tokens})
register("hf_prompt_lookup", "= prompt_lookup", hf=lambda ctx: {"prompt_lookup_num_tokens": ctx.options.pld_tokens})
register("hf_assisted", "HF generate with the self-draft (draft_layers) as assistant_model",
         hf=lambda ctx: {"assistant_model": ctx.self_draft})
register("plain", "our decoder without a draft: one token per forward", source=lambda ctx: None, batched=True)
register("pld", "prompt lookup as a candidate source of our decoder", source=_prompt_lookup, batched=True)
register("sps", "draft-model speculative sampling: the base's first draft_layers layers as draft, γ fixed or auto",
         source=_sps)
register("lookahead", "lookahead decoding: Jacobi window W, n-grams N, pool G", source=_lookahead)
register("medusa", "Medusa heads with their static tree", draft="medusa", source=medusa_source, batched=True)
register("medusa_pld", "Medusa heads with prompt lookup (pld_combine)", draft="medusa", source=_medusa_pld,
         batched=True)
register("eagle2", "an EAGLE-1 draft with an EAGLE-2 dynamic tree", draft="eagle1", source=eagle_source, batched=True)
register("eagle2_pld", "eagle2 with prompt lookup (pld_combine)", draft="eagle1",
         source=lambda ctx: with_lookup(eagle_source(ctx), ctx), batched=True)
register("eagle3", "an EAGLE-3 draft with an EAGLE-2 dynamic tree", draft="eagle3", source=eagle_source, batched=True)
register("eagle3_pld", "eagle3 with prompt lookup (pld_combine)", draft="eagle3",
         source=lambda ctx: with_lookup(eagle_source(ctx), ctx), batched=True)
register("eagle2_sampled", "an EAGLE-1 draft whose tree children are sampled from it at T > 0 (exact rejection "
         "sampling without replacement)", draft="eagle1", source=sampled_eagle_source)
register("eagle3_sampled", "an EAGLE-3 draft whose tree children are sampled from it at T > 0 (exact rejection "
         "sampling without replacement)", draft="eagle3", source=sampled_eagle_source)
register("dflash", "a DFlash block drafter: one forward drafts the block; the top-1 chain or a static tree (--tree)",
         draft="dflash", source=dflash_source, batched=True)
register("dflash_pld", "dflash with prompt lookup (pld_combine)", draft="dflash",
         source=lambda ctx: with_lookup(dflash_source(ctx), ctx), batched=True)


def draft_kind(draft) -> str | None:
    """What a loaded draft is, in Method.draft's terms (heads.kinds)."""
    return None if draft is None else kind_of(draft).name


def method_for(draft, prompt_lookup: bool = False) -> str:
    """The method that decodes with this draft (None: none), with prompt lookup or not (chat.py's choice)."""
    name = "plain" if draft is None else kind_of(draft).method
    if prompt_lookup:
        return "pld" if name == "plain" else name + "_pld"
    return name


def build_source(name: str, model, draft=None, options: MethodOptions | None = None,
                 context: Context | None = None) -> CandidateSource | None:
    """The candidate source of one of our methods (None: plain decoding), checked against its draft."""
    method = get_method(name)
    if not method.ours:
        raise ValueError(f"{name} runs through HF generate; it has no candidate source")
    kind = draft_kind(draft)
    if method.draft is not None and kind != method.draft:
        raise ValueError(f"method {name} decodes with a {method.draft} draft, got {kind or 'none'}")
    if method.draft is None and draft is not None:
        raise ValueError(f"method {name} takes no draft")
    if draft is not None and kind_of(draft).chain == "dynamic" and (options or MethodOptions()).tree is not None:
        raise ValueError("a static tree (--tree) is for Medusa heads; an EAGLE draft grows its own: set it with "
                         "top_k / depth / total_tokens / min_prob (--eagle-top-k, ...)")
    ctx = context or Context(model, draft, options)
    return method.source(ctx)


def build_decoder(name: str, model, draft=None, options: MethodOptions | None = None, *, batched: bool = False):
    """TreeDecoder (or, batched, BatchedTreeDecoder) for one of our methods."""
    from .batched import BatchedTreeDecoder
    from .decoder import TreeDecoder

    if batched and not get_method(name).batched:
        raise ValueError(f"method {name} has no batched decoder; batched: "
                         f"{', '.join(n for n, m in METHODS.items() if m.batched)}")
    source = build_source(name, model, draft, options)
    return (BatchedTreeDecoder if batched else TreeDecoder)(model, candidates=source)


# ---- the command line --------------------------------------------------------------------------------------

def add_method_arguments(parser: argparse.ArgumentParser) -> None:
    """Every MethodOptions setting as a flag, the same name in every tool."""
    g = parser.add_argument_group("decoding methods")
    g.add_argument("--tree", type=tree_json, default=None,
                   help="Medusa, DFlash: JSON list of rank paths; default: the tree stored with the heads "
                        "(DFlash without one: the top-1 chain)")
    g.add_argument("--eagle-top-k", dest="eagle_top_k", type=positive_int, default=None,
                   help="EAGLE-2 tree: children kept per expanded node")
    g.add_argument("--eagle-depth", dest="eagle_depth", type=positive_int, default=None,
                   help="EAGLE-2 tree: draft steps")
    g.add_argument("--eagle-tokens", dest="eagle_tokens", type=int_at_least(2), default=None,
                   help="EAGLE-2 tree: nodes verified per step (the root included)")
    g.add_argument("--eagle-min-prob", dest="eagle_min_prob", type=min_prob, default=None,
                   help="EAGLE-2 tree: leave out nodes whose cumulative draft probability is below this")
    g.add_argument("--eagle-sample-k", dest="eagle_sample_k", type=positive_int, default=None,
                   help="eagle*_sampled: children drawn per expanded node (default 2)")
    g.add_argument("--eagle-sample-width", dest="eagle_sample_width", type=positive_int, default=None,
                   help="eagle*_sampled: nodes expanded per level (default 1)")
    g.add_argument("--eagle-sample-depth", dest="eagle_sample_depth", type=positive_int, default=None,
                   help="eagle*_sampled: draft steps (default 4)")
    for old, new, kind in (("--tree-top-k", "eagle_top_k", positive_int), ("--tree-depth", "eagle_depth", positive_int),
                           ("--tree-tokens", "eagle_tokens", int_at_least(2)), ("--tree-min-prob", "eagle_min_prob", min_prob)):
        g.add_argument(old, dest=new, type=kind, default=None, help=argparse.SUPPRESS)  # chat.py's former names
    g.add_argument("--pld-tokens", type=positive_int, default=10,
                   help="prompt-lookup draft length (pld, prompt_lookup, *_pld with --pld-combine first/merge)")
    g.add_argument("--pld-combine", choices=PLD_COMBINE, default="by-match",
                   help="*_pld: by-match = a lookup chain of --pld-trusted-tokens alone when its match is >= "
                        "--pld-trusted-ngram tokens long, a shorter match's chain merged with the draft's tree, else "
                        "the draft's tree (inference/candidates.lookup_with_heads); first = the --pld-tokens chain "
                        "whenever it matches, else the draft's tree; merge = both in one tree every step")
    g.add_argument("--pld-trusted-ngram", type=positive_int, default=2, help="--pld-combine by-match: see there")
    g.add_argument("--pld-trusted-tokens", type=positive_int, default=16, help="--pld-combine by-match: see there")
    g.add_argument("--pld-heads-tree", type=tree_json, default=None,
                   help="medusa_pld with --pld-combine first: JSON rank paths of the heads merged with the lookup "
                        "chain when it matches (default: the chain alone)")
    g.add_argument("--draft-layers", type=positive_int, default=None,
                   help="layers of the self-speculative draft (sps, hf_assisted); default: a quarter of the base's")
    g.add_argument("--gamma", type=int_or_auto, default="auto",
                   help="sps draft length: an int or 'auto' (from measured α and cost)")
    g.add_argument("--lookahead-window", type=positive_int, default=5, help="lookahead W")
    g.add_argument("--lookahead-ngram", type=int_at_least(2), default=4, help="lookahead N")
    g.add_argument("--lookahead-pool", type=positive_int, default=5, help="lookahead G (n-grams verified per step)")


def eagle_tree_options(top_k: int | None = None, depth: int | None = None, total_tokens: int | None = None,
                       min_prob: float | None = None) -> dict:
    """The EAGLE-2 tree settings a user gave (None = keep the draft's stored or default value)."""
    given = {"top_k": top_k, "depth": depth, "total_tokens": total_tokens, "min_prob": min_prob}
    return {key: value for key, value in given.items() if value is not None}


def options_from_args(args) -> MethodOptions:
    """MethodOptions from a parser that add_method_arguments filled (a ValueError names the flag)."""
    if args.pld_heads_tree and args.pld_combine != "first":
        raise ValueError("--pld-heads-tree goes with --pld-combine first")
    gamma = args.gamma if args.gamma == "auto" else int(args.gamma)
    return MethodOptions(
        tree=json.loads(args.tree) if args.tree else None,
        eagle_tree=eagle_tree_options(args.eagle_top_k, args.eagle_depth, args.eagle_tokens, args.eagle_min_prob),
        eagle_sample={key: value for key, value in (("top_k", args.eagle_sample_k), ("width", args.eagle_sample_width),
                                                     ("depth", args.eagle_sample_depth)) if value is not None},
        pld_tokens=args.pld_tokens, pld_combine=args.pld_combine, pld_trusted_ngram=args.pld_trusted_ngram,
        pld_trusted_tokens=args.pld_trusted_tokens,
        pld_heads_tree=json.loads(args.pld_heads_tree) if args.pld_heads_tree else None,
        draft_layers=args.draft_layers, gamma=gamma, lookahead_window=args.lookahead_window,
        lookahead_ngram=args.lookahead_ngram, lookahead_pool=args.lookahead_pool)

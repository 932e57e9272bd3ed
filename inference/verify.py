"""The verify step both decoders share (decoder.TreeDecoder for one row, batched.BatchedTreeDecoder for many).

After the base's forward over a row's tree:
  accept   the acceptance rule keeps the longest agreeing path and draws the bonus token;
  follow   the accepted tokens (bonus last) become what the row emits next, and a feature-level draft is
           handed them with the base's states where they were read (`commit`).
And before decoding, `position_budget`: how many tokens a prompt leaves room for in the model's positions.
"""

from __future__ import annotations

import torch

from .acceptance import greedy_accept, typical_accept
from .source import CandidateSource, follows_features
from .tree import TreeBuffers


class PromptTooLongError(ValueError):
    """A prompt with more tokens than the model has positions."""


def position_budget(model, prompt_length: int, max_new_tokens: int) -> int:
    """max_new_tokens, cut so every token fed sits at a position < the model's limit (the last new token is
    never fed); a PromptTooLongError (a ValueError) if the prompt alone does not fit."""
    limit = getattr(model.config, "max_position_embeddings", None)
    if limit is None:
        return max_new_tokens
    if prompt_length > limit:
        raise PromptTooLongError(f"the prompt has {prompt_length} tokens, more than the model's {limit} positions")
    return min(max_new_tokens, limit - prompt_length + 1)


def probabilities(logits: torch.Tensor, warpers) -> torch.Tensor:
    return torch.softmax(warpers(None, logits.float()), dim=-1)


def accept(rule: str, source: CandidateSource, tokens: torch.Tensor, logits: torch.Tensor, buffers: TreeBuffers,
           children=None, sampling=None, warpers=None, generator=None) -> tuple[torch.Tensor, int]:
    """The accepted path (node indices, root first) and the bonus token, by the rule (greedy | typical | lossless).
    A source whose drafts are sampled (own_acceptance) brings its own exact lossless rule."""
    if rule == "greedy":
        return greedy_accept(tokens, logits, buffers)
    probs = probabilities(logits, warpers)
    if rule == "typical":
        accepted = typical_accept(tokens, probs, buffers, sampling.typical_epsilon, sampling.typical_delta)
        return accepted, int(torch.multinomial(probs[accepted[-1]], 1, generator=generator))
    return source.lossless_accept(tokens, probs, children, generator)


def follow(source: CandidateSource, tokens: torch.Tensor, accepted: torch.Tensor, bonus: int,
           features: list[torch.Tensor]) -> list[int]:
    """The tokens a step produced (the accepted nodes after the root, then the bonus); a feature-level draft
    commits them with its feature layers' states at the accepted nodes (`features`: one [nodes, H] per layer)."""
    produced = tokens[accepted[1:]].tolist() + [bonus]
    if follows_features(source):
        source.commit(produced, [states[accepted] for states in features])
    return produced

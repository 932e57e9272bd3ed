"""Decoding speed measured the fair way on a shared machine: decoders take turns prompt by prompt.

A CPU's speed drifts within a run (by 10-20% over minutes on the machines seen here), so timing one
decoder over every prompt and then the next would credit or blame a decoder for the drift. Tuning
scripts (tree budgets, EAGLE tree shapes) pick their winner from these figures.
"""

from __future__ import annotations

import time

import torch


def synchronize(device) -> None:
    """Wait for the device's queued work (GPUs run kernels asynchronously), so a timer reads the work, not its launch."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def interleaved_speeds(decoders: dict, prompts, max_new_tokens: int, eos_token_ids=(), warmup_tokens: int = 16) -> dict:
    """{name: (tokens/s, τ)} of TreeDecoders over the prompts.

    Every decoder answers a prompt before the next prompt, starting with a different decoder each time (so
    none always runs right after the same neighbour); each decoder first answers the first prompt briefly,
    untimed (first calls allocate and tune kernels)."""
    names = list(decoders)
    for decoder in decoders.values():
        decoder.generate_ids(prompts[0], warmup_tokens, eos_token_ids=eos_token_ids)
    totals = {name: [0, 0, 0.0] for name in names}  # tokens, base forwards, seconds
    for turn, ids in enumerate(prompts):
        shift = turn % len(names)
        for name in names[shift:] + names[:shift]:
            decoder = decoders[name]
            start = time.perf_counter()
            tokens = len(decoder.generate_ids(ids, max_new_tokens, eos_token_ids=eos_token_ids))
            totals[name][2] += time.perf_counter() - start
            totals[name][0] += tokens
            totals[name][1] += decoder.stats.base_forwards
    return {name: (tokens / seconds, tokens / max(forwards, 1)) for name, (tokens, forwards, seconds) in totals.items()}

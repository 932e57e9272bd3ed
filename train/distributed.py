"""Accelerate and DeepSpeed for the trainer: which backend runs, full weights under ZeRO-3, rank checksums,
CPU-only settings and the mixed precision `auto` resolves to."""

from __future__ import annotations

import os

import torch

from specheads.data.models import cpu_supports_bf16
from specheads.train.task import trainable_parameters


def uses_deepspeed(accelerator) -> bool:
    from accelerate.utils import DistributedType

    return accelerator.distributed_type == DistributedType.DEEPSPEED


def partitions_weights(accelerator) -> bool:
    """DeepSpeed ZeRO-3: each rank holds only a slice of every trained weight."""
    return uses_deepspeed(accelerator) and accelerator.state.deepspeed_plugin.zero_stage == 3


def gathered_state_dict(accelerator, module) -> dict | None:
    """The module's full weights under ZeRO-3 (a collective: every rank calls it); else None,
    and the module's own state_dict is complete."""
    return accelerator.get_state_dict(module) if partitions_weights(accelerator) else None


def rank_checksums(accelerator, module) -> list[float] | None:
    """A checksum of the trained weights on every rank: data parallelism must keep them identical.
    None under ZeRO-3, where each rank holds only its partition."""
    if partitions_weights(accelerator):
        return None
    params = trainable_parameters(accelerator.unwrap_model(module))
    local = torch.stack([p.detach().double().sum() + p.detach().double().abs().sum() for p in params]).sum()
    return accelerator.gather(local.reshape(1).to(accelerator.device)).tolist()


def no_gpu() -> bool:
    mps = getattr(torch.backends, "mps", None)
    xpu = getattr(torch, "xpu", None)
    return not (torch.cuda.is_available() or (mps is not None and mps.is_available())
                or (xpu is not None and xpu.is_available()))


def accelerator_settings() -> dict:
    """Accelerator arguments for machines without a GPU. Plain data parallelism: `cpu=True`, or `accelerate
    launch --multi_gpu --num_processes N` starts N unconnected single-process runs instead of one gloo
    group. DeepSpeed (its CPU accelerator): accelerate enables it only when not told `cpu`, and needs the
    gloo backend named, or every rank believes it is the only one."""
    from accelerate.utils import InitProcessGroupKwargs

    if not no_gpu():
        return {}
    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true":
        return {"kwargs_handlers": [InitProcessGroupKwargs(backend="gloo")]}
    return {"cpu": True}


def resolve_mixed_precision(setting: str) -> str:
    if setting != "auto":
        return setting
    if torch.cuda.is_available():
        return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    return "bf16" if cpu_supports_bf16() else "no"

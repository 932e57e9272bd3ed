"""Accelerate and DeepSpeed for the trainer: which backend runs, full weights under ZeRO-3, the engine's own
checkpoint (ZeRO's partitioned optimizer state), every rank's generator state, rank checksums, CPU-only settings
and the mixed precision `auto` resolves to."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from specheads.data.models import cpu_supports_bf16
from specheads.train.checkpoint import (ENGINE_DIR, ENGINE_TAG, PREFIX, CheckpointWriteError, engine_problem,
                                        fresh_staging, staging_dir)
from specheads.train.task import trainable_parameters


def uses_deepspeed(accelerator) -> bool:
    from accelerate.utils import DistributedType

    return accelerator.distributed_type == DistributedType.DEEPSPEED


def partitions_weights(accelerator) -> bool:
    """DeepSpeed ZeRO-3: each rank holds only a slice of every trained weight."""
    return uses_deepspeed(accelerator) and accelerator.state.deepspeed_plugin.zero_stage == 3


def zero_stage(accelerator) -> int | None:
    """The DeepSpeed ZeRO stage the run uses; None without DeepSpeed."""
    return accelerator.state.deepspeed_plugin.zero_stage if uses_deepspeed(accelerator) else None


def save_engine_state(accelerator, engine, root: Path, step: int) -> dict:
    """DeepSpeed's own checkpoint of the engine into checkpoint `step`'s staging folder under root, as
    deepspeed/zero/ (the main process empties that folder first; checkpoint.save_checkpoint adds the rest and renames
    it): every rank writes its ZeRO partition of the optimizer, Adam's moments and the fp32 master weights, which
    no single process holds. A collective: every rank calls it. Returns the record trainer_state.json keeps.

    Frozen parameters (the base under Medusa-2's LoRA) are left out; the trained weights are in the checkpoint's
    heads/ as well, and that copy is the one a resumed run loads (load_engine_state)."""
    if accelerator.is_main_process:
        fresh_staging(root, step)
    accelerator.wait_for_everyone()
    folder = staging_dir(root, step) / ENGINE_DIR
    try:
        engine.save_checkpoint(str(folder), tag=ENGINE_TAG, client_state={}, save_latest=False,
                               exclude_frozen_parameters=True)
    except Exception as err:  # a full disk on this rank: the staging folder is never renamed, older ones untouched
        raise CheckpointWriteError(f"cannot save checkpoint {PREFIX}{step:06d} in {root}: DeepSpeed's files in "
                                   f"{folder}: {type(err).__name__}: {err}. The checkpoints before it are as they "
                                   "were; free space, then --resume") from err
    accelerator.wait_for_everyone()
    return {"folder": ENGINE_DIR, "tag": ENGINE_TAG, "zero_stage": zero_stage(accelerator),
            "processes": accelerator.num_processes}


def _keep_restored_weights(src, dst) -> None:
    """The module's weights came from the checkpoint's heads/ before accelerate.prepare (and under ZeRO-3 were
    partitioned from them); DeepSpeed's copy of the module is not loaded over them."""


def load_engine_state(engine, directory: Path, record: dict) -> None:
    """Restore the optimizer state save_engine_state wrote into checkpoint `directory` (`record`: its entry in
    trainer_state.json): each rank its own ZeRO partition, the moments and the fp32 master weights. A collective,
    called right after accelerate.prepare, before any step. DeepSpeed falls back silently to fresh moments when
    its files are missing, so they are checked first (FileNotFoundError naming the file)."""
    problem = engine_problem(directory, record)
    if problem is not None:
        raise FileNotFoundError(f"checkpoint {directory}: {problem}")
    folder = directory / record["folder"]
    load_path, _ = engine.load_checkpoint(str(folder), tag=record["tag"], load_module_strict=False,
                                          load_optimizer_states=True, load_lr_scheduler_states=False,
                                          custom_load_fn=_keep_restored_weights)
    if load_path is None:
        raise FileNotFoundError(f"checkpoint {directory}: DeepSpeed found no checkpoint under {folder} "
                                f"(tag {record['tag']!r})")


def rank_rng_states(accelerator) -> list[torch.Tensor] | None:
    """Every rank's torch generator state, by process index (a collective); None with one process. The ranks'
    states drift apart (dropout draws per element of batches of different lengths), so one rank's is not enough
    to resume the others."""
    if accelerator.num_processes == 1:
        return None
    state = torch.get_rng_state()
    gathered = accelerator.gather(state.to(torch.int32).to(accelerator.device))  # no uint8 gather on every backend
    return [row.clone() for row in gathered.cpu().to(torch.uint8).reshape(accelerator.num_processes, -1)]


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

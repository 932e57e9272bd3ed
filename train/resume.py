"""Resuming a run: the newest complete checkpoint, and what may change since it was saved.

A resumed run continues from the saved data position, so settings that decide the data order (batch size,
accumulation, seed, processes) and what is trained (model, data, module layout) must be as they were; the
optimizer's hyperparameters (lr, weight decay, betas) may change and are applied at the resumed step.
"""

from __future__ import annotations

import json
from pathlib import Path

from .checkpoint import STATE_NAME, checkpoint_dirs, checkpoint_problem
from .config import RunError


def flat_config(tree: dict, skip: str | None = None) -> dict:
    """{"section.key": value} (top-level scalars such as `mode` keep their own name)."""
    return {f"{section}.{key}" if isinstance(values, dict) else section: value
            for section, values in tree.items() if section != skip
            for key, value in (values.items() if isinstance(values, dict) else [(None, values)])}


# Settings that decide which examples a checkpoint's data position (micro-batches done) points at.
DATA_ORDER_KEYS = ("train.batch_size", "train.grad_accum", "train.seed")
# Optimizer settings a checkpoint restores as they were saved; a resumed run applies the config's (and says so).
OPTIMIZER_KEYS = ("train.lr", "train.weight_decay", "train.adam_betas")


def check_same_run(saved: dict, current: dict, checkpoint, saved_processes: int | None = None,
                   processes: int | None = None, saved_zero_stage: int | None = None,
                   zero_stage: int | None = None) -> None:
    """Resuming with another model, data or module layout would silently train something else, and another batch
    size, accumulation, seed or number of processes would continue from another place in the data; another ZeRO
    stage partitions the optimizer state otherwise than the checkpoint holds it."""
    before, now = flat_config(saved, skip="train"), flat_config(current, skip="train")
    changed = [f"{name}: {before.get(name)!r} -> {value!r}" for name, value in now.items()
               if name in before and before[name] != value]
    before, now = flat_config(saved), flat_config(current)
    changed += [f"{name}: {before[name]!r} -> {now[name]!r}" for name in DATA_ORDER_KEYS
                if name in before and before[name] != now[name]]
    if saved_processes is not None and processes is not None and saved_processes != processes:
        changed.append(f"processes: {saved_processes} -> {processes}")
    if saved_zero_stage is not None and zero_stage is not None and saved_zero_stage != zero_stage:
        changed.append(f"DeepSpeed zero_stage: {saved_zero_stage} -> {zero_stage}")
    if changed:
        raise RunError(f"--resume: {checkpoint} was trained with other settings ({'; '.join(changed)}); "
                         "resume with the saved values or use a new train.output_dir (nothing was changed)")


def changed_optimizer_settings(saved: dict, current: dict) -> list[str]:
    before, now = flat_config(saved), flat_config(current)
    return [f"{name}: {before[name]!r} -> {now[name]!r}" for name in OPTIMIZER_KEYS
            if name in before and before[name] != now.get(name)]


def apply_config_hyperparameters(optimizer, scheduler, fresh_groups: list[dict]) -> None:
    """After a checkpoint restored the optimizer and scheduler: the config's hyperparameters (`fresh_groups`, the
    param groups as built from the config) replace the saved ones, and every group's lr is the schedule's value at
    the restored step for the config's base lr, exactly what the scheduler computes (LambdaLR.get_lr)."""
    for group, fresh in zip(optimizer.param_groups, fresh_groups):
        group.update({key: value for key, value in fresh.items() if key not in ("params", "lr")})
    scheduler.base_lrs = [group["initial_lr"] for group in optimizer.param_groups]
    for group, base_lr, factor in zip(optimizer.param_groups, scheduler.base_lrs, scheduler.lr_lambdas):
        group["lr"] = base_lr * factor(scheduler.last_epoch)
    scheduler._last_lr = [group["lr"] for group in optimizer.param_groups]


def resume_point(checkpoints: Path, say) -> tuple[Path | None, dict]:
    """The newest checkpoint whose files all read back, and its trainer state; damaged newer ones are named by `say`.
    (None, {}) when there is none at all; a RunError when every one is damaged."""
    damaged = []
    for directory in reversed(checkpoint_dirs(checkpoints)):
        problem = checkpoint_problem(directory)
        if problem is None:
            for name, why in damaged:
                say(f"warning: checkpoint {name} is damaged ({why}); resuming from {directory}, the newest complete one")
            return directory, json.loads((directory / STATE_NAME).read_text())
        damaged.append((directory, problem))
    if damaged:
        raise RunError(f"--resume: no readable checkpoint under {checkpoints} ("
                         + "; ".join(f"{d.name}: {why}" for d, why in damaged)
                         + "); nothing was changed: move them aside to start afresh")
    return None, {}

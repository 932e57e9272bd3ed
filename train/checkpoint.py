"""Training checkpoints as safetensors + JSON (no pickles), written atomically.

A checkpoint folder `step-000120/` holds:
  heads/                 the heads in their normal on-disk format (loadable on their own)
  optimizer.safetensors  optimizer state tensors, keyed "state.<param>.<name>"
  rng.safetensors        torch (and CUDA) generator states
  trainer_state.json     step, data position, scheduler state, optimizer param groups, Python RNG
It is written under a temporary name and renamed when complete, so a run killed mid-write
leaves the previous checkpoint as the latest one; `checkpoint_problem` finds one damaged afterwards.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

PREFIX = "step-"


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (disk full, ...); nothing older was touched."""

STATE_NAME = "trainer_state.json"


def checkpoint_dirs(root: str | Path) -> list[Path]:
    """Complete checkpoints under root, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and p.name.startswith(PREFIX) and (p / STATE_NAME).is_file()]
    return sorted(found, key=lambda p: int(p.name[len(PREFIX):]))


def latest_checkpoint(root: str | Path) -> Path | None:
    dirs = checkpoint_dirs(root)
    return dirs[-1] if dirs else None


REQUIRED_STATE = ("step", "micro_batches_done", "scheduler", "optimizer_param_groups", "python_random")


def checkpoint_problem(directory: str | Path) -> str | None:
    """Why a checkpoint cannot be resumed from, or None: its trainer state must parse and hold the position, RNG
    states must be there, and every JSON file under it must parse and every safetensors file's header match its size
    (a disk that filled up, or a copy cut short). Reads no tensor data."""
    directory = Path(directory)
    try:
        state = json.loads((directory / STATE_NAME).read_text())
    except (OSError, ValueError) as err:
        return f"{STATE_NAME}: {err}"
    missing = [key for key in REQUIRED_STATE if key not in state] if isinstance(state, dict) else list(REQUIRED_STATE)
    if missing:
        return f"{STATE_NAME} lacks {', '.join(missing)}"
    if not (directory / "rng.safetensors").is_file():
        return "rng.safetensors is missing"
    for path in sorted(directory.rglob("*")):
        try:
            if path.suffix == ".json" and path.name != STATE_NAME:
                json.loads(path.read_text())
            elif path.suffix == ".safetensors":
                with safe_open(str(path), "pt"):
                    pass
        except Exception as err:  # noqa: BLE001 - safetensors raises its own error types
            return f"{path.relative_to(directory)}: {err}"
    return None


def _optimizer_to_files(optimizer) -> tuple[dict, list]:
    state = optimizer.state_dict()
    tensors = {}
    for param_id, param_state in state["state"].items():
        for name, value in param_state.items():
            if not torch.is_tensor(value):
                value = torch.tensor(value)
            tensors[f"state.{param_id}.{name}"] = value.detach().contiguous().cpu()
    return tensors, state["param_groups"]


def _optimizer_from_files(tensors: dict, param_groups: list) -> dict:
    state: dict[int, dict] = {}
    for key, value in tensors.items():
        _, param_id, name = key.split(".", 2)
        state.setdefault(int(param_id), {})[name] = value
    return {"state": state, "param_groups": param_groups}


def save_checkpoint(root: str | Path, step: int, heads, optimizer, trainer_state: dict, keep: int,
                    state_dict: dict | None = None) -> Path:
    """Write checkpoint `step` under root atomically; prune to the newest `keep` afterwards.

    optimizer None: no optimizer state (DeepSpeed keeps it partitioned); state_dict: gathered weights (ZeRO-3)."""
    root = Path(root)
    final = root / f"{PREFIX}{step:06d}"
    staging = root / f".tmp-{PREFIX}{step:06d}"
    try:
        _write_checkpoint(staging, heads, optimizer, trainer_state, state_dict)
    except Exception as err:  # a full disk, a quota, an I/O error: the older checkpoints are untouched
        shutil.rmtree(staging, ignore_errors=True)
        raise CheckpointWriteError(f"cannot save checkpoint {final.name} in {root}: {type(err).__name__}: {err}. "
                                   f"The checkpoints before it are as they were; free space, then --resume") from err
    if final.exists():
        shutil.rmtree(final)
    os.replace(staging, final)
    for old in checkpoint_dirs(root)[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _write_checkpoint(staging: Path, heads, optimizer, trainer_state: dict, state_dict: dict | None) -> None:
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir(parents=True)

    heads.save_pretrained(staging / "heads", state_dict=state_dict)
    param_groups = None
    if optimizer is not None:
        tensors, param_groups = _optimizer_to_files(optimizer)
        save_file(tensors, str(staging / "optimizer.safetensors"))
    rng = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        for i, cuda_state in enumerate(torch.cuda.get_rng_state_all()):
            rng[f"cuda.{i}"] = cuda_state
    save_file(rng, str(staging / "rng.safetensors"))
    py_state = random.getstate()
    state = dict(trainer_state, optimizer_param_groups=param_groups,
                 python_random=[py_state[0], list(py_state[1]), py_state[2]])
    (staging / STATE_NAME).write_text(json.dumps(state, indent=2))


def load_checkpoint(directory: str | Path, optimizer) -> dict:
    """Restore optimizer (unless None) and RNG states from a checkpoint; return its trainer state
    (heads load separately)."""
    directory = Path(directory)
    try:
        state = json.loads((directory / STATE_NAME).read_text())
        rng = load_file(str(directory / "rng.safetensors"))
        param_groups = state.pop("optimizer_param_groups")
        if optimizer is not None:
            if param_groups is None:
                raise ValueError("it holds no optimizer state (saved under DeepSpeed)")
            tensors = load_file(str(directory / "optimizer.safetensors"))
    except Exception as err:
        raise ValueError(f"checkpoint {directory} is unreadable: {err}") from err
    if optimizer is not None:
        optimizer.load_state_dict(_optimizer_from_files(tensors, param_groups))
    torch.set_rng_state(rng["torch"])
    cuda_states = [rng[k] for k in sorted(rng) if k.startswith("cuda.")]
    if cuda_states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda_states)
    version, internal, gauss = state.pop("python_random")
    random.setstate((version, tuple(internal), gauss))
    return state

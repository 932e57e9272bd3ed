"""Training checkpoints as safetensors + JSON (no pickles of ours), written atomically.

A checkpoint folder `step-000120/` holds:
  heads/                 the heads in their normal on-disk format (loadable on their own)
  optimizer.safetensors  optimizer state tensors, keyed "state.<param>.<name>" (not under DeepSpeed)
  deepspeed/zero/        under DeepSpeed: the engine's own checkpoint, every rank's ZeRO partition of the
                         optimizer (Adam's moments, the fp32 master weights), see below
  rng.safetensors        torch (and CUDA) generator states; with several processes every rank's torch state
  trainer_state.json     step, data position, scheduler state, optimizer param groups, Python RNG, and under
                         DeepSpeed where its checkpoint is (`deepspeed`: folder, tag, zero_stage, processes)
It is written under a temporary name and renamed when complete, so a run killed mid-write
leaves the previous checkpoint as the latest one; `checkpoint_problem` finds one damaged afterwards.

DeepSpeed's files are torch pickles (torch.save / torch.load of DeepSpeed's checkpoint engine): ZeRO's optimizer
state is partitioned across ranks with DeepSpeed's own flat layout and padding, which only DeepSpeed writes and
reads back. They are written and read by DeepSpeed itself inside this run's own checkpoint folder, never taken
from elsewhere; everything this package writes stays safetensors + JSON, and `checkpoint_problem` checks the
pickles only as files (complete zip archives), without unpickling them.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import zipfile
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

PREFIX = "step-"


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (disk full, ...); nothing older was touched."""


class CheckpointReadError(ValueError):
    """A checkpoint's files do not hold what resuming needs (the message names the checkpoint and the file)."""


STATE_NAME = "trainer_state.json"
ENGINE_DIR, ENGINE_TAG = "deepspeed", "zero"  # DeepSpeed's checkpoint: <checkpoint>/deepspeed/zero/*.pt


def staging_dir(root: str | Path, step: int) -> Path:
    """Where checkpoint `step` is written before its rename."""
    return Path(root) / f".tmp-{PREFIX}{step:06d}"


def fresh_staging(root: str | Path, step: int) -> Path:
    """An empty staging folder for checkpoint `step` (what a killed run left there is dropped)."""
    staging = staging_dir(root, step)
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir(parents=True)
    return staging


def engine_problem(directory: str | Path, record: dict) -> str | None:
    """Why the DeepSpeed checkpoint that trainer_state.json's `deepspeed` record names is not complete, or None:
    its model-state file and one optimizer-state file per rank must be there, each a complete zip archive (what
    torch.save writes; a file cut short lacks its end record). Unpickles nothing."""
    try:
        folder = Path(directory) / record["folder"] / record["tag"]
        processes = int(record["processes"])
    except (KeyError, TypeError, ValueError) as err:
        return f"{STATE_NAME}: deepspeed record {record!r} is malformed ({type(err).__name__}: {err})"
    where = folder.relative_to(directory)
    if not folder.is_dir():
        return f"{where}/ is missing (DeepSpeed's optimizer state)"
    optimizer_files = sorted(folder.glob("*optim_states.pt"))
    if not list(folder.glob("*model_states.pt")):
        return f"{where}/ holds no *model_states.pt"
    if len(optimizer_files) != processes:
        return (f"{where}/ holds {len(optimizer_files)} *optim_states.pt files, one per rank of the "
                f"{processes} that saved it was expected")
    for path in sorted(folder.glob("*.pt")):
        if not zipfile.is_zipfile(path):
            return f"{path.relative_to(directory)}: not a complete torch.save archive"
    return None


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
    if state.get("deepspeed") is not None:
        problem = engine_problem(directory, state["deepspeed"])
        if problem is not None:
            return problem
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
                    state_dict: dict | None = None, engine: dict | None = None,
                    rank_rng: list[torch.Tensor] | None = None) -> Path:
    """Write checkpoint `step` under root atomically; prune to the newest `keep` afterwards.

    optimizer None: no optimizer state of ours (under DeepSpeed the engine's checkpoint holds it: `engine` is its
    record, and every rank has already written it into staging_dir(root, step), which is kept); state_dict:
    gathered weights (ZeRO-3); rank_rng: every rank's torch generator state, by process index."""
    root = Path(root)
    final = root / f"{PREFIX}{step:06d}"
    staging = staging_dir(root, step)
    try:
        if engine is None:
            fresh_staging(root, step)
        else:
            problem = engine_problem(staging, engine)
            if problem is not None:
                raise FileNotFoundError(f"DeepSpeed's checkpoint is incomplete: {problem}")
            trainer_state = dict(trainer_state, deepspeed=engine)
        _write_checkpoint(staging, heads, optimizer, trainer_state, state_dict, rank_rng)
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


def _write_checkpoint(staging: Path, heads, optimizer, trainer_state: dict, state_dict: dict | None,
                      rank_rng: list[torch.Tensor] | None) -> None:
    heads.save_pretrained(staging / "heads", state_dict=state_dict)
    param_groups = None
    if optimizer is not None:
        tensors, param_groups = _optimizer_to_files(optimizer)
        save_file(tensors, str(staging / "optimizer.safetensors"))
    rng = {"torch": torch.get_rng_state()}
    for rank, rank_state in enumerate(rank_rng or []):  # ranks draw apart: dropout over batches of other lengths
        rng[f"torch.rank{rank}"] = rank_state
    if torch.cuda.is_available():
        for i, cuda_state in enumerate(torch.cuda.get_rng_state_all()):
            rng[f"cuda.{i}"] = cuda_state
    save_file(rng, str(staging / "rng.safetensors"))
    py_state = random.getstate()
    state = dict(trainer_state, optimizer_param_groups=param_groups,
                 python_random=[py_state[0], list(py_state[1]), py_state[2]])
    (staging / STATE_NAME).write_text(json.dumps(state, indent=2))


def load_checkpoint(directory: str | Path, optimizer, rank: int = 0) -> dict:
    """Restore optimizer (unless None: under DeepSpeed the engine loads its own) and RNG states (process `rank`'s
    where every rank's was saved) from a checkpoint; return its trainer state (heads load separately)."""
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
        raise CheckpointReadError(f"checkpoint {directory} is unreadable: {err}") from err
    if optimizer is not None:
        optimizer.load_state_dict(_optimizer_from_files(tensors, param_groups))
    torch.set_rng_state(rng.get(f"torch.rank{rank}", rng["torch"]))
    cuda_states = [rng[k] for k in sorted(rng) if k.startswith("cuda.")]
    if cuda_states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda_states)
    version, internal, gauss = state.pop("python_random")
    random.setstate((version, tuple(internal), gauss))
    return state

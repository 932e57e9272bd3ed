"""Read weight files without running anyone's code.

A pickle (`.bin`, `.pt`, ...) can execute arbitrary code when loaded, so specheads reads
safetensors everywhere and accepts a pickle only where a published layout ships one, under that
layout's own file name: FasterDecoding/Medusa's `medusa_lm_head.pt` and the EAGLE authors'
`pytorch_model.bin` (read by heads/formats/faster_decoding.py and eagle_repo.py), and then only
through `torch.load(weights_only=True)`. specheads' own folders and every other name are refused.
Every error names the file, so a truncated download or a damaged header is found at once.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import torch
from safetensors.torch import load_file

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")


class UnsafeWeightsError(ValueError):
    """A pickle was offered where specheads only reads safetensors."""


def read_safetensors(path: str | Path, device: str = "cpu") -> dict[str, torch.Tensor]:
    """All tensors of one safetensors file; a damaged or truncated file is an error naming it."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: weights file is missing")
    try:
        return load_file(str(path), device=device)
    except Exception as err:  # safetensors raises several types (SafetensorError, OSError, ...) for damage
        raise ValueError(f"cannot read {path}: not a valid safetensors file, it may be truncated or "
                         f"corrupted ({type(err).__name__}: {err})") from err


def read_pickle_weights_only(path: str | Path) -> dict[str, torch.Tensor]:
    """A flat {name: tensor} pickle read with torch.load(weights_only=True): no code runs on load."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: weights file is missing")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, AttributeError, ValueError) as err:
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ValueError(f"refusing {path}: torch.load(weights_only=True) rejected it; it holds more than "
                         f"tensors or is damaged ({first_line})") from err
    if not isinstance(state, dict):
        raise ValueError(f"{path}: expected a dict of tensors, found a {type(state).__name__}")
    not_tensors = [str(name) for name, value in state.items() if not isinstance(value, torch.Tensor)]
    if not_tensors:
        raise ValueError(f"{path}: expected a flat dict of tensors; not tensors: {', '.join(not_tensors[:5])}")
    return state


def refuse_pickles(directory: str | Path, expected: str) -> None:
    """Raise for a folder whose weights are pickles only: say so, instead of 'file missing'."""
    pickles = sorted(p.name for p in Path(directory).iterdir() if p.suffix in PICKLE_SUFFIXES)
    if pickles:
        raise UnsafeWeightsError(
            f"{directory}: {expected} is missing and specheads will not unpickle {', '.join(pickles)} (a pickle "
            f"can run code when loaded); convert it to safetensors, e.g. "
            f"safetensors.torch.save_file(torch.load(f, weights_only=True), '{expected}')")


def read_folder_safetensors(directory: str | Path, name: str, device: str = "cpu") -> dict[str, torch.Tensor]:
    """The safetensors file `name` in `directory`; a folder that offers only pickles is refused."""
    path = Path(directory) / name
    if not path.is_file() and Path(directory).is_dir():
        refuse_pickles(directory, name)
    return read_safetensors(path, device=device)


def read_folder_weights(directory: str | Path, name: str, pickle_name: str | None = None,
                        device: str = "cpu") -> tuple[Path, dict[str, torch.Tensor]]:
    """(path, tensors) of `name` (safetensors) in `directory`, else of the published pickle `pickle_name`
    read weights-only; any other pickle is refused, and a folder with neither is an error naming both."""
    directory = Path(directory)
    if (directory / name).is_file() or pickle_name is None:
        return directory / name, read_folder_safetensors(directory, name, device=device)
    if (directory / pickle_name).is_file():
        return directory / pickle_name, read_pickle_weights_only(directory / pickle_name)
    if directory.is_dir():
        refuse_pickles(directory, name)
    raise FileNotFoundError(f"{directory}: neither {name} nor {pickle_name} found")

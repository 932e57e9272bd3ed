"""How an engine is told to serve an exported draft: vLLM's `speculative_config` and `vllm serve` command.

One place for both, so that the engine tests (inference/engines), scripts/serve_vllm.py, the README and the
model cards that heads/hub.py writes all give the same command.
"""

from __future__ import annotations

import json
from pathlib import Path

# Export format -> vLLM's speculative_config method.
VLLM_METHODS = {"vllm-medusa": "medusa", "vllm-eagle": "eagle", "vllm-eagle3": "eagle3", "vllm-dflash": "dflash"}
# Which vLLM format a specheads draft exports as: Medusa heads, EAGLE-1 / EAGLE-3 drafts, a DFlash drafter.
VLLM_FORMAT = {"medusa": "vllm-medusa", "eagle1": "vllm-eagle", "eagle3": "vllm-eagle3", "dflash": "vllm-dflash"}


def vllm_speculative_config(format: str, folder: str | Path, k: int, revision: str | None = None) -> dict:
    """vLLM's speculative_config for the `folder` written as `format`, drafting `k` tokens per step
    (a local folder is given as an absolute path; anything else, e.g. a Hub id, as it is, with its `revision`)."""
    if format not in VLLM_METHODS:
        raise ValueError(f"vLLM serves the formats {', '.join(VLLM_METHODS)}, not {format!r}")
    local = Path(folder)
    spec = {"method": VLLM_METHODS[format], "model": str(local.resolve() if local.exists() else folder),
            "num_speculative_tokens": k}
    return {**spec, "revision": revision} if revision else spec


CPU_KV_CACHE_GIB = 4  # vLLM's CPU build stops at start without VLLM_CPU_KVCACHE_SPACE (GiB) on a small machine


def vllm_serve_command(model: str, format: str, folder: str | Path, k: int, *, port: int = 8000,
                       dtype: str = "bfloat16", vllm: str = "vllm", cpu_kv_cache_gib: int | None = None,
                       revision: str | None = None) -> list[str]:
    """`vllm serve` (the OpenAI-compatible server) for a base model and an exported draft; with
    `cpu_kv_cache_gib`, for vLLM's CPU build: `env VLLM_CPU_KVCACHE_SPACE=N vllm serve ...`."""
    spec = vllm_speculative_config(format, folder, k, revision)
    prefix = ["env", f"VLLM_CPU_KVCACHE_SPACE={cpu_kv_cache_gib}"] if cpu_kv_cache_gib else []
    return [*prefix, vllm, "serve", str(model), "--dtype", dtype, "--enforce-eager", "--port", str(port),
            "--speculative-config", json.dumps(spec, separators=(",", ":"))]

"""Run prompts through the real vLLM, plainly and with an exported draft, from specheads' own venv.

vLLM pins its own transformers and torch build, so it lives in a venv of its own (`make setup-engines`
creates `.venv-vllm`; `SPECHEADS_VLLM_PYTHON` points at another). `run_vllm` writes a job file, runs
`vllm_worker.py` with that venv's Python (engine core and worker in one process: no second import of
vLLM per instance) and reads back, per run, the generated tokens, the timed pass's tokens/s and the engine's
own speculative-decoding counters.

    runs = run_vllm("smollm2-135m-instruct", prompts, [plain_run(), draft_run("vllm-eagle3", folder, k=5)],
                    max_tokens=64, stop_token_ids=[2], dtype="float32")
    runs["vllm-eagle3"].acceptance_length   # 1 + accepted / drafts, as vLLM reports it
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from specheads.data.vllm_env import REPO, VLLM_VERSION, EngineUnavailable, vllm_python  # noqa: F401
from specheads.heads.serving import vllm_speculative_config

WORKER = Path(__file__).with_name("vllm_worker.py")


@dataclass
class EngineRun:
    """What the engine did in one run's timed pass."""

    name: str
    tokens: list[list[int]]
    tokens_per_s: float
    wall_s: float
    init_s: float
    drafts: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    speculative_config: dict | None = None

    @property
    def acceptance_length(self) -> float:
        """Tokens per verify step, bonus token included: 1 + accepted / drafts (vLLM's mean acceptance length)."""
        return 1.0 + self.accepted_tokens / self.drafts if self.drafts else 1.0

    @property
    def acceptance_rate_per_position(self) -> list[float]:
        return [a / self.drafts for a in self.accepted_per_position] if self.drafts else []


def plain_run(name: str = "plain") -> dict:
    return {"name": name, "speculative_config": None}


def draft_run(format: str, folder: str | Path, k: int, name: str | None = None) -> dict:
    """A run that serves the exported `folder` (written as `format`) drafting `k` tokens per step."""
    return {"name": name or format, "speculative_config": vllm_speculative_config(format, folder, k)}


def run_vllm(model: str, prompts: list[list[int]], runs: list[dict], *, max_tokens: int,
             stop_token_ids: list[int] = (), dtype: str = "bfloat16", batch_size: int = 0,
             max_model_len: int | None = None, timeout: float = 900,
             log: str | Path | None = None) -> dict[str, EngineRun]:
    """Each of `runs` (plain_run / draft_run) over the prompts' token ids, greedy, in one vLLM process.

    model: a Hub id, folder or built-in name (built-in names are converted to their safetensors folder
    first). batch_size 0 sends all prompts at once, as a server would see them; 1 one by one.
    The engine's log goes to `log` (a file), and its last lines into the error if it fails."""
    from specheads.data.models import resolve_model

    python = vllm_python()
    job = {"model": resolve_model(model), "dtype": dtype, "max_model_len": max_model_len, "prompts": prompts,
           "max_tokens": max_tokens, "stop_token_ids": list(stop_token_ids), "batch_size": batch_size,
           "runs": runs}
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1",
           "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1"), "TOKENIZERS_PARALLELISM": "false"}
    env.pop("OMP_NUM_THREADS", None)  # vLLM binds its own threads to the cores
    with tempfile.TemporaryDirectory(prefix="specheads-vllm-") as tmp:
        job_path, out_path = Path(tmp) / "job.json", Path(tmp) / "result.json"
        job_path.write_text(json.dumps(job))
        log_path = Path(log) if log else Path(tmp) / "vllm.log"
        with open(log_path, "w") as log_file:
            try:
                done = subprocess.run([str(python), str(WORKER), str(job_path), str(out_path)], env=env,
                                      stdout=log_file, stderr=subprocess.STDOUT, timeout=timeout, cwd=tmp)
            except subprocess.TimeoutExpired as err:
                raise EngineUnavailable(f"vLLM did not finish within {timeout:.0f} s (log: {log_path})") from err
        if done.returncode != 0 or not out_path.is_file():
            tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-25:])
            raise EngineUnavailable(f"vLLM exited with {done.returncode}:\n{tail}")
        result = json.loads(out_path.read_text())
    known = set(EngineRun.__dataclass_fields__)
    return {run["name"]: EngineRun(**{k: v for k, v in run.items() if k in known}) for run in result["runs"]}

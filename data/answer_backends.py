"""Who writes the answers self-distillation trains on: HF `generate` here, vLLM's offline engine, or any
OpenAI-compatible server (vLLM, SGLang, TGI, llama.cpp's server).

Each backend answers a batch of prompts given as token ids, rendered by the caller with the tokenizer and chat
template the training uses (so every backend sees exactly the same prompt), and returns the answers' text and how
many tokens it generated. The contract is `AnswerBackend`; `open_backend` builds one from the command line.

- `hf`: transformers' `generate` in this process (left-padded batches), on --device / --dtype.
- `vllm`: `LLM.generate` in vLLM's own venv (`make setup-engines`; SPECHEADS_VLLM_PYTHON for another), one engine
  process for the whole run (data/vllm_generate_worker.py), the batch scheduled as the engine does.
- `--endpoint URL`: POST URL/v1/completions with the token ids as the prompt (vLLM and SGLang take token ids;
  llama.cpp's server too), greedy or sampled as asked; the server stops at its model's end of turn.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch

from specheads.data.vllm_env import EngineUnavailable, vllm_python

BACKENDS = ("hf", "vllm")
VLLM_DTYPES = {"auto": "auto", "fp32": "float32", "float32": "float32", "bf16": "bfloat16", "bfloat16": "bfloat16",
               "fp16": "float16", "float16": "float16"}


class BackendError(RuntimeError):
    """The answering engine could not be started or stopped answering (names it, with its log's last lines)."""


@dataclass
class Sampling:
    max_new_tokens: int = 256
    temperature: float = 0.0  # 0: greedy
    top_p: float = 1.0
    seed: int = 0


class AnswerBackend(Protocol):
    name: str

    def answer(self, prompts: list[list[int]]) -> tuple[list[str], int]:
        """One answer per prompt (token ids), and the tokens generated in all."""

    def close(self) -> None: ...


def stop_token_ids(model_path: str, tokenizer) -> list[int]:
    """Every id that ends a turn: the tokenizer's EOS and the model's generation_config EOS ids (read from its folder,
    without loading weights)."""
    from transformers import GenerationConfig

    ids = {tokenizer.eos_token_id} if isinstance(tokenizer.eos_token_id, int) else set()
    try:
        value = GenerationConfig.from_pretrained(model_path).eos_token_id
    except OSError:  # no generation_config.json
        value = None
    ids.update([value] if isinstance(value, int) else (value or []))
    return sorted(ids)


def cut_at_stop(row: list[int], stops) -> list[int]:
    """The answer's tokens up to and including the first stop token."""
    return row[:next((i + 1 for i, t in enumerate(row) if t in stops), len(row))]


class HFBackend:
    name = "hf"

    def __init__(self, model, tokenizer, sampling: Sampling, stops: list[int]):
        self.model, self.tokenizer, self.sampling, self.stops = model, tokenizer, sampling, stops

    @torch.inference_mode()
    def answer(self, prompts):
        s = self.sampling
        batch = self.tokenizer.pad({"input_ids": prompts}, padding=True, return_tensors="pt").to(self.model.device)
        kwargs = dict(max_new_tokens=s.max_new_tokens, eos_token_id=self.stops, pad_token_id=self.tokenizer.pad_token_id)
        if s.temperature > 0:
            kwargs.update(do_sample=True, temperature=s.temperature, top_p=s.top_p)
        else:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        out = self.model.generate(**batch, **kwargs)[:, batch["input_ids"].shape[1]:]
        rows = [cut_at_stop(row, self.stops) for row in out.tolist()]
        return [self.tokenizer.decode(r, skip_special_tokens=True).strip() for r in rows], sum(map(len, rows))

    def close(self):
        pass


class VLLMBackend:
    """One vLLM engine process for the whole run, fed batch after batch over a pipe."""

    name = "vllm"
    START_TIMEOUT = 900.0

    def __init__(self, model_path: str, tokenizer, sampling: Sampling, stops: list[int], dtype: str = "auto",
                 max_model_len: int | None = None, log: str | Path | None = None):
        self.tokenizer, self.sampling, self.stops = tokenizer, sampling, stops
        try:
            python = vllm_python()
        except EngineUnavailable as err:  # not installed: the command line's one-line message says how
            raise BackendError(str(err)) from err
        worker = Path(__file__).with_name("vllm_generate_worker.py")
        env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "TOKENIZERS_PARALLELISM": "false",
               "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2"),
               "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1")}
        env.pop("OMP_NUM_THREADS", None)  # vLLM binds its own threads to the cores
        self.log_path = Path(log) if log else Path(tempfile.mkstemp(prefix="specheads-vllm-", suffix=".log")[1])
        self.log = open(self.log_path, "w")
        self.process = subprocess.Popen([str(python), str(worker)], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=self.log, env=env, text=True,
                                        cwd=tempfile.gettempdir())
        self._send({"model": model_path, "dtype": VLLM_DTYPES.get(dtype, dtype), "max_model_len": max_model_len,
                    "seed": sampling.seed})
        ready = self._receive(self.START_TIMEOUT)
        self.version = ready.get("vllm_version")

    def _send(self, message: dict) -> None:
        try:
            self.process.stdin.write(json.dumps(message) + "\n")
            self.process.stdin.flush()
        except BrokenPipeError:
            raise self._failed("vLLM stopped") from None

    def _receive(self, timeout: float | None = None) -> dict:
        line = self.process.stdout.readline()  # the engine answers or exits: EOF is its end
        if not line:
            raise self._failed(f"vLLM exited with {self.process.wait()}")
        return json.loads(line)

    def _failed(self, what: str) -> BackendError:
        self.log.flush()
        tail = "\n".join(self.log_path.read_text(errors="replace").splitlines()[-20:])
        return BackendError(f"{what} (log: {self.log_path}):\n{tail}")

    def answer(self, prompts):
        s = self.sampling
        self._send({"prompts": prompts, "max_tokens": s.max_new_tokens, "temperature": s.temperature,
                    "top_p": s.top_p, "seed": s.seed, "stop_token_ids": self.stops})
        rows = [cut_at_stop(row, self.stops) for row in self._receive()["tokens"]]
        return [self.tokenizer.decode(r, skip_special_tokens=True).strip() for r in rows], sum(map(len, rows))

    def close(self):
        if self.process.poll() is None:
            self.process.stdin.close()
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self.log.close()


class EndpointBackend:
    """An OpenAI-compatible server's /v1/completions, prompts as token ids, one request per batch."""

    name = "endpoint"

    def __init__(self, url: str, model: str, sampling: Sampling, timeout: float = 600.0):
        self.url = url.rstrip("/")
        if not self.url.endswith("/v1/completions"):
            self.url += "/v1/completions" if not self.url.endswith("/v1") else "/completions"
        self.model, self.sampling, self.timeout = model, sampling, timeout

    def answer(self, prompts):
        s = self.sampling
        body = {"model": self.model, "prompt": prompts, "max_tokens": s.max_new_tokens,
                "temperature": s.temperature, "seed": s.seed}
        if s.temperature > 0:
            body["top_p"] = s.top_p
        request = urllib.request.Request(self.url, data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        for attempt in range(3):  # a busy server may drop a connection; a refused request is not retried
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    reply = json.loads(response.read())
                break
            except urllib.error.HTTPError as err:
                raise BackendError(f"--endpoint {self.url}: HTTP {err.code}: "
                                   f"{err.read().decode(errors='replace')[:500]}") from err
            except (urllib.error.URLError, OSError) as err:
                if attempt == 2:
                    raise BackendError(f"--endpoint {self.url}: cannot be reached ({err})") from err
                time.sleep(2.0 * (attempt + 1))
        choices = sorted(reply.get("choices", []), key=lambda c: c.get("index", 0))
        if len(choices) != len(prompts):
            raise BackendError(f"--endpoint {self.url}: {len(choices)} answers for {len(prompts)} prompts")
        return [c.get("text", "").strip() for c in choices], int(reply.get("usage", {}).get("completion_tokens", 0))

    def close(self):
        pass

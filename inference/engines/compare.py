"""Export a draft, serve it in vLLM, decode the same prompts with our decoder, and put the figures side by side.

    prompts = chat_prompts("smollm2-135m-instruct", first_turns("data/questions/sharegpt-dev.jsonl", 6))
    report = compare_with_vllm("vllm-eagle3", "heads/trained/smollm2-135m-eagle3", prompts, k=5, max_tokens=96)
    report.engine.acceptance_length, report.ours.acceptance_length, report.engine_identity

Our side decodes the *exported folder read back* (what the engine loads), with the chain the engine drafts
(`chain.py`), in the same dtype; vLLM runs plain greedy and the draft in one process. `scripts/serve_vllm.py`
is the command line (deployment figures); tests/test_engine_vllm.py holds the tests built on it.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

from specheads.data.models import load_base_model, load_tokenizer
from specheads.heads import load_heads

from ..generate import chat_input_ids, eos_token_ids
from .chain import ChainRun, run_chain
from .vllm_engine import EngineRun, draft_run, plain_run, run_vllm

DTYPES = {"float32": "fp32", "bfloat16": "bf16"}  # vLLM's dtype name -> ours


def first_turns(path: str | Path, limit: int | None = None, skip: int = 0) -> list[str]:
    """The first turn of each question in a JSONL file of {question_id, category, turns}."""
    texts = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            record = json.loads(line)
            turns = record.get("turns") if isinstance(record, dict) else None
            if not isinstance(turns, list) or not turns or not isinstance(turns[0], str):
                raise ValueError(f"{path}, line {number}: 'turns' must be a non-empty list of strings")
            texts.append(turns[0])
    return texts[skip:][:limit]


def identity_rate(tokens: list[list[int]], reference: list[list[int]]) -> float:
    """Fraction of prompts whose tokens equal the reference's exactly."""
    return sum(a == b for a, b in zip(tokens, reference)) / max(len(reference), 1)


@dataclass
class Comparison:
    format: str
    k: int
    dtype: str
    plain: EngineRun  # the engine's own greedy
    engine: EngineRun  # the engine with the draft
    ours: ChainRun  # our decoder with the same chain, on the export read back

    @property
    def engine_identity(self) -> float:
        """The engine's speculative output against its own plain greedy (1.0 = every prompt identical)."""
        return identity_rate(self.engine.tokens, self.plain.tokens)

    @property
    def ours_identity(self) -> float:
        """Our decoder's output against the engine's plain greedy."""
        return identity_rate(self.ours.tokens, self.plain.tokens)

    @property
    def acceptance_gap(self) -> float:
        """|engine - ours| / ours, of the mean acceptance length."""
        return abs(self.engine.acceptance_length - self.ours.acceptance_length) / self.ours.acceptance_length

    def summary(self) -> dict:
        return {"format": self.format, "k": self.k, "dtype": self.dtype,
                "engine_acceptance_length": self.engine.acceptance_length,
                "ours_acceptance_length": self.ours.acceptance_length, "acceptance_gap": self.acceptance_gap,
                "engine_accepted_per_position": self.engine.accepted_per_position,
                "engine_drafts": self.engine.drafts, "ours_accepted_per_position": self.ours.accepted_per_position,
                "ours_steps": len(self.ours.step_lengths), "engine_identity": self.engine_identity,
                "ours_identity": self.ours_identity, "plain_tokens_per_s": self.plain.tokens_per_s,
                "draft_tokens_per_s": self.engine.tokens_per_s,
                "speedup": self.engine.tokens_per_s / self.plain.tokens_per_s}


def chat_prompts(model: str, texts: list[str]) -> list[list[int]]:
    """Each text as a user turn through the model's chat template, as token ids."""
    tokenizer = load_tokenizer(model)
    return [chat_input_ids(tokenizer, text)[0].tolist() for text in texts]


def compare_with_vllm(format: str, heads_dir: str | Path, prompts: list[list[int]], *, k: int, max_tokens: int,
                      model: str | None = None, dtype: str = "float32", stop_token_ids: list[int] | None = None,
                      export_dir: str | Path | None = None, batch_size: int = 0,
                      log: str | Path | None = None, export_options: dict | None = None) -> Comparison:
    """Export `heads_dir` as `format`, serve it in vLLM and decode the same prompts (token ids) ourselves.

    model: the base (default the one the heads name); stop_token_ids: default the base's EOS ids;
    export_options: the format's own (e.g. {"llama_layer": True} for vllm-eagle3, export.py --llama-layer)."""
    from specheads.heads.export import export

    model = model or base_model_of(Path(heads_dir))
    with tempfile.TemporaryDirectory(prefix="specheads-export-") as tmp:
        folder = Path(export_dir or Path(tmp) / format)
        export(format, heads_dir, folder, model=model, overwrite=export_dir is not None, **(export_options or {}))
        base = load_base_model(model, dtype=DTYPES[dtype])
        if stop_token_ids is None:
            stop_token_ids = eos_token_ids(base, load_tokenizer(model))
        draft = load_heads(folder, base)
        ours = run_chain(base, draft, prompts, k, max_tokens, stop_token_ids)
        del base, draft
        runs = run_vllm(model, prompts, [plain_run(), draft_run(format, folder, k)], max_tokens=max_tokens,
                        stop_token_ids=stop_token_ids, dtype=dtype, batch_size=batch_size, log=log)
    return Comparison(format, k, dtype, runs["plain"], runs[format], ours)


def base_model_of(heads_dir: Path) -> str:
    """The base model a heads folder names (its config.json's base_model_name_or_path)."""
    name = json.loads((heads_dir / "config.json").read_text()).get("base_model_name_or_path")
    if not name:
        raise ValueError(f"{heads_dir / 'config.json'} names no base model: pass model=")
    return name

"""Run prompts through vLLM, plainly or with a speculative draft, and write what the engine did as JSON.

This file runs inside vLLM's own virtual environment (`make setup-engines` makes `.venv-vllm`) and imports
nothing from specheads: `inference/engines/vllm.py` writes a job file, starts this script with that venv's
Python and reads the result file back. Job (JSON):

    {"model": folder, "dtype": "bfloat16", "max_model_len": null (the model's), "prompts": [[token ids], ...],
     "max_tokens": 64, "stop_token_ids": [...], "batch_size": 0 (all prompts at once),
     "runs": [{"name": "plain", "speculative_config": null}, {"name": "eagle3", "speculative_config": {...}}]}

Result: per run the generated token ids per prompt, wall seconds and tokens/s of the timed pass (after a
warm-up request), and the engine's own speculative-decoding counters over the timed pass
(`llm.get_metrics()`: drafts, draft tokens, accepted tokens, accepted tokens per position).
"""

from __future__ import annotations

import gc
import json
import sys
import time

SPEC_COUNTERS = {"vllm:spec_decode_num_drafts": "drafts", "vllm:spec_decode_num_draft_tokens": "draft_tokens",
                 "vllm:spec_decode_num_accepted_tokens": "accepted_tokens"}
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos"


def spec_counters(llm) -> dict:
    counters = {"drafts": 0, "draft_tokens": 0, "accepted_tokens": 0, "accepted_per_position": []}
    for metric in llm.get_metrics():
        if metric.name in SPEC_COUNTERS:
            counters[SPEC_COUNTERS[metric.name]] += int(metric.value)
        elif metric.name == PER_POSITION:
            values = [int(v) for v in metric.values]
            old = counters["accepted_per_position"]
            counters["accepted_per_position"] = [a + b for a, b in zip(values, old + [0] * len(values))]
    return counters


def difference(after: dict, before: dict) -> dict:
    result = {key: after[key] - before[key] for key in ("drafts", "draft_tokens", "accepted_tokens")}
    old = before["accepted_per_position"] + [0] * len(after["accepted_per_position"])
    result["accepted_per_position"] = [a - b for a, b in zip(after["accepted_per_position"], old)]
    return result


def run_one(job: dict, run: dict) -> dict:
    from vllm import LLM, SamplingParams

    started = time.perf_counter()
    # Token ids in, token ids out: no tokenizer needed (a tiny test base has none).
    llm = LLM(model=job["model"], dtype=job.get("dtype", "bfloat16"), skip_tokenizer_init=True, enforce_eager=True,
              max_model_len=job.get("max_model_len"), seed=0,
              distributed_executor_backend="uni", disable_log_stats=False,
              speculative_config=run.get("speculative_config"))
    init_s = time.perf_counter() - started
    params = SamplingParams(temperature=0.0, max_tokens=job["max_tokens"], ignore_eos=True,
                            stop_token_ids=job.get("stop_token_ids") or None)
    prompts = [{"prompt_token_ids": ids} for ids in job["prompts"]]
    llm.generate(prompts[:1], SamplingParams(temperature=0.0, max_tokens=8), use_tqdm=False)  # warm-up
    before = spec_counters(llm)
    batch = job.get("batch_size") or len(prompts)
    tokens, start = [], time.perf_counter()
    for i in range(0, len(prompts), batch):
        outputs = llm.generate(prompts[i:i + batch], params, use_tqdm=False)
        tokens.extend(list(output.outputs[0].token_ids) for output in outputs)
    wall = time.perf_counter() - start
    counters = difference(spec_counters(llm), before)
    del llm
    gc.collect()
    produced = sum(len(t) for t in tokens)
    return {"name": run["name"], "speculative_config": run.get("speculative_config"), "tokens": tokens,
            "init_s": init_s, "wall_s": wall, "tokens_per_s": produced / wall, **counters}


def main(job_path: str, out_path: str) -> None:
    import vllm

    with open(job_path) as f:
        job = json.load(f)
    results = {"vllm_version": vllm.__version__, "runs": [run_one(job, run) for run in job["runs"]]}
    with open(out_path + ".tmp", "w") as f:
        json.dump(results, f)
    import os

    os.replace(out_path + ".tmp", out_path)


if __name__ == "__main__":  # vLLM may start worker processes that import __main__
    main(sys.argv[1], sys.argv[2])

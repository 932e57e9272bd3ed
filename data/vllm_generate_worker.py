"""Answer batches of prompts with vLLM's offline engine for as long as asked: the data engine's worker.

Runs inside vLLM's own venv (like vllm_worker.py, it imports nothing from specheads) and keeps one `LLM` for the
whole session. Protocol, one JSON object per line:
- stdin, first line: {"model": folder, "dtype": "float32", "max_model_len": null, "seed": 0}
- stdout, once loaded: {"ready": true, "vllm_version": "..."}
- stdin, each request: {"prompts": [[token ids], ...], "max_tokens": 256, "temperature": 0.0, "top_p": 1.0,
  "stop_token_ids": [...], "seed": 0}; the engine schedules the whole batch itself
- stdout, each reply: {"tokens": [[answer token ids, stop token included], ...], "wall_s": s}
EOF on stdin ends it. vLLM's own log goes to stderr. Prompts are rendered and answers decoded by the caller with
the tokenizer and chat template the training uses, so the engine needs no tokenizer.
"""

from __future__ import annotations

import json
import sys
import time


def main() -> None:
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.platforms import current_platform

    reply = sys.stdout
    sys.stdout = sys.stderr  # anything vLLM prints stays off the protocol channel
    setup = json.loads(sys.stdin.readline())
    llm = LLM(model=setup["model"], dtype=setup.get("dtype", "bfloat16"), skip_tokenizer_init=True,
              enforce_eager=True, max_model_len=setup.get("max_model_len"), seed=setup.get("seed", 0),
              distributed_executor_backend="uni")
    # vLLM's CPU runner rewinds a seeded request's generator when it drops the token it sampled for a request still
    # being prefilled in chunks, and a CPU generator has no offset ("RuntimeError: CPU Generator does not use
    # offset", the engine dies). There the samples come from the engine's own seed (LLM(seed=...) above): the same
    # prompts in the same batches give the same answers.
    per_request_seed = not current_platform.is_cpu()
    print(json.dumps({"ready": True, "vllm_version": vllm.__version__}), file=reply, flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        temperature = request.get("temperature", 0.0)
        params = SamplingParams(temperature=temperature, top_p=request.get("top_p", 1.0) if temperature else 1.0,
                                max_tokens=request["max_tokens"],
                                seed=request.get("seed") if per_request_seed else None,
                                stop_token_ids=request.get("stop_token_ids") or None, detokenize=False)
        start = time.perf_counter()
        outputs = llm.generate([{"prompt_token_ids": ids} for ids in request["prompts"]], params, use_tqdm=False)
        tokens = [list(output.outputs[0].token_ids) for output in outputs]
        print(json.dumps({"tokens": tokens, "wall_s": time.perf_counter() - start}), file=reply, flush=True)


if __name__ == "__main__":  # vLLM may start worker processes that import __main__
    main()

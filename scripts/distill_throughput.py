"""Self-distillation throughput, HF against vLLM, on the same prompts in the same run: answers/hour, tokens/s and
how often the greedy answers agree.

    python scripts/distill_throughput.py --model smollm2-135m-instruct --prompts 200 --max-new-tokens 128 \
        --dtype fp32 --out runs/distill-throughput

The prompts are the first user turns of the data self_distill.py answers (its work list, the benchmark's questions
left out), rendered with the same chat template. Writes results.json and results.md under --out.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

from specheads.data.answer_backends import HFBackend, Sampling, VLLMBackend, stop_token_ids
from specheads.data.distill import benchmark_conversations, render_prompts, work_list
from specheads.data.models import add_device_arguments, load_base_model, load_tokenizer, resolve_model
from specheads.data.sharegpt import load_conversations
from specheads.heads.files import write_json, write_text
from specheads.inference.cli import positive_int


def kv_prefix() -> str:
    """The KV-cache size vLLM's CPU build was given, as the command's prefix (it bounds how many answers run at once)."""
    value = os.environ.get("VLLM_CPU_KVCACHE_SPACE")
    return f"VLLM_CPU_KVCACHE_SPACE={value} " if value else ""


def timed(backend, prompts, batch_size: int) -> dict:
    answers, tokens, start = [], 0, time.perf_counter()
    for i in range(0, len(prompts), batch_size):
        texts, new = backend.answer(prompts[i:i + batch_size])
        answers += texts
        tokens += new
    wall = time.perf_counter() - start
    return {"answers": answers, "tokens": tokens, "wall_s": wall, "tokens_per_s": tokens / wall,
            "answers_per_hour": len(prompts) / wall * 3600}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--dataset", default="sharegpt")
    parser.add_argument("--prompts", type=positive_int, default=200)
    parser.add_argument("--max-new-tokens", type=positive_int, default=128)
    parser.add_argument("--max-prompt-tokens", type=positive_int, default=384)
    parser.add_argument("--hf-batch-size", type=positive_int, default=48, help="HF's batch (self_distill's recipes)")
    parser.add_argument("--chat-template", default=None)
    parser.add_argument("--out", required=True)
    add_device_arguments(parser, dtype_default="fp32")
    args = parser.parse_args(argv)
    out = Path(args.out)
    tokenizer = load_tokenizer(args.model, args.chat_template, option="--chat-template")
    tokenizer.padding_side = "left"
    todo = work_list(load_conversations(args.dataset), tokenizer, 1, args.max_prompt_tokens, args.prompts,
                     benchmark_conversations())
    prompts = render_prompts(tokenizer, [system + users[:1] for _, _, system, users in todo])
    path = resolve_model(args.model)
    stops = stop_token_ids(path, tokenizer)
    sampling = Sampling(args.max_new_tokens)
    out.mkdir(parents=True, exist_ok=True)
    engine = VLLMBackend(path, tokenizer, sampling, stops, args.dtype, log=out / "vllm.log")
    try:
        timed(engine, prompts[:2], len(prompts))  # warm-up
        vllm = timed(engine, prompts, len(prompts))  # the engine schedules the whole set
    finally:
        engine.close()
    model = load_base_model(args.model, args.dtype, args.device, device_map=args.device_map)
    hf_backend = HFBackend(model, tokenizer, sampling, stops)
    timed(hf_backend, prompts[:2], 2)
    hf = timed(hf_backend, prompts, args.hf_batch_size)
    agree = sum(a == b for a, b in zip(hf["answers"], vllm["answers"])) / len(prompts)
    rows = {"hf": {k: v for k, v in hf.items() if k != "answers"}, "vllm": {k: v for k, v in vllm.items()
                                                                           if k != "answers"}}
    results = {"model": args.model, "dtype": args.dtype, "prompts": len(prompts), "max_new_tokens":
               args.max_new_tokens, "hf_batch_size": args.hf_batch_size, "vllm_version": engine.version,
               "machine": f"{platform.machine()}, {os.cpu_count()} cores", "backends": rows,
               "speedup_answers_per_hour": vllm["answers_per_hour"] / hf["answers_per_hour"],
               "greedy_agreement": agree, "command": kv_prefix() + "python scripts/distill_throughput.py " + " ".join(
                   argv if argv is not None else sys.argv[1:])}
    write_json(out / "results.json", results)
    table = ["| backend | answers/hour | tokens/s | wall s | tokens |", "|---|---:|---:|---:|---:|"]
    table += [f"| {name} | {r['answers_per_hour']:.0f} | {r['tokens_per_s']:.1f} | {r['wall_s']:.1f} | "
              f"{r['tokens']} |" for name, r in rows.items()]
    text = "\n".join([f"{args.model}, {args.dtype}, {len(prompts)} prompts x {args.max_new_tokens} new tokens, "
                      f"{results['machine']}; vLLM {engine.version}", "", *table, "",
                      f"vLLM / HF answers per hour: {results['speedup_answers_per_hour']:.2f}x; identical greedy "
                      f"answers: {agree:.1%}", "", f"`{results['command']}`", ""])
    write_text(out / "results.md", text)
    print(text)
    return results


if __name__ == "__main__":
    main()

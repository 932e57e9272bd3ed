"""Deployment figures: serve an exported draft in vLLM and put the engine's numbers beside our decoder's.

    python scripts/serve_vllm.py --format vllm-eagle3 --heads heads/trained/smollm2-135m-eagle3 --k 5 \
        --questions data/questions/sharegpt-dev.jsonl --max-questions 6 --max-new-tokens 96 --out runs/serve-eagle3

On the same chat prompts (first turns): vLLM's tokens/s without and with the draft (prompts batched as a server
sees them, or --batch-size 1), its mean acceptance length and acceptance per draft position (its own metrics),
our decoder's for the same chain (top-1, k tokens) on the export read back, and how often the outputs equal
vLLM's plain greedy. Needs `make setup-engines`. Writes OUT/results.json and OUT/results.md, and prints the
`vllm serve` command for this draft.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
from pathlib import Path

from specheads.inference.engines.compare import base_model_of, chat_prompts, compare_with_vllm, first_turns
from specheads.data.models import resolve_model
from specheads.heads.serving import CPU_KV_CACHE_GIB, VLLM_METHODS, vllm_serve_command
from specheads.inference.engines.vllm_engine import EngineUnavailable, vllm_python


def markdown(summary: dict) -> str:
    s = summary
    rows = [("vLLM tokens/s, plain", f"{s['plain_tokens_per_s']:.1f}"),
            ("vLLM tokens/s, with the draft", f"{s['draft_tokens_per_s']:.1f} ({s['speedup']:.2f}x)"),
            ("mean acceptance length, vLLM", f"{s['engine_acceptance_length']:.3f} ({s['engine_drafts']} drafts)"),
            ("mean acceptance length, ours", f"{s['ours_acceptance_length']:.3f} ({s['ours_steps']} steps)"),
            ("accepted per position, vLLM", str(s["engine_accepted_per_position"])),
            ("accepted per position, ours", str(s["ours_accepted_per_position"])),
            ("vLLM with draft = vLLM plain (prompts)", f"{s['engine_identity']:.2f}"),
            ("ours = vLLM plain (prompts)", f"{s['ours_identity']:.2f}")]
    head = f"# {s['format']} in vLLM, k={s['k']}, {s['dtype']}\n\n| | |\n|---|---|\n"
    return head + "\n".join(f"| {a} | {b} |" for a, b in rows) + f"\n\n`{s['serve_command']}`\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--format", required=True, choices=sorted(VLLM_METHODS))
    parser.add_argument("--heads", required=True, help="the heads or draft folder to export and serve")
    parser.add_argument("--model", default=None, help="base model; default: the one the heads name")
    parser.add_argument("--k", type=int, required=True, help="draft tokens per step (Medusa: at most its heads)")
    parser.add_argument("--questions", default="data/questions/sharegpt-dev.jsonl")
    parser.add_argument("--skip-questions", type=int, default=0)
    parser.add_argument("--max-questions", type=int, default=6)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--batch-size", type=int, default=0, help="prompts per vLLM call (0: all at once)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        model = args.model or base_model_of(Path(args.heads))
        texts = first_turns(args.questions, args.max_questions, args.skip_questions)
        comparison = compare_with_vllm(args.format, args.heads, chat_prompts(model, texts), k=args.k,
                                       max_tokens=args.max_new_tokens, model=model, dtype=args.dtype,
                                       export_dir=out / "export", batch_size=args.batch_size, log=out / "vllm.log")
    except (EngineUnavailable, ValueError, FileNotFoundError) as err:
        raise SystemExit(f"serve_vllm.py: {err}") from err
    summary = {**comparison.summary(), "heads": args.heads, "model": model, "questions": args.questions,
               "question_count": len(texts), "max_new_tokens": args.max_new_tokens, "batch_size": args.batch_size,
               "serve_command": shlex.join(vllm_serve_command(
                   resolve_model(model), args.format, out / "export", args.k, dtype=args.dtype,
                   vllm=str(vllm_python().with_name("vllm")), cpu_kv_cache_gib=CPU_KV_CACHE_GIB))}
    for name, text in (("results.json", json.dumps(summary, indent=2) + "\n"), ("results.md", markdown(summary))):
        (out / f".{name}.tmp").write_text(text)
        os.replace(out / f".{name}.tmp", out / name)  # a reader never sees half a file
    print(markdown(summary))


if __name__ == "__main__":
    main()

"""Build the best static tree for trained Medusa heads on this machine, and store it with the heads.

    python scripts/build_tree.py --heads runs/smollm2-135m-medusa1/heads

1. Rank statistics: the base answers held-out prompts greedily (the text speculation must match);
   teacher-forced over those answers, count how often head d's rank-r token is the right one.
2. Verify cost: time one base forward over n new tokens (on a prefix of realistic length) for each
   candidate budget n, relative to a one-token decode step, plus the heads' own cost.
3. For each budget, grow the tree best-first from the rank accuracies (Medusa's construction), estimate
   τ, and pick the budget with the highest estimated speedup τ / relative step cost.
The tree and the measurements go into the heads' config.json (`tree`, `tree_selection`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from specheads.data.models import load_base_model, load_tokenizer
from specheads.data.sharegpt import load_conversations, split_heldout
from specheads.heads import MedusaHeads
from specheads.heads.medusa import CONFIG_NAME
from specheads.inference.decoder import TreeDecoder
from specheads.inference.generate import chat_input_ids, eos_token_ids
from specheads.inference.tree import expected_tau, tree_from_accuracies


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--heads", required=True)
    parser.add_argument("--model", default=None, help="default: the base the heads were trained on")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--dataset", default="sharegpt")
    parser.add_argument("--heldout-size", type=int, default=200, help="same split as training (data.heldout_size)")
    parser.add_argument("--split-seed", type=int, default=0)
    parser.add_argument("--prompts", type=int, default=24, help="held-out prompts to answer for the statistics")
    parser.add_argument("--answer-tokens", type=int, default=128)
    parser.add_argument("--top-k", type=int, default=10, help="ranks considered per head")
    parser.add_argument("--budgets", default="2,4,6,8,12,16,24,32,48,64", help="tree sizes (nodes incl. root)")
    parser.add_argument("--prefix-length", type=int, default=300, help="cache length for timing")
    parser.add_argument("--dry-run", action="store_true", help="print the choice, do not write config.json")
    return parser.parse_args()


@torch.inference_mode()
def rank_accuracies(base, heads, sequences, answer_starts, top_k: int) -> list[list[float]]:
    """acc[d][r]: fraction of answer positions where head d+1's rank-r token is the token d+2 ahead."""
    num_heads = heads.config.num_heads
    hits = torch.zeros(num_heads, top_k, dtype=torch.float64)
    counts = torch.zeros(num_heads, dtype=torch.float64)
    for ids, start in zip(sequences, answer_starts):
        hidden = base(ids[None], output_hidden_states=True).hidden_states[-1][0]
        top = heads(hidden, base.get_output_embeddings()).topk(top_k, dim=-1).indices  # [K, T, k]
        length = ids.shape[0]
        for d in range(num_heads):
            shift = d + 2
            positions = torch.arange(max(start - 1, 0), length - shift)
            if len(positions) == 0:
                continue
            target = ids[positions + shift]
            match = top[d, positions] == target[:, None]  # [P, k], at most one True per row
            hits[d] += match.sum(0).double()
            counts[d] += len(positions)
    return (hits / counts.clamp(min=1)[:, None]).tolist()


@torch.inference_mode()
def step_costs(base, heads, budgets, prefix_length: int, repeats: int = 7) -> tuple[dict, float]:
    """Median seconds of a base forward over n new tokens after a cached prefix; and of the heads."""
    from transformers import DynamicCache

    device = base.device
    prefix = torch.randint(100, 1000, (1, prefix_length), device=device)
    times = {}
    for n in sorted(set(budgets) | {1}):
        samples = []
        for _ in range(repeats):
            cache = DynamicCache(config=base.config)
            base(prefix, past_key_values=cache, use_cache=True)
            new = torch.randint(100, 1000, (1, n), device=device)
            start = time.perf_counter()
            base(new, past_key_values=cache, use_cache=True, output_hidden_states=True)
            samples.append(time.perf_counter() - start)
        times[n] = statistics.median(samples)
    hidden = torch.randn(1, base.config.hidden_size, dtype=base.dtype, device=device)
    head_samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        heads(hidden, base.get_output_embeddings()).topk(10, dim=-1)
        head_samples.append(time.perf_counter() - start)
    return times, statistics.median(head_samples)


def write_tree(heads_dir: Path, tree, selection: dict) -> None:
    """Update config.json atomically: a crash never leaves the heads without a readable config."""
    path = heads_dir / CONFIG_NAME
    config = json.loads(path.read_text())
    config["tree"] = [list(p) for p in tree]
    config["tree_selection"] = selection
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(config, indent=2) + "\n")
    os.replace(tmp, path)


def main():
    args = parse_args()
    heads_dir = Path(args.heads)
    config, _ = MedusaHeads.read_config(heads_dir)
    model_name = args.model or config.base_model_name_or_path
    tokenizer = load_tokenizer(model_name)
    base = load_base_model(model_name, args.dtype)
    heads = MedusaHeads.from_pretrained(heads_dir, base_model=base).to(base.dtype)

    _, heldout = split_heldout(load_conversations(args.dataset), args.heldout_size, args.split_seed)
    plain = TreeDecoder(base)
    eos = eos_token_ids(base, tokenizer)
    sequences, starts = [], []
    for conversation in tqdm(heldout[: args.prompts], desc="greedy answers"):
        prompt = chat_input_ids(tokenizer, [conversation.messages[0]])[:, -1024:]
        answer = plain.generate_ids(prompt, args.answer_tokens, eos_token_ids=eos)
        sequences.append(torch.cat([prompt[0], torch.tensor(answer)]))
        starts.append(prompt.shape[1])
    accuracy = rank_accuracies(base, heads, sequences, starts, args.top_k)

    budgets = [int(b) for b in args.budgets.split(",")]
    times, head_seconds = step_costs(base, heads, budgets, args.prefix_length)
    one = times[1]
    rows, best = [], None
    for n in budgets:
        tree = tree_from_accuracies(accuracy, n - 1)
        tau = expected_tau(tree, accuracy)
        relative_cost = (times[n] + head_seconds) / one
        row = {"nodes": n, "estimated_tau": tau, "relative_step_cost": relative_cost,
               "estimated_speedup": tau / relative_cost, "depth": max(len(p) for p in tree)}
        rows.append(row)
        if best is None or row["estimated_speedup"] > best[0]["estimated_speedup"]:
            best = (row, tree)

    print("rank accuracy (head x rank):")
    for d, row in enumerate(accuracy, 1):
        print(f"  head {d}: " + " ".join(f"{a:.3f}" for a in row))
    print(f"one-token step {one * 1000:.1f} ms, heads {head_seconds * 1000:.1f} ms")
    print("nodes  est.tau  step cost  est.speedup")
    for row in rows:
        print(f"{row['nodes']:>5}  {row['estimated_tau']:.3f}    {row['relative_step_cost']:.2f}x      "
              f"{row['estimated_speedup']:.2f}x")
    chosen, tree = best
    print(f"chosen: {chosen['nodes']} nodes, depth {chosen['depth']}, est. tau {chosen['estimated_tau']:.2f}, "
          f"est. speedup {chosen['estimated_speedup']:.2f}x")
    selection = {"rank_accuracy": accuracy, "budgets": rows, "one_token_step_s": one, "heads_s": head_seconds,
                 "dtype": str(base.dtype), "prompts": len(sequences), "threads": torch.get_num_threads()}
    if not args.dry_run:
        write_tree(heads_dir, tree, selection)
        print(f"tree written to {heads_dir / CONFIG_NAME}")


if __name__ == "__main__":
    main()

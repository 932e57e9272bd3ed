"""Build the best static tree for trained Medusa heads on this machine, and store it with the heads.

    python scripts/build_tree.py --heads runs/smollm2-135m-medusa1/heads     (this module's CLI)

1. Rank statistics: the base answers held-out prompts greedily (the text speculation must match);
   teacher-forced over those answers, record at each position the rank of the right token in each
   head's top-k. A rank path's acceptance probability is how often the ranks start with it.
2. Verify cost: time one base forward over n new tokens (on a prefix of realistic length) for each
   candidate budget n, relative to a one-token decode step, plus the heads' own cost.
3. For each budget, take the most often accepted paths (Medusa's best-first construction, on measured
   path frequencies instead of a product of per-head accuracies), estimate τ and the speedup τ / relative
   step cost.
4. The estimate is optimistic (teacher-forced statistics, forward timings without the step's other work),
   so the few budgets it ranks best are decoded for real on held-out dev prompts, interleaved with plain
   decoding, and the fastest one wins (--timed-prompts 0: take the estimate's best).
The tree and the measurements go into the heads' config.json (`tree`, `tree_selection`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from specheads.data.models import add_device_arguments, load_base_model
from specheads.data.sharegpt import load_conversations, split_heldout
from specheads.heads import MedusaHeads
from specheads.heads.files import DFLASH_MODEL_TYPE, EAGLE_MODEL_TYPE, FileWriteError, update_config
from specheads.heads.joint import load_adapted_base
from specheads.heads.loading import folder_kind
from specheads.inference.decoder import TreeDecoder
from specheads.inference.methods import MethodOptions, build_decoder
from specheads.inference.cli import non_negative_int, positive_int
from specheads.inference.kv_cache import cache_argument_name
from specheads.inference.cpu_verify import add_untuned_cpu_argument, prepare_cpu_verify
from specheads.inference.generate import chat_input_ids, chat_tokenizer, eos_token_ids
from specheads.inference.timing import interleaved_speeds, synchronize
from specheads.inference.tree import path_frequencies, tree_from_path_frequencies


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--heads", required=True)
    parser.add_argument("--model", default=None, help="default: the base the heads were trained on")
    add_device_arguments(parser)  # --device (auto: a GPU when there is one), --dtype, --device-map
    parser.add_argument("--chat-template", default=None, help="prompt format; default: the one stored with the heads")
    add_untuned_cpu_argument(parser)
    parser.add_argument("--dataset", default="sharegpt")
    parser.add_argument("--heldout-size", type=positive_int, default=200, help="same split as training (data.heldout_size)")
    parser.add_argument("--split-seed", type=int, default=0)
    parser.add_argument("--prompts", type=positive_int, default=24, help="held-out prompts to answer for the statistics")
    parser.add_argument("--answer-tokens", type=positive_int, default=128)
    parser.add_argument("--top-k", type=positive_int, default=10, help="ranks considered per head")
    parser.add_argument("--budgets", default="2,4,6,8,12,16,24,32,48,64", help="tree sizes (nodes incl. root)")
    parser.add_argument("--prefix-length", type=positive_int, default=300, help="cache length for timing")
    parser.add_argument("--questions", default="data/questions/sharegpt-dev.jsonl",
                        help="dev questions whose last --timed-prompts first turns time the best budgets")
    parser.add_argument("--timed-prompts", type=non_negative_int, default=6, help="0: choose by the estimate alone")
    parser.add_argument("--timed-budgets", type=positive_int, default=4, help="how many of the best-estimated budgets to time")
    parser.add_argument("--timed-tokens", type=positive_int, default=96, help="new tokens per timed answer")
    parser.add_argument("--dry-run", action="store_true", help="print the choice, do not write config.json")
    args = parser.parse_args(argv)
    if args.timed_prompts > 0 and args.timed_budgets < 1:
        parser.error("--timed-budgets must be >= 1 when --timed-prompts > 0")
    return args


@torch.inference_mode()
def true_token_ranks(base, heads, sequences, answer_starts, top_k: int) -> torch.Tensor:
    """[positions, K]: rank of the token d+2 ahead among head d+1's top-k (-1 if absent), per answer position."""
    num_heads = heads.config.num_heads
    rows = []
    for ids, start in zip(sequences, answer_starts):
        hidden = base(ids[None], output_hidden_states=True).hidden_states[-1][0]
        top = heads.draft_to_token(heads(hidden, base.get_output_embeddings()).topk(top_k, dim=-1).indices)  # [K, T, k]
        positions = torch.arange(max(start - 1, 0), ids.shape[0] - 2)
        ranks = torch.full((len(positions), num_heads), -1, dtype=torch.long)
        for d in range(num_heads):
            ahead = positions + d + 2
            valid = ahead < ids.shape[0]
            match = top[d, positions[valid]] == ids[ahead[valid]][:, None]  # [P, k], at most one True per row
            found = match.any(-1)
            ranks[valid.nonzero().flatten()[found], d] = match[found].int().argmax(-1)
        rows.append(ranks)
    return torch.cat(rows)


@torch.inference_mode()
def step_costs(base, heads, budgets, prefix_length: int, repeats: int = 7) -> tuple[dict, float]:
    """Median seconds of a base forward over n new tokens after a cached prefix; and of the heads."""
    from transformers import DynamicCache

    device = base.device
    cache_argument = cache_argument_name(base)
    prefix = torch.randint(100, 1000, (1, prefix_length), device=device)
    times = {}
    for n in sorted(set(budgets) | {1}):
        samples = []
        for _ in range(repeats):
            cache = DynamicCache(config=base.config)
            base(prefix, use_cache=True, **{cache_argument: cache})
            new = torch.randint(100, 1000, (1, n), device=device)
            synchronize(device)
            start = time.perf_counter()
            base(new, use_cache=True, output_hidden_states=True, **{cache_argument: cache})
            synchronize(device)
            samples.append(time.perf_counter() - start)
        times[n] = statistics.median(samples)
    hidden = torch.randn(1, base.config.hidden_size, dtype=base.dtype, device=device)
    head_samples = []
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        heads(hidden, base.get_output_embeddings()).topk(10, dim=-1)
        synchronize(device)
        head_samples.append(time.perf_counter() - start)
    return times, statistics.median(head_samples)


def write_tree(heads_dir: Path, tree, selection: dict) -> None:
    """Update config.json atomically: a crash never leaves the heads without a readable config."""
    update_config(heads_dir, {"tree": [list(p) for p in tree], "tree_selection": selection})


def heads_check(heads_dir: Path) -> Path:
    """`heads_dir` if it holds Medusa heads in specheads' format; else ValueError saying what tunes that folder."""
    kind = folder_kind(heads_dir)
    if kind == EAGLE_MODEL_TYPE:
        raise ValueError(f"{heads_dir} holds an EAGLE draft, whose tree is dynamic: scripts/tune_eagle_tree.py "
                         f"--heads {heads_dir} times its shapes and stores the fastest (build_tree.py is for Medusa heads)")
    if kind == DFLASH_MODEL_TYPE:
        raise ValueError(f"{heads_dir} holds a DFlash drafter: build_tree.py is for Medusa heads. A DFlash drafter "
                         f"decodes with the static tree stored as \"tree\" in {heads_dir / 'config.json'} (rank paths "
                         f"over its per-position top-k; none: the top-1 chain), or the one --tree gives chat.py / "
                         f"bench.py")
    return heads_dir


def main(argv=None) -> dict:
    args = parse_args(argv)
    heads_dir = Path(args.heads)
    try:  # before any model loads: a folder this tool does not tune is one line that says what does
        config, _ = MedusaHeads.read_config(heads_check(heads_dir))
    except (FileNotFoundError, ValueError) as err:
        raise SystemExit(f"--heads: {err}") from err
    model_name = args.model or config.base_model_name_or_path
    tokenizer = chat_tokenizer(model_name, heads_dir, args.chat_template)
    base = load_adapted_base(load_base_model(model_name, args.dtype, args.device, device_map=args.device_map),
                             heads_dir)  # Medusa-2: its LoRA folded in
    heads = MedusaHeads.from_pretrained(heads_dir, base_model=base).to(base.dtype)
    prepare_cpu_verify(base, heads, enabled=not args.untuned_cpu)

    _, heldout = split_heldout(load_conversations(args.dataset), args.heldout_size, args.split_seed)
    plain = TreeDecoder(base)
    eos = eos_token_ids(base, tokenizer)
    sequences, starts = [], []
    for conversation in tqdm(heldout[: args.prompts], desc="greedy answers"):
        prompt = chat_input_ids(tokenizer, [conversation.messages[0]])[:, -1024:]
        answer = plain.generate_ids(prompt, args.answer_tokens, eos_token_ids=eos)
        sequences.append(torch.cat([prompt[0], torch.tensor(answer)]))
        starts.append(prompt.shape[1])
    ranks = true_token_ranks(base, heads, sequences, starts, args.top_k)
    frequencies = path_frequencies(ranks, args.top_k)
    accuracy = [[(ranks[:, d] == r).double().mean().item() for r in range(args.top_k)] for d in range(ranks.shape[1])]

    budgets = [int(b) for b in args.budgets.split(",")]
    times, head_seconds = step_costs(base, heads, budgets, args.prefix_length)
    one = times[1]
    rows, trees = [], {}
    for n in budgets:
        tree = trees[n] = tree_from_path_frequencies(frequencies, n - 1)
        tau = 1 + sum(frequencies[path] for path in tree)  # teacher-forced expectation, bonus token included
        relative_cost = (times[n] + head_seconds) / one
        rows.append({"nodes": n, "estimated_tau": tau, "relative_step_cost": relative_cost,
                     "estimated_speedup": tau / relative_cost, "depth": max(len(p) for p in tree)})
    ranked = sorted(rows, key=lambda row: -row["estimated_speedup"])
    chosen_by, chosen = "estimate", ranked[0]
    if args.timed_prompts > 0:
        questions = [json.loads(line) for line in Path(args.questions).read_text().splitlines() if line.strip()]
        # bench.py takes the first questions; time on the last ones so the two do not overlap
        prompts = [chat_input_ids(tokenizer, q["turns"][0]) for q in questions[-args.timed_prompts:]]
        if not prompts:
            raise SystemExit(f"--questions {args.questions}: no questions to time the budgets on")
        decoders = {"plain": plain, **{row["nodes"]: build_decoder("medusa", base, heads,
                                                                    MethodOptions(tree=trees[row["nodes"]]))
                                       for row in ranked[: args.timed_budgets]}}
        speeds = interleaved_speeds(decoders, prompts, args.timed_tokens, eos)
        plain_speed = speeds.pop("plain")[0]
        for row in rows:
            if row["nodes"] in speeds:
                speed, tau = speeds[row["nodes"]]
                row.update(measured_tau=tau, measured_speedup=speed / plain_speed)
        chosen_by, chosen = "timed", max((row for row in rows if "measured_speedup" in row),
                                         key=lambda row: row["measured_speedup"])
        if chosen["measured_speedup"] < 1:
            print(f"note: every timed tree decoded slower than plain decoding here (best "
                  f"{chosen['measured_speedup']:.2f}x); these heads do not pay on this machine")
    tree = trees[chosen["nodes"]]
    print("rank accuracy (head x rank):")
    for d, row in enumerate(accuracy, 1):
        print(f"  head {d}: " + " ".join(f"{a:.3f}" for a in row))
    print(f"one-token step {one * 1000:.1f} ms, heads {head_seconds * 1000:.1f} ms")
    print("nodes  est.tau  step cost  est.speedup  measured tau  measured speedup")
    for row in rows:
        measured = (f"  {row['measured_tau']:.3f}        {row['measured_speedup']:.2f}x" if "measured_tau" in row else "")
        print(f"{row['nodes']:>5}  {row['estimated_tau']:.3f}    {row['relative_step_cost']:.2f}x      "
              f"{row['estimated_speedup']:.2f}x{measured}")
    print(f"chosen ({chosen_by}): {chosen['nodes']} nodes, depth {chosen['depth']}, est. tau {chosen['estimated_tau']:.2f}"
          + (f", measured tau {chosen['measured_tau']:.2f}, {chosen['measured_speedup']:.2f}x plain decoding"
             if "measured_tau" in chosen else f", est. speedup {chosen['estimated_speedup']:.2f}x"))
    selection = {"rank_accuracy": accuracy, "positions": ranks.shape[0], "budgets": rows, "one_token_step_s": one, "heads_s": head_seconds,
                 "dtype": str(base.dtype), "prompts": len(sequences), "threads": torch.get_num_threads(),
                 "chosen_by": chosen_by, "timed_prompts": args.timed_prompts, "timed_tokens": args.timed_tokens}
    if not args.dry_run:
        try:
            write_tree(heads_dir, tree, selection)
        except FileWriteError as err:  # a full disk: config.json stays as it was
            raise SystemExit(f"build_tree.py: {err}") from err
        print(f"tree written to {heads_dir / 'config.json'}")
    return {"tree": tree, **selection}


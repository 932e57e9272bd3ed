"""Benchmark decoding methods on the same questions in one process.

    python scripts/bench.py --model smollm2-135m-instruct --heads runs/smollm2-135m-medusa1/heads \
        --questions data/questions/sharegpt-dev.jsonl --methods baseline,prompt_lookup,medusa \
        --temperature 0 --max-new-tokens 128 --out runs/bench

Methods: baseline (HF `generate`, the reference), hf_unpacked (the same with every linear through stock
F.linear, i.e. as transformers runs it without the CPU tuning's packed weights; a run then shows what packing
gives HF itself, and results.md adds each method's speedup against it), prompt_lookup (HF prompt lookup decoding, a peer),
plain (our decoder without heads), pld (prompt lookup as a candidate source of our decoder),
medusa (our tree decoder with the heads and their tree; --heads NAME=DIR,NAME=DIR compares several sets as
medusa:NAME; Medusa-2 heads decode on the base with their LoRA adapter merged, and an extra baseline:NAME
(HF greedy of that adapted model) is their reference for speedup and greedy match), medusa_pld (the heads with
prompt lookup: --pld-combine by-match = a lookup chain alone when the match is long enough to trust, a short
match merged with the heads' tree, else the heads' tree; first = the lookup chain when it finds one, else the
heads' tree; merge = both in one tree, verified in one forward), eagle2 / eagle3 (an EAGLE-1 / EAGLE-3 draft from --eagle-heads with an
EAGLE-2 dynamic tree of --eagle-tokens nodes), eagle3_pld (that draft with prompt lookup, as medusa_pld).
Seed methods: sps (draft-model speculative
sampling; the draft is the base's first --draft-layers layers + norm + lm_head, weights shared, γ fixed
or 'auto'), lookahead (Jacobi window W, n-grams N, pool G), hf_assisted (HF `generate` with that same
self-draft as assistant_model, HF's default assistant schedule), hf_prompt_lookup (= prompt_lookup).
Questions are JSONL {question_id, category, turns}; each turn is answered in order, the method's own
answers fed back. τ = new tokens / base forwards (counted with a forward hook, for every method).
Writes OUT/results.json, OUT/results.md and OUT/results.png.

--batch-size B: throughput mode. The questions' first turns are decoded B at a time (greedy): baseline is
HF batched `generate` (left padding), plain / medusa / medusa_pld / pld / eagle2 / eagle3 / eagle3_pld our
batched decoder (inference/batched.py), each row at its own pace (drafts run row by row, the base forward batched).
Reported per method: total new tokens / total seconds, τ per row, speedup vs the HF batch, and greedy match
per row against it. Writes OUT/results.json and OUT/results.md.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import platform
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch
from tqdm.auto import tqdm

from specheads.data.models import load_base_model, load_tokenizer
from specheads.heads import EagleDraft, load_heads
from specheads.heads.files import write_json, write_text
from specheads.heads.loading import load_medusa_heads
from specheads.heads.joint import adapter_of, load_adapted_base
from specheads.inference.batched import BatchedTreeDecoder, left_pad
from specheads.inference.candidates import (FallbackCandidates, MedusaCandidates, MergedCandidates,
                                            PromptLookupCandidates, lookup_with_heads)
from specheads.inference.decoder import SamplingConfig, TreeDecoder
from specheads.inference.generate import (chat_input_ids, eagle_candidates, eagle_tree_options, eos_token_ids,
                                          make_decoder)
from specheads.inference.lookahead import LookaheadCandidates
from specheads.inference.cli import (int_at_least, int_or_auto, min_prob, non_negative_float, non_negative_int,
                                     positive_int, top_p, tree_json)
from specheads.inference.cpu_verify import (add_untuned_cpu_argument, cpu_verify_settings, prepare_cpu_verify,
                                            stock_linears)
from specheads.inference.speculative import DraftModelCandidates, self_draft
from specheads.inference.tree import TreeError, check_tree_fits

METHODS = ("baseline", "hf_unpacked", "prompt_lookup", "hf_prompt_lookup", "hf_assisted", "plain", "pld", "sps", "lookahead",
           "medusa", "medusa_pld", "eagle2", "eagle3", "eagle3_pld")
EAGLE_METHODS = {"eagle2": "eagle1", "eagle3": "eagle3", "eagle3_pld": "eagle3"}  # bench method -> the draft variant it decodes with
BATCHED_METHODS = ("baseline", "plain", "medusa", "medusa_pld", "pld", "eagle2", "eagle3", "eagle3_pld")  # --batch-size


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--heads", default=None, help="Medusa heads folder, or NAME=DIR,NAME=DIR to compare sets")
    parser.add_argument("--tree", type=tree_json, default=None, help="JSON rank paths; default: the heads' stored tree")
    parser.add_argument("--eagle-heads", default=None,
                        help="EAGLE draft folder(s), comma-separated: an EAGLE-1 draft for eagle2, an EAGLE-3 one for eagle3")
    parser.add_argument("--eagle-top-k", type=positive_int, default=None, help="EAGLE-2 tree: children per expanded node")
    parser.add_argument("--eagle-depth", type=positive_int, default=None, help="EAGLE-2 tree: draft steps")
    parser.add_argument("--eagle-tokens", type=int_at_least(2), default=None,
                        help="EAGLE-2 tree: nodes verified per step (the root included)")
    parser.add_argument("--eagle-min-prob", type=min_prob, default=None,
                        help="EAGLE-2 tree: leave out nodes whose cumulative draft probability is below this")
    parser.add_argument("--questions", default="data/questions/sharegpt-dev.jsonl")
    parser.add_argument("--methods", default="baseline,prompt_lookup,medusa")
    parser.add_argument("--temperature", type=non_negative_float, default=0.0, help="0: greedy")
    parser.add_argument("--top-p", type=top_p, default=1.0, help="nucleus sampling mass, in (0, 1]")
    parser.add_argument("--max-new-tokens", type=positive_int, default=128)
    parser.add_argument("--pld-tokens", type=positive_int, default=10, help="prompt-lookup draft length (pld, medusa_pld, eagle3_pld)")
    parser.add_argument("--pld-combine", choices=["by-match", "first", "merge"], default="by-match",
                        help="medusa_pld / eagle3_pld: by-match = a lookup chain of --pld-trusted-tokens alone when "
                             "its match is >= --pld-trusted-ngram tokens long, a shorter match's chain merged with "
                             "the heads' tree, else the heads' tree (inference/candidates.lookup_with_heads); "
                             "first = the --pld-tokens chain whenever it matches, else the heads' tree; "
                             "merge = both in one tree every step")
    parser.add_argument("--pld-trusted-ngram", type=positive_int, default=2, help="--pld-combine by-match: see there")
    parser.add_argument("--pld-trusted-tokens", type=positive_int, default=16, help="--pld-combine by-match: see there")
    parser.add_argument("--pld-heads-tree", type=tree_json, default=None,
                        help="medusa_pld with --pld-combine first: JSON rank paths of the heads merged with the lookup "
                             "chain when it matches (default: the chain alone)")
    parser.add_argument("--draft-layers", type=positive_int, default=None,
                        help="layers of the self-speculative draft (sps, hf_assisted); default: a quarter of the base's")
    parser.add_argument("--gamma", type=int_or_auto, default="auto", help="sps draft length: an int or 'auto' (from measured α and cost)")
    parser.add_argument("--lookahead-window", type=positive_int, default=5, help="lookahead W")
    parser.add_argument("--lookahead-ngram", type=int_at_least(2), default=4, help="lookahead N")
    parser.add_argument("--lookahead-pool", type=positive_int, default=5, help="lookahead G (n-grams verified per step)")
    parser.add_argument("--max-questions", type=positive_int, default=None)
    parser.add_argument("--skip-questions", type=non_negative_int, default=0,
                        help="start after this many questions of the file (e.g. a second, untuned half)")
    parser.add_argument("--dtype", default="auto")
    add_untuned_cpu_argument(parser)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=positive_int, default=None,
                        help="throughput mode: decode first turns B at a time "
                             "(methods " + ", ".join(BATCHED_METHODS) + ")")
    parser.add_argument("--out", default="runs/bench")
    return parser.parse_args(argv)


def check_question(q, where: str) -> dict:
    """One question as bench.py answers it; a ValueError naming `where` (file:line) and the field otherwise."""
    if not isinstance(q, dict):
        raise ValueError(f"{where}: not a JSON object (a {type(q).__name__}); each line is one "
                         "{\"question_id\", \"category\", \"turns\"} object")
    for key in ("question_id", "category", "turns"):
        if key not in q:
            raise ValueError(f"{where}: question lacks field {key!r}")
    if isinstance(q["question_id"], bool) or not isinstance(q["question_id"], (str, int)):
        raise ValueError(f"{where}: field 'question_id' must be a string or an integer, got {q['question_id']!r}")
    if not isinstance(q["category"], str):
        raise ValueError(f"{where}: field 'category' must be a string, got {q['category']!r}")
    turns = q["turns"]
    if isinstance(turns, str):
        raise ValueError(f"{where}: field 'turns' must be a list of strings, got a string (write [\"...\"])")
    if not isinstance(turns, list):
        raise ValueError(f"{where}: field 'turns' must be a list of strings, got {turns!r}")
    if not turns:
        raise ValueError(f"{where}: field 'turns' is empty; a question needs at least one turn")
    for i, turn in enumerate(turns, 1):
        if not isinstance(turn, str):
            raise ValueError(f"{where}: field 'turns': turn {i} must be a string, got {turn!r}")
        if not turn.strip():
            raise ValueError(f"{where}: field 'turns': turn {i} is empty")
    return q


def load_questions(path, limit=None, skip=0) -> list[dict]:
    """The questions of a JSONL file, every line checked first: a ValueError names the file, line and field."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such file")
    questions = []
    with open(path, "rb") as f:
        for line_no, raw in enumerate(f, 1):
            where = f"{path}:{line_no}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise ValueError(f"{where}: not UTF-8 text") from None
            if not line.strip():
                continue
            try:
                q = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{where}: not valid JSON ({err.msg.removesuffix(' at')} at column {err.colno})") from None
            questions.append(check_question(q, where))
    if skip >= len(questions):
        raise ValueError(f"{path}: --skip-questions {skip} leaves none of its {len(questions)} questions")
    return questions[skip:][:limit]


class ForwardCounter:
    """Counts calls of the base model's forward (one per verification or decode step)."""

    def __init__(self, model):
        self.calls = 0
        model.register_forward_hook(self._hook)

    def _hook(self, *args):
        self.calls += 1


def parse_heads_sets(spec: str | None) -> dict[str, str]:
    """--heads: 'DIR' -> {"medusa": DIR}; 'A=DIR1,B=DIR2' -> {"medusa:A": DIR1, "medusa:B": DIR2}."""
    if not spec:
        return {}
    entries = spec.split(",")
    if len(entries) == 1 and "=" not in entries[0]:
        return {"medusa": entries[0]}
    sets = {}
    for entry in entries:
        name, sep, directory = entry.partition("=")
        if not sep or not name or not directory:
            raise SystemExit(f"--heads: {entry!r} must look like NAME=DIR when several sets are compared")
        sets[f"medusa:{name}"] = directory
    return sets


def own_baseline(method: str) -> str:
    """The name of HF greedy on the adapted model a Medusa-2 method decodes with."""
    return "baseline:" + (method.partition(":")[2] or method)


def reference_of(method: str, methods) -> str:
    """The HF greedy run a method is compared with: its own adapted model's, else the base's."""
    own = own_baseline(method)
    return own if own in methods and not method.startswith("baseline") else "baseline"


def lookup_heads_of(args, head_set, target):
    """--pld-heads-tree: the (small) Medusa heads source merged with a matching lookup chain, else None."""
    if not args.pld_heads_tree:
        return None
    return MedusaCandidates(head_set, json.loads(args.pld_heads_tree), target.get_output_embeddings(), target.device)


def with_lookup(heads_source, args, device, heads_on_match=None):
    """Heads and prompt lookup (--pld-tokens) as one candidate source, combined as --pld-combine says, its trees
    on the model's device; heads_on_match: a (small) heads source merged with the lookup chain when it matches
    (first only)."""
    if args.pld_combine == "by-match":
        if heads_on_match is not None:
            raise SystemExit("--pld-heads-tree goes with --pld-combine first")
        return lookup_with_heads(heads_source, args.pld_trusted_ngram, args.pld_trusted_tokens, device=device)
    lookup = PromptLookupCandidates(max_ngram=3, num_tokens=args.pld_tokens, device=device)
    if args.pld_combine == "merge":
        return MergedCandidates(heads_source, lookup)
    if heads_on_match is not None:
        return FallbackCandidates(MergedCandidates(lookup, heads_on_match, require_first=True), heads_source)
    return FallbackCandidates(lookup, heads_source)


class Runner:
    def __init__(self, args, model, tokenizer, heads, eagle_drafts=None):
        self.args, self.model, self.tokenizer = args, model, tokenizer
        self.eos = eos_token_ids(model, tokenizer)
        self.counter = ForwardCounter(model)
        self.model_of, self.counter_of = {}, {}  # methods that run on another (LoRA-adapted) model
        self.decoders = {"plain": TreeDecoder(model),
                         "pld": TreeDecoder(model, candidates=PromptLookupCandidates(3, args.pld_tokens, model.device)),
                         "lookahead": TreeDecoder(model, candidates=LookaheadCandidates(
                             args.lookahead_window, args.lookahead_ngram, args.lookahead_pool, model.device))}
        layers = model.config.num_hidden_layers
        # Shares the base's modules but not its forward hook, so draft forwards are not counted in τ.
        try:
            self.draft = self_draft(model, args.draft_layers or max(1, layers // 4))
        except ValueError as err:
            raise SystemExit(f"--draft-layers: {err}") from err
        gamma = args.gamma if args.gamma == "auto" else int(args.gamma)
        self.decoders["sps"] = TreeDecoder(model, candidates=DraftModelCandidates(self.draft, gamma, device=model.device))
        tree = json.loads(args.tree) if args.tree else None
        for method, (target, head_set) in (heads or {}).items():
            medusa = TreeDecoder(target, head_set, tree)
            self.decoders[method] = medusa
            if target is not model:  # Medusa-2: its own model, forward counter and HF greedy reference
                reference = own_baseline(method)
                counter = ForwardCounter(target)
                for name in (method, reference):
                    self.model_of[name], self.counter_of[name] = target, counter
            if method == "medusa" or "medusa_pld" not in self.decoders:  # medusa_pld: the first set's tree
                combined = with_lookup(medusa.candidates, args, target.device, lookup_heads_of(args, head_set, target))
                self.decoders["medusa_pld"] = TreeDecoder(target, candidates=combined)
        eagle_tree = eagle_tree_options(args.eagle_top_k, args.eagle_depth, args.eagle_tokens, args.eagle_min_prob)
        for method, draft in (eagle_drafts or {}).items():
            decoder = make_decoder(model, draft, eagle_tree=eagle_tree)
            if method.endswith("_pld"):  # the EAGLE-2 tree with prompt lookup
                decoder = TreeDecoder(model, candidates=with_lookup(decoder.candidates, args, model.device))
            self.decoders[method] = decoder
        self.sampling = SamplingConfig(temperature=args.temperature, top_p=args.top_p)

    def generate(self, method: str, input_ids: torch.Tensor, seed: int) -> tuple[list[int], dict]:
        """New token ids, and (our decoders only) tokens per step and where the step time went."""
        max_new = self.args.max_new_tokens
        if method in self.decoders:
            decoder = self.decoders[method]
            self.sampling.seed = seed
            ids = decoder.generate_ids(input_ids, max_new, self.sampling, self.eos)
            stats = decoder.stats
            return ids, {"accepted": list(stats.accepted_lengths), "step_seconds": stats.step_seconds,
                         "verify_seconds": stats.verify_seconds, "draft_seconds": stats.draft_seconds}
        kwargs = dict(max_new_tokens=max_new, eos_token_id=self.eos, pad_token_id=self.tokenizer.pad_token_id,
                      attention_mask=torch.ones_like(input_ids))
        if self.args.temperature > 0:
            torch.manual_seed(seed)
            kwargs.update(do_sample=True, temperature=self.args.temperature, top_p=self.args.top_p)
        else:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        if method in ("prompt_lookup", "hf_prompt_lookup"):
            kwargs["prompt_lookup_num_tokens"] = 10
        elif method == "hf_assisted":
            kwargs["assistant_model"] = self.draft
        unpacked = stock_linears() if method == "hf_unpacked" else contextlib.nullcontext()
        with torch.inference_mode(), unpacked:
            out = self.model_of.get(method, self.model).generate(input_ids, **kwargs)
        return out[0, input_ids.shape[1]:].tolist(), {"accepted": []}

    def run_question(self, method: str, question: dict) -> dict:
        messages, turns = [], []
        for i, turn in enumerate(question["turns"]):
            messages.append({"role": "user", "content": turn})
            input_ids = chat_input_ids(self.tokenizer, messages)
            counter = self.counter_of.get(method, self.counter)
            counter.calls = 0
            start = time.perf_counter()
            ids, extra = self.generate(method, input_ids, seed=self.args.seed + i)
            seconds = time.perf_counter() - start
            turns.append({"tokens": ids, "seconds": seconds, "forwards": counter.calls, **extra})
            messages.append({"role": "assistant", "content": self.tokenizer.decode(ids, skip_special_tokens=True)})
        new = sum(len(t["tokens"]) for t in turns)
        return {"question_id": question["question_id"], "category": question["category"], "turns": turns,
                "new_tokens": new, "seconds": sum(t["seconds"] for t in turns),
                "forwards": sum(t["forwards"] for t in turns)}


def summarise(records: list[dict], baseline: list[dict] | None, greedy: bool) -> dict:
    tokens_per_s = [r["new_tokens"] / r["seconds"] for r in records]
    summary = {"questions": len(records), "tokens_per_s": sum(tokens_per_s) / len(records),
               "tau": sum(r["new_tokens"] for r in records) / max(sum(r["forwards"] for r in records), 1),
               "new_tokens": sum(r["new_tokens"] for r in records)}
    steps = [t for r in records for t in r["turns"] if t.get("step_seconds")]
    if steps:  # our decoders: whole step time over (tree forward + drafting)
        summary["step_overhead"] = (sum(t["step_seconds"] for t in steps)
                                    / sum(t["verify_seconds"] + t["draft_seconds"] for t in steps))
    summary["speedup"] = 1.0  # the baseline against itself
    if baseline is not None:
        base_tps = sum(r["new_tokens"] / r["seconds"] for r in baseline) / len(baseline)
        summary["speedup"] = summary["tokens_per_s"] / base_tps
        # how far single questions stray from the mean: a reader can tell a method's effect from a few outliers
        ratios = sorted((r["new_tokens"] / r["seconds"]) / (b["new_tokens"] / b["seconds"])
                        for r, b in zip(records, baseline))
        summary["speedup_per_question"] = {"min": ratios[0], "median": ratios[len(ratios) // 2], "max": ratios[-1]}
        if greedy:
            same = [[t["tokens"] for t in r["turns"]] == [t["tokens"] for t in b["turns"]]
                    for r, b in zip(records, baseline)]
            summary["greedy_match"] = sum(same) / len(same)
    return summary


def machine() -> str:
    cpu = platform.machine()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{cpu}, {torch.get_num_threads()} threads"


def write_markdown(results: dict, path: Path) -> None:
    methods = results["methods"]
    categories = sorted({c for m in methods.values() for c in m["per_category"]})
    lines = [f"Model {results['model']} ({results['dtype']}), T={results['temperature']}, "
             f"max {results['max_new_tokens']} new tokens, {results['questions']} questions; {results['date']}, "
             f"{results['machine']}.", "",
             "| method | τ | tokens/s | speedup | greedy match | step / (forward + draft) |",
             "|---|---:|---:|---:|---:|---:|"]
    for name, m in methods.items():
        o = m["overall"]
        match = f"{o['greedy_match']:.2f}" if "greedy_match" in o else "–"
        overhead = f"{o['step_overhead']:.3f}" if "step_overhead" in o else "–"
        lines.append(f"| {name} | {o['tau']:.2f} | {o['tokens_per_s']:.1f} | {o.get('speedup', 1.0):.2f}x | {match} "
                     f"| {overhead} |")
    if "hf_unpacked" in methods:
        stock = methods["hf_unpacked"]["overall"]["tokens_per_s"]
        lines += ["", f"Against `hf_unpacked` (HF `generate` on stock PyTorch linears, {stock:.1f} tokens/s): " + ", ".join(
            f"{name} {m['overall']['tokens_per_s'] / stock:.2f}x" for name, m in methods.items() if name != "hf_unpacked") + "."]
    lines += ["", "Speedup (τ) per category:", "", "| method | " + " | ".join(categories) + " |",
              "|---|" + "---:|" * len(categories)]
    for name, m in methods.items():
        cells = []
        for c in categories:
            s = m["per_category"].get(c)
            cells.append(f"{s.get('speedup', 1.0):.2f}x ({s['tau']:.2f})" if s else "–")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    write_text(path, "\n".join(lines) + "\n")


def write_plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = results["methods"]
    categories = sorted({c for m in methods.values() for c in m["per_category"]})
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    width = 0.8 / max(len(methods), 1)
    for i, (name, m) in enumerate(methods.items()):
        xs = [j + i * width for j in range(len(categories))]
        axes[0].bar(xs, [m["per_category"].get(c, {}).get("speedup", 0) for c in categories], width, label=name)
        axes[1].bar(xs, [m["per_category"].get(c, {}).get("tau", 0) for c in categories], width, label=name)
    for ax, title in ((axes[0], "speedup vs HF greedy"), (axes[1], "τ (tokens per base forward)")):
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(categories))], categories, rotation=30)
        ax.set_title(title)
        ax.legend()
    histograms = {name: hist for name, hist in results["accepted_length_histogram"].items() if hist}
    bar = 0.8 / max(len(histograms), 1)
    for i, (name, hist) in enumerate(histograms.items()):
        lengths = sorted(int(k) for k in hist)
        total = sum(hist.values())
        axes[2].bar([length + i * bar for length in lengths], [hist[str(length)] / total for length in lengths],
                    bar, label=name)
    axes[2].set_title("tokens per step (accepted + bonus), fraction of steps")
    axes[2].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def load_eagle_drafts(args, methods, model) -> dict:
    """{bench method: EAGLE draft} for the eagle methods asked for, from --eagle-heads."""
    wanted = [m for m in methods if m in EAGLE_METHODS]
    if not wanted:
        return {}
    if not args.eagle_heads:
        raise SystemExit(f"--methods {','.join(wanted)} need --eagle-heads DIR[,DIR]")
    by_variant = {}
    for directory in args.eagle_heads.split(","):
        draft = load_heads(directory, model)
        if not isinstance(draft, EagleDraft):
            raise SystemExit(f"--eagle-heads: {directory} holds Medusa heads, not an EAGLE draft")
        by_variant[draft.config.variant] = draft
    missing = [m for m in wanted if EAGLE_METHODS[m] not in by_variant]
    if missing:
        raise SystemExit(f"--methods {','.join(missing)}: no {'/'.join(EAGLE_METHODS[m] for m in missing)} draft "
                         f"among --eagle-heads {args.eagle_heads}")
    return {m: by_variant[EAGLE_METHODS[m]] for m in wanted}


def hf_generate_batch(model, tokenizer, prompts: list[list[int]], max_new_tokens: int, eos: list[int]):
    """HF batched greedy `generate` on left-padded prompts; each row cut after its first EOS."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[0]
    ids, valid = left_pad(prompts, pad, model.device)
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=valid.long(), max_new_tokens=max_new_tokens,
                             do_sample=False, temperature=None, top_p=None, top_k=None, eos_token_id=eos,
                             pad_token_id=pad)[:, ids.shape[1]:].tolist()
    rows = []
    for row in out:
        stop = next((i for i, t in enumerate(row) if t in eos), None)
        rows.append(row if stop is None else row[: stop + 1])
    return rows


def command_line(argv) -> str:
    return "python scripts/bench.py " + " ".join(sys.argv[1:] if argv is None else argv)


def lookup_settings(args) -> dict:
    """How medusa_pld / eagle3_pld combined the lookup with the heads (scripts/results.py describes runs by it)."""
    return {"pld_combine": args.pld_combine, "pld_heads_tree": args.pld_heads_tree,
            "pld_trusted": [args.pld_trusted_ngram, args.pld_trusted_tokens] if args.pld_combine == "by-match" else None}


def run_batched(args, model, tokenizer, heads, methods, questions, eagle_drafts=None, argv=None) -> dict:
    """Throughput of decoding the first turns B at a time, every method on the same batches."""
    unknown = [m for m in methods if m not in BATCHED_METHODS]
    if unknown or args.temperature != 0:
        raise SystemExit(f"--batch-size: greedy (T=0) methods {', '.join(BATCHED_METHODS)} only (got {', '.join(methods)}, "
                         f"T={args.temperature})")
    eos = eos_token_ids(model, tokenizer)
    tree = json.loads(args.tree) if args.tree else None
    decoders = {"plain": BatchedTreeDecoder(model),
                "pld": BatchedTreeDecoder(model, candidates=PromptLookupCandidates(3, args.pld_tokens, model.device))}
    if heads:
        if len(heads) > 1 or next(iter(heads.values()))[0] is not model:
            raise SystemExit("--batch-size: one plain heads folder (a Medusa-2 folder: use its merged export)")
        head_set = next(iter(heads.values()))[1]
        decoders["medusa"] = medusa = BatchedTreeDecoder(model, head_set, tree)
        if "medusa_pld" in methods:
            decoders["medusa_pld"] = BatchedTreeDecoder(model, candidates=with_lookup(
                medusa.candidates, args, model.device, lookup_heads_of(args, head_set, model)))
    eagle_tree = eagle_tree_options(args.eagle_top_k, args.eagle_depth, args.eagle_tokens, args.eagle_min_prob)
    for method, draft in (eagle_drafts or {}).items():
        source = eagle_candidates(draft, model, eagle_tree)
        if method.endswith("_pld"):  # the EAGLE-2 tree with prompt lookup, as in single-row mode
            source = with_lookup(source, args, model.device)
        decoders[method] = BatchedTreeDecoder(model, candidates=source)
    prompts = [chat_input_ids(tokenizer, [{"role": "user", "content": q["turns"][0]}])[0].tolist() for q in questions]
    batches = [prompts[i:i + args.batch_size] for i in range(0, len(prompts), args.batch_size)]

    def run(method, batch):
        start = time.perf_counter()
        if method == "baseline":
            rows, row_forwards = hf_generate_batch(model, tokenizer, batch, args.max_new_tokens, eos), None
        else:
            decoder = decoders[method]
            rows = decoder.generate(batch, args.max_new_tokens, eos, pad_token_id=tokenizer.pad_token_id or 0)
            row_forwards = decoder.row_forwards
        return rows, time.perf_counter() - start, row_forwards

    for method in methods:  # warm-up
        run(method, batches[0][:2])
    totals = {m: {"tokens": 0, "seconds": 0.0, "row_forwards": 0, "same": 0, "rows": []} for m in methods}
    for batch in tqdm(batches, desc=f"batches of {args.batch_size}"):
        for method in methods:  # interleaved, so machine noise hits every method alike
            rows, seconds, row_forwards = run(method, batch)
            t = totals[method]
            t["tokens"] += sum(len(r) for r in rows)
            t["seconds"] += seconds
            t["row_forwards"] += row_forwards or 0
            t["rows"].extend(rows)
    base = totals["baseline"]
    results = {"command": command_line(argv), "model": args.model, "heads": args.heads,
               "eagle_heads": args.eagle_heads, "dtype": str(model.dtype), "cpu_verify": cpu_verify_settings(model),
               "temperature": 0.0, "max_new_tokens": args.max_new_tokens, **lookup_settings(args),
               "batch_size": args.batch_size, "questions": len(prompts), "machine": machine(),
               "date": datetime.datetime.now().isoformat(timespec="seconds"), "methods": {}}
    lines = [f"Model {args.model} ({model.dtype}), batch {args.batch_size}, greedy, max {args.max_new_tokens} new tokens, "
             f"{len(prompts)} first turns; {results['date']}, {results['machine']}.", "",
             "| method | total tokens/s | τ per row | speedup | greedy match |", "|---|---:|---:|---:|---:|"]
    for method in methods:
        t = totals[method]
        tps = t["tokens"] / t["seconds"]
        summary = {"tokens_per_s": tps, "new_tokens": t["tokens"], "seconds": t["seconds"],
                   "speedup": tps / (base["tokens"] / base["seconds"]),
                   "greedy_match": sum(a == b for a, b in zip(t["rows"], base["rows"])) / len(prompts)}
        if t["row_forwards"]:
            summary["tau"] = t["tokens"] / t["row_forwards"]
        results["methods"][method] = {"overall": summary}
        tau = f"{summary['tau']:.2f}" if "tau" in summary else "–"
        lines.append(f"| {method} | {tps:.1f} | {tau} | {summary['speedup']:.2f}x | {summary['greedy_match']:.2f} |")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "results.json", results)
    write_text(out / "results.md", "\n".join(lines) + "\n")
    print((out / "results.md").read_text())
    return results


def main(argv=None):
    args = parse_args(argv)
    methods = args.methods.split(",")
    for m in methods:
        if m not in METHODS:
            raise SystemExit(f"--methods: unknown method {m!r}; choose from {', '.join(METHODS)}")
    if any(m.startswith("medusa") for m in methods) and not args.heads:
        raise SystemExit("--methods medusa/medusa_pld need --heads DIR")
    try:  # before any model loads: a bad questions file stops the run at once
        questions = load_questions(args.questions, args.max_questions, args.skip_questions)
    except ValueError as err:
        raise SystemExit(f"--questions: {err}") from err
    tokenizer = load_tokenizer(args.model)
    model = load_base_model(args.model, args.dtype)
    heads = {}
    if any(m.startswith("medusa") for m in methods):
        for method, directory in parse_heads_sets(args.heads).items():
            target = load_adapted_base(load_base_model(args.model, args.dtype), directory) if adapter_of(directory) else model
            heads[method] = (target, load_medusa_heads(directory, base_model=target))
        if "medusa" in methods and "medusa" not in heads:  # `medusa` stands for every named set
            methods = [n for m in methods for n in (heads if m == "medusa" else [m])]
        methods += [own_baseline(m) for m, (target, _) in heads.items()
                    if target is not model and m in methods]
    for flag, tree in (("--tree", args.tree), ("--pld-heads-tree", args.pld_heads_tree)):
        for _, head_set in (heads.values() if tree else ()):  # before any decoding: can these heads fill it?
            try:
                check_tree_fits(json.loads(tree), head_set.config.num_heads, head_set.config.projected_vocab_size)
            except TreeError as err:
                raise SystemExit(f"{flag}: {err}") from err
    if "baseline" not in methods:
        methods = ["baseline"] + methods  # speedup is always against HF greedy in the same run
    eagle_drafts = load_eagle_drafts(args, methods, model)
    # every method, the baseline included, runs on the same (packed or plain) weights
    prepare_cpu_verify(model, *(m for pair in heads.values() for m in pair), *eagle_drafts.values(),
                       enabled=not args.untuned_cpu)
    if args.batch_size:
        return run_batched(args, model, tokenizer, heads, methods, questions, eagle_drafts, argv)
    runner = Runner(args, model, tokenizer, heads, eagle_drafts)

    for method in methods:  # warm-up: first calls allocate and tune kernels
        runner.run_question(method, {**questions[0], "turns": questions[0]["turns"][:1]})
    records = {m: [] for m in methods}
    for question in tqdm(questions, desc="questions"):
        for method in methods:  # interleaved, so machine noise hits every method alike
            records[method].append(runner.run_question(method, question))

    greedy = args.temperature == 0
    results = {"command": command_line(argv),
               "model": args.model, "heads": args.heads, "eagle_heads": args.eagle_heads, "dtype": str(model.dtype),
               "cpu_verify": cpu_verify_settings(model), "temperature": args.temperature,
               "max_new_tokens": args.max_new_tokens, **lookup_settings(args),
               "questions": len(questions), "machine": machine(),
               "date": datetime.datetime.now().isoformat(timespec="seconds"), "methods": {},
               "accepted_length_histogram": {}}
    for method in methods:
        base = records[reference_of(method, methods)] if method != "baseline" else None
        by_category = defaultdict(list)
        for i, r in enumerate(records[method]):
            by_category[r["category"]].append(i)
        per_category = {c: summarise([records[method][i] for i in idx],
                                     [base[i] for i in idx] if base else None, greedy)
                        for c, idx in sorted(by_category.items())}
        results["methods"][method] = {"overall": summarise(records[method], base, greedy), "per_category": per_category}
        hist = defaultdict(int)
        for r in records[method]:
            for t in r["turns"]:
                for a in t["accepted"]:
                    hist[str(a)] += 1
        results["accepted_length_histogram"][method] = dict(hist)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "results.json", results)
    write_text(out / "records.json", json.dumps(records))
    write_markdown(results, out / "results.md")
    write_plot(results, out / "results.png")
    print((out / "results.md").read_text())
    return results


if __name__ == "__main__":
    main()

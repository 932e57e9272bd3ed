"""Regenerate the results pages from finished training runs and benchmarks.

    python scripts/results.py --run runs/smollm2-135m-medusa1 [--run runs/smollm2-135m-eagle3 ...] \
        [--bench runs/bench-eagle ...] [--readme README.md] [--page docs/results.md]

Reads each run's eval.json and train_config.json (Medusa or EAGLE; a saved heads folder such as
heads/trained/<name> works too), and each extra benchmark's
results.json/results.md, and replaces the text between the results markers of docs/results.md (--page) with
the tables, the commands, date and machine, and between the README's markers with the summary table alone.

--store data/benchmarks copies each benchmark's results.json and results.md there first (runs/ is not
committed) and names the copies in the section's command, so a fresh clone regenerates the same section.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shutil
import sys
from pathlib import Path

from specheads.heads.files import write_text

from . import ablation, curves
from .ablation import AblationError, load_records, read_records, render_ablation, store_arm
from .curves import render_curves, store_curve
from .report import machine, noise_line, write_results


class ResultsError(ValueError):
    """A run, benchmark folder or results page that cannot be rendered as asked: names the folder or file."""

START, END = "<!-- results:start -->", "<!-- results:end -->"
# Vicuna-7B, 5 heads, ShareGPT (Medusa paper, via shared/REFERENCE.md)
VICUNA_TOP1 = [0.56, 0.32, 0.20, 0.15, 0.12]
VICUNA_TOP5 = [0.78, 0.56, 0.42, 0.34, 0.30]


def stored_heads_config(run: Path) -> dict:
    """The heads' config.json (with what build_tree.py / tune_eagle_tree.py stored there), {} if absent.

    `run` is a training run folder (heads/ inside) or a saved heads folder such as heads/trained/<name>.
    """
    for path in (run / "heads" / "config.json", run / "config.json"):
        if path.is_file():
            return json.loads(path.read_text())
    return {}


def heldout_result(run: Path) -> dict:
    """The run's eval.json, or for a saved heads folder the held-out accuracy its config.json carries."""
    if (run / "eval.json").is_file():
        return json.loads((run / "eval.json").read_text())
    stored = stored_heads_config(run).get("heldout_accuracy")
    if stored is None:
        raise ResultsError(f"{run}: neither eval.json nor a config.json with heldout_accuracy")
    return stored


def trained_by(run: Path, script: str) -> str:
    """Where the numbers come from: a training run's output folder, or a committed heads folder and its recipe."""
    if (run / "eval.json").is_file():
        return f"`python {script} --config ...` -> {run}"
    return f"committed as {run}, recipe in {run.parent / 'README.md'}"


def render_eagle(run: Path, result: dict, config: dict) -> str:
    data, eagle = config["data"], config["eagle"]
    rows = ["| draft step | top-1 | top-5 |", "|---:|---:|---:|"]
    rows += [f"| {k + 1} | {t1:.3f} | {t5:.3f} |" for k, (t1, t5) in enumerate(zip(result["top1"], result["top5"]))]
    details = f", draft vocabulary {eagle['draft_vocab_size']}" if eagle["variant"] == "eagle3" else ""
    if eagle.get("greedy_target_weight"):
        details += f", {eagle['greedy_target_weight']:g} of the target on the base's argmax"
    if eagle.get("init_draft"):
        details += f", starting from {eagle['init_draft']}"
    lines = [f"{eagle['variant'].upper()} draft on **{config['model']['name']}** ({data['dataset']}, "
             f"{data['max_train_conversations'] or 'all'} training conversations, {config['train']['epochs']:g} epochs, "
             f"training-time test {eagle['ttt_steps']} steps{details}; {trained_by(run, 'train/eagle.py')}). "
             f"Held-out: how often draft step i's top-1/top-5 holds the base's greedy token, the draft fed its own "
             f"features ({int(result['tokens'][0])} assistant tokens):", "", *rows]
    if "throughput" in result:
        tp = result["throughput"]
        lines += ["", f"Training throughput (last process run): {tp['samples_per_s']:.2f} samples/s."]
    tuned = stored_heads_config(run).get("eagle_tree_measurements")
    if tuned:
        lines += ["", f"Tree shapes timed by `scripts/tune_eagle_tree.py` (plain decoding {tuned['plain_tokens_per_s']:.1f} "
                  "tokens/s in the same run; max nodes, fewer where min_prob leaves unlikely ones out):", "",
                  "| top_k | depth | nodes | min_prob | τ | tokens/s | vs plain |", "|---:|---:|---:|---:|---:|---:|---:|"]
        lines += [f"| {c['top_k']} | {c['depth']} | {c['total_tokens']} | {c.get('min_prob', 0.0):g} | {c['tau']:.2f} | "
                  f"{c['tokens_per_s']:.1f} | {c['speedup']:.2f}x |" for c in tuned["candidates"]]
    return "\n".join(lines)


def render_bench(directory: Path) -> str:
    results = json.loads((directory / "results.json").read_text())
    command = results.get("command", "scripts/bench.py")
    note = ""
    if "pld_combine" not in results and "_pld" in command:  # run before --pld-combine existed: always merged
        note = " (run before `--pld-combine`: medusa_pld/eagle3_pld are merged trees, as `--pld-combine merge` now)"
    elif results.get("pld_combine") == "first" and "_pld" in command and "--pld-combine" not in command:
        note = " (run when `--pld-combine first` was the default: the lookup chain whenever it matches, else the heads)"
    return "\n".join([f"Benchmark `{command}`{note}:", "", (directory / "results.md").read_text().strip()])


def questions_file(results: dict) -> str:
    """The question file a run answered: recorded since the test split existed, read from older runs' command."""
    if results.get("questions_file"):
        return results["questions_file"]
    words = results.get("command", "").split()
    return words[words.index("--questions") + 1] if "--questions" in words[:-1] else "data/questions/sharegpt-dev.jsonl"


def split_of(results: dict) -> str:
    """"test" for a run on a test split (questions nobody tuned on, data/questions/README.md), "tune" for a run
    that chose a setting (its own table only: the summary would mix the settings it compared), else "dev"."""
    stem = Path(questions_file(results)).stem
    return "test" if stem.endswith("-test") else "tune" if stem.endswith("-tune") else "dev"


def summary_rows(bench_dirs: list[Path], split: str | None = None) -> dict[tuple, tuple[dict, Path]]:
    """For each (model, temperature, method), the row of the benchmark with the most questions, latest on ties;
    only runs on `split` ("dev" or "test") when given.

    Not the fastest run: that would pick each method's luckiest question set. Every speedup is against HF
    `generate` in the same process run, so rows from different runs compare.
    """
    chosen: dict[tuple, tuple[dict, Path, tuple]] = {}
    for directory in bench_dirs:
        results = json.loads((directory / "results.json").read_text())
        if results.get("batch_size") or results.get("experiment"):  # throughput runs (no categories) and
            continue  # experiments (drafts not committed) stay in their own tables
        if split is not None and split_of(results) != split:
            continue
        rank = (results.get("questions", 0), results.get("date", ""))
        unpacked = results["methods"].get("hf_unpacked")
        for method, row in results["methods"].items():
            key = (results["model"], results["temperature"], method)
            if key not in chosen or rank >= chosen[key][2]:
                if unpacked:  # the same run's HF generate on stock linears: what a user without specheads gets
                    ratio = row["overall"]["tokens_per_s"] / unpacked["overall"]["tokens_per_s"]
                    row = {**row, "overall": {**row["overall"], "vs_unpacked": ratio}}
                chosen[key] = (row, directory, rank)
    return {key: (row, directory) for key, (row, directory, _) in chosen.items()}


SPLIT_TITLES = {"test": "test questions, never tuned on", "dev": "dev questions, tuned on"}


def render_summary(bench_dirs: list[Path]) -> str:
    """One table per split, model and temperature: every method's run from summary_rows, with its speedup per
    category; the test split first."""
    sections = []
    for split in ("test", "dev"):
        best = summary_rows(bench_dirs, split)
        sections += summary_tables(best, SPLIT_TITLES[split]) + temperature_tables(best, SPLIT_TITLES[split])
    return "\n\n".join(["### Summary: each method in its largest benchmark (latest on ties)", *sections, "### Benchmarks"])


def temperature_tables(best: dict, title: str) -> list[str]:
    """Per model: how much of each method's greedy τ and speedup survives sampling (T=1 against T=0)."""
    sections = []
    for model in sorted({m for m, _, _ in best}):
        methods = [k[2] for k in best if k[:2] == (model, 0.0) and (model, 1.0, k[2]) in best
                   and not k[2].startswith(("baseline", "hf_unpacked"))]
        if not methods:
            continue
        rows = [f"**{model}**, {title}: sampling (T=1) against greedy (T=0)", "",
                "| method | τ T=0 | τ T=1 | τ(T=1)/τ(T=0) | speedup T=0 | speedup T=1 | questions T=0 / T=1 |",
                "|---|---:|---:|---:|---:|---:|---:|"]
        for method in sorted(methods, key=lambda m: -best[(model, 1.0, m)][0]["overall"]["tau"]):
            greedy, sampled = best[(model, 0.0, method)][0]["overall"], best[(model, 1.0, method)][0]["overall"]
            rows.append(f"| {method} | {greedy['tau']:.2f} | {sampled['tau']:.2f} | {sampled['tau'] / greedy['tau']:.2f} "
                        f"| {greedy['speedup']:.2f}x | {sampled['speedup']:.2f}x | {greedy.get('questions', '?')} / {sampled.get('questions', '?')} |")
        sections.append("\n".join(rows))
    return sections


def summary_tables(best: dict, title: str) -> list[str]:
    sections = []
    for model, temperature in sorted({(m, t) for m, t, _ in best}):
        keys = [key for key in best if key[:2] == (model, temperature)]
        categories = sorted({c for key in keys for c in best[key][0]["per_category"]})
        rows = [f"**{model}**, T={temperature:g}, {title} (speedup against HF `generate` on the same packed model in the same "
                "run, τ in brackets; vs unpacked: against HF `generate` on stock PyTorch linears, where the run had it):", "",
                "| method | τ | tokens/s | speedup | vs unpacked | " + " | ".join(categories) + " | run |",
                "|---|---:|---:|---:|---:|" + "---:|" * len(categories) + "---|"]
        for key in sorted(keys, key=lambda k: -best[k][0]["overall"]["speedup"]):
            row, directory = best[key]
            overall, per_category = row["overall"], row["per_category"]
            cells = [f"{per_category[c]['speedup']:.2f}x ({per_category[c]['tau']:.2f})" if c in per_category else "–"
                     for c in categories]
            stock = f"{overall['vs_unpacked']:.2f}x" if "vs_unpacked" in overall else "–"
            rows.append(f"| {key[2]} | {overall['tau']:.2f} | {overall['tokens_per_s']:.1f} | "
                        f"**{overall['speedup']:.2f}x** | {stock} | " + " | ".join(cells) + f" | {directory.name} |")
        sections.append("\n".join(rows))
    return sections


HEADLINE_PEERS = ("hf_prompt_lookup", "prompt_lookup", "hf_assisted")


def interval(overall: dict) -> str:
    low_high = overall.get("speedup_ci95")
    return f" ({low_high[0]:.2f}-{low_high[1]:.2f})" if low_high else ""


def render_headline(bench_dirs: list[Path], ours_per_row: int = 3, split: str = "test") -> str:
    """The README's one table: per model and temperature, our fastest methods and HF's own speculative peers,
    each from its largest benchmark on `split` (summary_rows), the speedup's 95% interval over questions beside
    it, then how noisy each run's machine was."""
    best = summary_rows(bench_dirs, split)
    lines = ["| model | T | method | τ | speedup vs HF `generate` (95% interval) | same tokens as HF greedy | "
             "questions (run) |", "|---|---:|---|---:|---:|---:|---|"]
    for model, temperature in sorted({(m, t) for m, t, _ in best}):
        keys = sorted((key for key in best if key[:2] == (model, temperature)),
                      key=lambda k: -best[k][0]["overall"]["speedup"])
        ours = [k for k in keys if not k[2].startswith(("baseline", "hf_")) and k[2] not in HEADLINE_PEERS]
        for key in ours[:ours_per_row] + [k for k in keys if k[2] in HEADLINE_PEERS]:
            row, directory = best[key]
            overall = row["overall"]
            match = f"{overall['greedy_match']:.2f}" if "greedy_match" in overall else "–"
            lines.append(f"| {model} | {temperature:g} | {key[2]} | {overall['tau']:.2f} | {overall['speedup']:.2f}x"
                         f"{interval(overall)} | {match} | {overall['questions']} ({directory.name}) |")
    runs = sorted({directory for _, directory in best.values()})
    noise = [f"{d.name}: {noise_line(json.loads((d / 'results.json').read_text()))}" for d in runs]
    return "\n".join(lines + [""] + [f"- {line}" for line in noise])


def render(run: Path) -> str:
    result = heldout_result(run)
    config = json.loads((run / "train_config.json").read_text())
    if "eagle" in config:
        return render_eagle(run, result, config)
    rows = ["| head | top-1 | top-5 | Vicuna-7B top-1 / top-5 |", "|---:|---:|---:|---:|"]
    for k, (t1, t5) in enumerate(zip(result["top1"], result["top5"])):
        ref = f"{VICUNA_TOP1[k]:.2f} / {VICUNA_TOP5[k]:.2f}" if k < len(VICUNA_TOP1) else ""
        rows.append(f"| {k + 1} | {t1:.3f} | {t5:.3f} | {ref} |")
    data, heads, train = config["data"], config["heads"], config["train"]
    heads_config = stored_heads_config(run)
    vocabulary = ""
    if heads_config.get("draft_vocab_size"):
        vocabulary = f", draft vocabulary {heads_config['draft_vocab_size']}"
        if not heads.get("draft_vocab_size"):  # given after training
            coverage = heads_config.get("draft_vocab_heldout_coverage")
            vocabulary += (" (given after training by scripts/draft_vocab.py" +
                           (f", {coverage:.1%} of held-out answer tokens)" if coverage is not None else ")"))
    medusa2 = config.get("mode") == "medusa2"
    kind = "Medusa-2 heads (joint with LoRA r={r}, λ0={l}, {b} base loss)".format(
        r=config["lora"]["r"], l=config["joint"]["heads_weight"], b=config["joint"]["base_loss"]) if medusa2 else "Medusa-1 heads"
    lines = [
        f"{kind} on **{config['model']['name']}**, {heads['num_heads']} heads x {heads['num_layers']} block, "
        f"{'own' if heads['own_lm_head'] else 'shared'} lm_head{vocabulary}, {data['dataset']} "
        f"({data['max_train_conversations'] or 'all'} training conversations, {train['epochs']:g} epoch(s), "
        f"max {data['max_length']} tokens; {trained_by(run, 'train/medusa.py')}), "
        f"held-out per-head accuracy on {int(result['tokens'][0])} assistant tokens:",
        "",
        *rows,
        "",
        f"Estimated chain τ (1 + Σ_k Π_j≤k top-1_j): **{result['estimated_tau']:.2f}**.",
    ]
    if medusa2:
        lines.append(f"Held-out LM loss of the base: {result['lm_loss_before']:.4f} without the adapter, "
                     f"{result['lm_loss_after']:.4f} with it.")
    if "throughput" in result:
        tp = result["throughput"]
        lines.append(f"Training throughput: **{tp['samples_per_s']:.2f} samples/s** "
                     f"({tp['tokens_per_s']:.0f} tokens/s, {tp['samples']} samples in {tp['seconds']:.0f} s, "
                     f"{tp['processes']} process).")
    selection = heads_config.get("tree_selection", {})
    timed = [row for row in selection.get("budgets", []) if "measured_speedup" in row]
    if timed:
        lines += ["", f"Tree budgets by `scripts/build_tree.py` (estimate from teacher-forced statistics and forward "
                  f"timings, then the best {len(timed)} decoded for real against plain decoding; chosen by "
                  f"{selection.get('chosen_by', 'timed')}: {len(heads_config['tree']) + 1} nodes):", "",
                  "| nodes | estimated τ | estimated speedup | measured τ | measured vs plain |", "|---:|---:|---:|---:|---:|"]
        lines += [f"| {row['nodes']} | {row['estimated_tau']:.2f} | {row['estimated_speedup']:.2f}x | {row['measured_tau']:.2f} | "
                  f"{row['measured_speedup']:.2f}x |" for row in timed]
    bench = run / "bench" / "results.md"
    if bench.is_file():
        lines += ["", "Decoding benchmark (`scripts/bench.py`, same process, HF greedy `generate` is the baseline):",
                  "", bench.read_text().strip()]
    if run == Path("runs/smollm2-135m-medusa1"):
        lines += ["", "Produced by `make demo` (training, `scripts/build_tree.py`, `scripts/bench.py`)."]
    return "\n".join(lines)


def store_benchmarks(bench_dirs: list[Path], store: Path) -> list[Path]:
    """Copy each benchmark's results.json and results.md to store/<its folder name>; return the copies."""
    names = [directory.name for directory in bench_dirs]
    if len(set(names)) != len(names):
        raise ResultsError(f"--store: two benchmarks share a folder name ({names}); their copies would overwrite")
    copies = []
    for directory in bench_dirs:
        copy = store / directory.name
        if directory.resolve() != copy.resolve():
            copy.mkdir(parents=True, exist_ok=True)
            for name in ("results.json", "results.md"):
                shutil.copyfile(directory / name, copy / name)
        copies.append(copy)
    return copies


def refigure(directory: Path) -> None:
    """Recompute a single-row run's per-method figures from its records.json (the same code as the run itself),
    keeping its header and noise measure: for a run made before a figure (e.g. step_cost) existed."""
    from .runner import method_results

    results = json.loads((directory / "results.json").read_text())
    records = json.loads((directory / "records.json").read_text())
    results.update(method_results(records, list(results["methods"]), greedy=results["temperature"] == 0))
    write_results(directory, results, records)


def replace_between_markers(path: Path, section: str, start: str = START, end: str = END) -> None:
    """The text between path's markers (the results ones by default) becomes `section` (temp file + rename)."""
    text = path.read_text()
    if start not in text or end not in text:
        raise ResultsError(f"{path}: markers {start} ... {end} are missing")
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    write_text(path, f"{head}{start}\n{section}\n{end}{tail}")


def main(argv=None) -> None:
    try:
        regenerate(argv)
    except (ResultsError, AblationError, FileNotFoundError) as err:
        raise SystemExit(f"results.py: {err}") from None


def regenerate(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", action="append", type=Path, help="training run folder (repeatable)")
    parser.add_argument("--bench", action="append", default=[], type=Path, help="extra bench.py --out folder (repeatable)")
    parser.add_argument("--store", type=Path, help="copy the benchmarks' results here (e.g. data/benchmarks) and read the copies")
    parser.add_argument("--refigure", action="store_true",
                        help="first recompute each --bench folder's figures from its records.json, where it has one")
    parser.add_argument("--readme", default="README.md", type=Path, help="gets the summary table")
    parser.add_argument("--page", default="docs/results.md", type=Path, help="gets every table")
    parser.add_argument("--ablation", action="append", default=[], type=Path,
                        help="a finished ablation arm's run folder (repeatable): its record is stored in --ablation-store")
    parser.add_argument("--ablation-store", default=Path("data/ablation"), type=Path,
                        help="the ablation arms' records; their table is rendered into --page whenever it has any")
    parser.add_argument("--curve", action="append", default=[], type=Path,
                        help="a training run folder whose evaluations (evaluations.jsonl) are stored in --curve-store")
    parser.add_argument("--curve-store", default=Path("data/curves"), type=Path,
                        help="the runs' evaluation records; their τ-against-updates table is rendered into --page")
    args = parser.parse_args(argv)
    for arm in args.ablation:
        store_arm(arm, args.ablation_store)
    for run in args.curve:
        path, kept = store_curve(run, args.curve_store)
        if kept is not None:
            print(f"results.py: {path} kept: it reaches update {curves.last_step(kept)}, "
                  f"{run} (the same config) not yet", file=sys.stderr)
    runs = args.run or [Path("runs/smollm2-135m-medusa1")]
    for directory in args.bench:
        if not (directory / "results.json").is_file():
            raise ResultsError(f"--bench {directory}: no results.json (a scripts/bench.py --out folder is expected)")
        if args.refigure and (directory / "records.json").is_file():
            refigure(directory)
    if args.store:
        args.bench = store_benchmarks(args.bench, args.store)
    command = "python scripts/results.py " + " ".join(
        [f"--run {run}" for run in runs] + [f"--bench {b}" for b in args.bench])
    summary = [render_summary(args.bench)] if args.bench else []
    section = "\n\n".join(summary + [render_bench(b) for b in args.bench] + ["### Training runs"]
                           + [render(run) for run in runs]
                           + [f"This section: `{command}`; {datetime.date.today()}, {machine()}."])
    replace_between_markers(args.page, section)
    if args.ablation_store.is_dir():
        replace_between_markers(args.page, render_ablation(load_records(args.ablation_store)), ablation.START,
                                ablation.END)
    if args.curve_store.is_dir():
        replace_between_markers(args.page, render_curves(read_records(args.curve_store)), curves.START, curves.END)
    headline = [render_headline(args.bench)] if args.bench else []
    replace_between_markers(args.readme, "\n\n".join(
        headline + [f"Every table, the training runs and the command that regenerates them: [{args.page}]({args.page})."]))
    print(section)

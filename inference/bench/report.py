"""What a benchmark run reports: per-method summaries, the run's header, results.json / results.md / results.png.

Single-row runs (one question at a time) and batched runs (--batch-size) share the header (`run_header`),
the writer (`write_results`) and the first line of results.md (`header_line`); their tables differ: a single-row
run reports the mean of per-question tokens/s and a table per category, a batched run total tokens over total
seconds.
"""

from __future__ import annotations

import datetime
import json
import platform
import random
import statistics
from pathlib import Path

import torch

from specheads.heads.files import write_json, write_text
from specheads.inference.cpu_verify import cpu_verify_settings


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
        summary["speedup_ci95"] = speedup_interval(tokens_per_s, [b["new_tokens"] / b["seconds"] for b in baseline])
        if greedy:
            same = [[t["tokens"] for t in r["turns"]] == [t["tokens"] for t in b["turns"]]
                    for r, b in zip(records, baseline)]
            summary["greedy_match"] = sum(same) / len(same)
        cost = step_cost(steps, baseline)
        if cost:
            summary["step_cost"] = cost
    return summary


def step_cost(steps: list[dict], baseline: list[dict]) -> dict | None:
    """Where one decode step's time goes, in units of HF greedy's time per token on the same questions: the
    base's forward over the tree (verify), the draft proposing (draft) and the rest (acceptance, cache); a method's
    speedup is about τ / (verify + draft + rest), so this says whether draft accuracy (τ), verify cost or draft
    cost limits it."""
    count = sum(len(t["accepted"]) for t in steps)
    per_token = sum(b["seconds"] for b in baseline) / max(sum(b["new_tokens"] for b in baseline), 1)
    if not count or per_token <= 0:
        return None
    verify, draft, total = (sum(t[key] for t in steps) / count / per_token
                            for key in ("verify_seconds", "draft_seconds", "step_seconds"))
    return {"verify": verify, "draft": draft, "rest": total - verify - draft}


NOISE_BOUND = 0.10  # default of bench --noise-bound: see machine_noise
NOISE_MIN_TOKENS = 16  # shorter answers are left out of the baseline's spread: their time is mostly fixed costs
BOOTSTRAP_SAMPLES = 2000


def spread(values: list[float]) -> dict | None:
    """min / median / max and the coefficient of variation (population stdev / mean); None under 2 values."""
    if len(values) < 2:
        return None
    mean = statistics.fmean(values)
    return {"min": min(values), "median": statistics.median(values), "max": max(values),
            "cv": statistics.pstdev(values) / mean if mean > 0 else 0.0}


def speedup_interval(rates: list[float], base_rates: list[float], samples: int = BOOTSTRAP_SAMPLES) -> list[float]:
    """95% bootstrap interval of mean(rates) / mean(base_rates), resampling questions (paired, fixed seed).

    It says how much the speedup depends on which questions were drawn: the same method on another draw of
    questions like these would land inside it about 19 times in 20. It does not cover machine noise that
    slowed every method alike.
    """
    rng = random.Random(0)
    n = len(rates)
    ratios = []
    for _ in range(samples):
        picks = [rng.randrange(n) for _ in range(n)]
        ratios.append(sum(rates[i] for i in picks) / sum(base_rates[i] for i in picks))
    ratios.sort()
    return [ratios[int(0.025 * samples)], ratios[int(0.975 * samples) - 1]]


def machine_noise(probe_seconds: list[float], baseline: list[dict], bound: float = NOISE_BOUND,
                  min_tokens: int = NOISE_MIN_TOKENS) -> dict:
    """How much the machine itself moved over the run, and whether that exceeds `bound`.

    Before each question the runner times the same fixed forward of the base model (runner.Probe): the text
    never changes, so the spread of those times is the machine alone (other jobs, frequency, caches). The
    measure is their coefficient of variation (population stdev / mean); a machine busy for part of the run,
    the case that skews methods interleaved across it, raises it, while a machine uniformly slower for the
    whole run is not flagged (it slows every method alike). The spread of HF greedy's per-question tokens/s
    is reported beside it but not used for the flag: it mixes in prompt length (prefill inside the timed
    call), and read CV 0.21 on an idle machine.
    -> {"probe_seconds": spread, "probes", "baseline_tokens_per_s": spread (answers of >= min_tokens),
    "bound", "noisy"}.
    """
    rates = [r["new_tokens"] / r["seconds"] for r in baseline if r["new_tokens"] >= min_tokens and r["seconds"] > 0]
    probe = spread(probe_seconds)
    return {"probe_seconds": probe, "probes": len(probe_seconds), "baseline_tokens_per_s": spread(rates),
            "min_new_tokens": min_tokens, "bound": bound, "noisy": bool(probe and probe["cv"] > bound)}


def noise_line(results: dict) -> str:
    """One line of results.md saying how steady the machine was over the run (a warning above the bound)."""
    noise = results.get("noise")
    if not noise or not noise.get("probe_seconds"):
        return "Machine noise: not measured."
    p = noise["probe_seconds"]
    figures = (f"a fixed probe forward timed before each of {noise['probes']} questions varied by CV {p['cv']:.2f} "
               f"(min {1e3 * p['min']:.1f} ms, median {1e3 * p['median']:.1f} ms, max {1e3 * p['max']:.1f} ms; "
               f"bound {noise['bound']:.2f})")
    if noise["noisy"]:
        return (f"**Noisy run:** {figures}: the machine was busy for part of the run, so per-question and per-method "
                f"differences of that size may be noise.")
    return f"Machine noise: {figures}."


def machine() -> str:
    cpu = platform.machine()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{cpu}, {torch.get_num_threads()} threads"


def run_header(args, model, command: str, questions: int) -> dict:
    """What every results.json starts with: how the run was made and on what."""
    header = {"command": command, "model": args.model, "questions_file": str(args.questions),
              "heads": args.heads, "eagle_heads": args.eagle_heads,
              "dtype": str(model.dtype), "device": str(model.device), "cpu_verify": cpu_verify_settings(model),
              "temperature": args.temperature, "max_new_tokens": args.max_new_tokens,
              "pld_combine": args.pld_combine, "pld_heads_tree": args.pld_heads_tree,
              "pld_trusted": ([args.pld_trusted_ngram, args.pld_trusted_tokens]
                              if args.pld_combine == "by-match" else None)}
    if args.batch_size:
        header["batch_size"] = args.batch_size
    if args.experiment:
        header["experiment"] = args.experiment
    return {**header, "questions": questions, "machine": machine(),
            "date": datetime.datetime.now().isoformat(timespec="seconds"), "methods": {}}


def header_line(results: dict) -> str:
    mode = (f"batch {results['batch_size']}, greedy" if results.get("batch_size")
            else f"T={results['temperature']}")
    unit = "first turns" if results.get("batch_size") else "questions"
    return (f"Model {results['model']} ({results['dtype']}), {mode}, max {results['max_new_tokens']} new tokens, "
            f"{results['questions']} {unit}; {results['date']}, {results['machine']}.")


def single_markdown(results: dict) -> list[str]:
    """results.md of a single-row run: the overall table, then speedup (τ) per category."""
    methods = results["methods"]
    categories = sorted({c for m in methods.values() for c in m["per_category"]})
    lines = [header_line(results), "", noise_line(results), "",
             "| method | τ | tokens/s | speedup | 95% interval (questions) | greedy match | step / (forward + draft) |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for name, m in methods.items():
        o = m["overall"]
        match = f"{o['greedy_match']:.2f}" if "greedy_match" in o else "–"
        overhead = f"{o['step_overhead']:.3f}" if "step_overhead" in o else "–"
        interval = f"{o['speedup_ci95'][0]:.2f}-{o['speedup_ci95'][1]:.2f}" if "speedup_ci95" in o else "–"
        lines.append(f"| {name} | {o['tau']:.2f} | {o['tokens_per_s']:.1f} | {o.get('speedup', 1.0):.2f}x | {interval} "
                     f"| {match} | {overhead} |")
    if "hf_unpacked" in methods:
        stock = methods["hf_unpacked"]["overall"]["tokens_per_s"]
        lines += ["", f"Against `hf_unpacked` (HF `generate` on stock PyTorch linears, {stock:.1f} tokens/s): " + ", ".join(
            f"{name} {m['overall']['tokens_per_s'] / stock:.2f}x" for name, m in methods.items() if name != "hf_unpacked") + "."]
    costs = {name: m["overall"]["step_cost"] for name, m in methods.items() if "step_cost" in m["overall"]}
    if costs:
        lines += ["", "A step's time in HF greedy's time per token (speedup ≈ τ / step): what limits each method.", "",
                  "| method | τ | verify | draft | rest | step | τ / step |", "|---|---:|---:|---:|---:|---:|---:|"]
        for name, c in costs.items():
            tau, total = methods[name]["overall"]["tau"], c["verify"] + c["draft"] + c["rest"]
            lines.append(f"| {name} | {tau:.2f} | {c['verify']:.2f} | {c['draft']:.2f} | {c['rest']:.2f} | {total:.2f} "
                         f"| {tau / total:.2f} |")
    lines += ["", "Speedup (τ) per category:", "", "| method | " + " | ".join(categories) + " |",
              "|---|" + "---:|" * len(categories)]
    for name, m in methods.items():
        cells = []
        for c in categories:
            s = m["per_category"].get(c)
            cells.append(f"{s.get('speedup', 1.0):.2f}x ({s['tau']:.2f})" if s else "–")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def batched_markdown(results: dict) -> list[str]:
    """results.md of a batched run: total tokens/s, τ per row, speedup and greedy match per method."""
    lines = [header_line(results), "",
             "| method | total tokens/s | τ per row | speedup | greedy match |", "|---|---:|---:|---:|---:|"]
    for method, m in results["methods"].items():
        s = m["overall"]
        tau = f"{s['tau']:.2f}" if "tau" in s else "–"
        lines.append(f"| {method} | {s['tokens_per_s']:.1f} | {tau} | {s['speedup']:.2f}x | {s['greedy_match']:.2f} |")
    return lines


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


def write_results(out, results: dict, records: dict | None = None) -> str:
    """OUT/results.json and results.md (single-row runs also records.json and results.png), each written to a
    temporary file and renamed; returns the markdown."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    markdown = "\n".join(batched_markdown(results) if results.get("batch_size") else single_markdown(results)) + "\n"
    write_json(out / "results.json", results)
    if records is not None:
        write_text(out / "records.json", json.dumps(records))
    write_text(out / "results.md", markdown)
    if not results.get("batch_size"):
        write_plot(results, out / "results.png")
    return markdown

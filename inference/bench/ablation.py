"""The τ-per-datum ablation table (docs/results.md, `make ablation`): one row per arm, each a draft trained from the
same base config with one lever changed (recipes.mk ABLATION_ARMS), judged by its held-out rollout τ at T=0 / T=1
and its test-split benchmark.

An arm's record (data/ablation/<arm>.json) is what a fresh clone needs to render its row: the arm's training
config, its eval.json, its updates and its benchmarks' overall and per-category figures. The lever column is
read from the records themselves: the config keys where an arm differs from the `base` arm.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from specheads.heads.files import write_text

START, END = "<!-- ablation:start -->", "<!-- ablation:end -->"
BASE_ARM = "base"
# Keys that name where a run lives, not what it trains.
NOT_LEVERS = {"train.output_dir"}
# Settings added to the trainer after an arm was recorded, with the value every run had before them (the base arm
# predates `eagle.num_layers`).
ADDED_SETTINGS = {"eagle.num_layers": 1}


class AblationError(ValueError):
    """An arm's run folder or record that cannot be read as asked: names the folder or file."""


def _flat(tree: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flat(value, f"{name}."))
        else:
            out[name] = value
    return out


def updates_of(run: Path) -> int:
    """The optimizer updates the run finished: its last checkpoint's step."""
    steps = [int(m.group(1)) for p in (run / "checkpoints").glob("step-*") if (m := re.fullmatch(r"step-(\d+)", p.name))]
    if not steps:
        raise AblationError(f"{run}: no checkpoints/step-N folder, so the updates it made are unknown")
    return max(steps)


def bench_figures(directory: Path) -> dict:
    """A bench.py --out folder's figures for the record: per method the overall and per-category τ and speedup."""
    results = json.loads((directory / "results.json").read_text())
    methods = {}
    for name, figures in results["methods"].items():
        overall = figures["overall"]
        methods[name] = {"tau": overall["tau"], "speedup": overall.get("speedup"),
                         "tokens_per_s": overall["tokens_per_s"], "questions": overall["questions"],
                         "per_category": {c: {"tau": f["tau"], "speedup": f.get("speedup")}
                                          for c, f in figures.get("per_category", {}).items()}}
    return {"command": results.get("command", ""), "temperature": results["temperature"],
            "noise": results.get("noise"), "methods": methods}


def record_arm(run: Path) -> dict:
    """The record of one finished arm: `run` holds train_config.json, eval.json, checkpoints/ and bench-t*/."""
    for name in ("train_config.json", "eval.json"):
        if not (run / name).is_file():
            raise AblationError(f"{run}: no {name} (is the arm's training finished?)")
    evaluation = json.loads((run / "eval.json").read_text())
    benches = {d.name: bench_figures(d) for d in sorted(run.glob("bench-t*")) if (d / "results.json").is_file()}
    if not benches:
        raise AblationError(f"{run}: no bench-t0/results.json (the arm's test-split benchmark)")
    keep = ("top1", "tau_t0", "tau_t1", "accept_positions", "throughput", "tokens")
    return {"arm": run.name, "config": json.loads((run / "train_config.json").read_text()),
            "updates": updates_of(run), "eval": {k: evaluation[k] for k in keep if k in evaluation},
            "benches": benches}


def write_record(store: Path, name: str, record: dict) -> Path:
    """store/<name>.json (temp file + rename): a record a fresh clone renders from (an arm's, a curve's)."""
    path = store / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, json.dumps(record, indent=1) + "\n")
    return path


def read_record(path: Path) -> dict:
    """One stored record; a file that is not JSON is named."""
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise AblationError(f"{path}: not valid JSON: {err}") from err


def read_records(store: Path) -> list[dict]:
    """Every record in `store`, by file name."""
    return [read_record(path) for path in sorted(store.glob("*.json"))]


def store_arm(run: Path, store: Path) -> Path:
    record = record_arm(run)
    return write_record(store, record["arm"], record)


def load_records(store: Path) -> list[dict]:
    # the base arm first, the others in the order they were stored (by name)
    return sorted(read_records(store), key=lambda r: r["arm"] != BASE_ARM)


def levers(record: dict, base: dict | None) -> str:
    """What this arm changes against the base arm, as `key=value` of the training config. A setting added after a
    record was made counts at its earlier value (ADDED_SETTINGS)."""
    if base is None or record is base:
        return "—"
    mine = {**ADDED_SETTINGS, **_flat(record["config"])}
    theirs = {**ADDED_SETTINGS, **_flat(base["config"])}
    changed = [k for k in sorted(set(mine) | set(theirs)) if k not in NOT_LEVERS and mine.get(k) != theirs.get(k)]
    return "; ".join(f"`{k}={json.dumps(mine.get(k), separators=(',', ':'))}`" for k in changed) or "(none)"


def _bench_cell(record: dict, bench: str, method: str) -> str:
    figures = record["benches"].get(bench, {}).get("methods", {}).get(method)
    if not figures:
        return "–"
    speedup = f"{figures['speedup']:.2f}x " if figures.get("speedup") is not None else ""
    return f"{speedup}(τ {figures['tau']:.2f})"


def render_ablation(records: list[dict]) -> str:
    if not records:
        return "No arm has finished yet (`make ablation`)."
    base = next((r for r in records if r["arm"] == BASE_ARM), None)
    lines = ["| arm | lever (against `base`) | updates | train s | held-out τ T=0 | held-out τ T=1 | "
            "test split T=0, eagle3 | test split T=1, eagle3 |",
            "|---|---|---:|---:|---:|---:|---:|---:|"]
    for record in records:
        ev = record["eval"]
        seconds = ev.get("throughput", {}).get("seconds")
        lines.append(f"| {record['arm']} | {levers(record, base)} | {record['updates']} | "
                    f"{f'{seconds:.0f}' if seconds is not None else '–'} | {ev.get('tau_t0', float('nan')):.3f} | "
                    f"{ev.get('tau_t1', float('nan')):.3f} | {_bench_cell(record, 'bench-t0', 'eagle3')} | "
                    f"{_bench_cell(record, 'bench-t1', 'eagle3')} |")
    commands = sorted({b["command"] for r in records for b in r["benches"].values() if b.get("command")})
    categories = sorted({c for r in records for c in r["benches"].get("bench-t0", {}).get("methods", {})
                         .get("eagle3", {}).get("per_category", {})})
    if categories:
        lines += ["", "Test-split τ of eagle3 at T=0 per category:", "",
                  "| arm | " + " | ".join(categories) + " |", "|---|" + "---:|" * len(categories)]
        for record in records:
            per = record["benches"].get("bench-t0", {}).get("methods", {}).get("eagle3", {}).get("per_category", {})
            lines.append(f"| {record['arm']} | " + " | ".join(
                f"{per[c]['tau']:.2f}" if c in per else "–" for c in categories) + " |")
    if commands:
        lines += ["", "Benchmark commands (one arm's; the others differ only in `--drafts` and `--out`): `"
                  + commands[0] + "`"]
    return "\n".join(lines)

"""τ against updates and training time (docs/results.md, `make dflash-published`): one table of several runs'
held-out evaluations, so drafts trained on the same data can be compared at the same updates or CPU-seconds.

A run's record (data/curves/<name>.json) is what a fresh clone needs to render its rows: the run's training config
and its evaluations, read from the run's evaluations.jsonl (one line per held-out evaluation, with the training
seconds spent so far; train/trainer.py). A run made before that file existed gives one point: its eval.json, at
its last checkpoint's update, with its last process's training seconds.
"""

from __future__ import annotations

import json
from pathlib import Path

from .ablation import AblationError, read_record, updates_of, write_record

START, END = "<!-- curves:start -->", "<!-- curves:end -->"


def curve_name(run: Path) -> str:
    """runs/ablation/base -> ablation-base: the run folder below the last runs/ of its path, its parts joined (a
    folder outside runs/: its own name)."""
    parts = run.parts
    below = parts[len(parts) - parts[::-1].index("runs"):] if "runs" in parts[:-1] else parts[-1:]
    return "-".join(below)


def _point(step: int, seconds: float | None, evaluation: dict) -> dict:
    top1 = evaluation.get("top1") or [None]
    return {"step": step, "train_seconds": seconds, "top1_pos1": top1[0], "tau_t0": evaluation.get("tau_t0"),
            "tau_t1": evaluation.get("tau_t1")}


def record_curve(run: Path) -> dict:
    """The record of one run: `run` holds train_config.json and evaluations.jsonl (or eval.json and checkpoints/)."""
    if not (run / "train_config.json").is_file():
        raise AblationError(f"{run}: no train_config.json (not a training run folder)")
    history = run / "evaluations.jsonl"
    if history.is_file():  # one line per update: the trainer replaces an evaluation repeated after a resume
        points = []
        for number, line in enumerate(history.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                evaluation = json.loads(line)
            except json.JSONDecodeError as err:
                raise AblationError(f"{history}, line {number}: not valid JSON: {err}") from err
            points.append(_point(evaluation["step"], evaluation.get("train_seconds"), evaluation))
        points.sort(key=lambda point: point["step"])
    elif (run / "eval.json").is_file():
        evaluation = json.loads((run / "eval.json").read_text())
        points = [_point(updates_of(run), evaluation.get("throughput", {}).get("seconds"), evaluation)]
    else:
        raise AblationError(f"{run}: neither evaluations.jsonl nor eval.json (has it evaluated yet?)")
    return {"name": curve_name(run), "run": str(run), "config": json.loads((run / "train_config.json").read_text()),
            "points": points}


def last_step(record: dict) -> int:
    """The last update a curve record has a point at (0: none)."""
    return max((point["step"] for point in record.get("points", [])), default=0)


def store_curve(run: Path, store: Path) -> tuple[Path, dict | None]:
    """Write the run's record to store/<name>.json, unless the stored record of the same training config reaches a
    later update (a rerun of the recipe on a fresh clone, not yet as far as the run it was committed from): that one
    is kept, and returned as the second value (None when the run's record was written)."""
    record = record_curve(run)
    path = store / f"{record['name']}.json"
    if path.is_file():
        stored = read_record(path)
        if stored.get("config") == record["config"] and last_step(stored) > last_step(record):
            return path, stored
    return write_record(store, record["name"], record), None


def _number(value, digits: int) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def render_curves(records: list[dict]) -> str:
    if not records:
        return "No run has been recorded yet (`make dflash-published`, then `make results`)."
    lines = ["| run | update | train s | held-out top-1, pos. 1 | held-out τ T=0 | held-out τ T=1 |",
             "|---|---:|---:|---:|---:|---:|"]
    for record in records:
        for point in record["points"]:
            lines.append(f"| {record['name']} | {point['step']} | {_number(point['train_seconds'], 0)} | "
                         f"{_number(point['top1_pos1'], 3)} | {_number(point['tau_t0'], 3)} | "
                         f"{_number(point['tau_t1'], 3)} |")
    return "\n".join(lines)

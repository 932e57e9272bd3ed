"""A training schedule: one run, one output folder, an ordered list of stages.

    schedule:
      - name: first
        train: {epochs: 2, lr: 2.0e-3}
      - name: more-data
        data: {dataset: more.jsonl}
        train: {epochs: 1, lr: 1.0e-3}
        eagle: {greedy_target_weight: 0.5}

Each stage trains the config as written with that stage's overrides applied (overrides do not carry on to the
next stage), starting from the module the stage before it ended with, with a fresh optimizer and a fresh
warm-up + cosine lr schedule over its own updates, its data order from the beginning and the random generators
re-seeded with train.seed: what a separate run started from the previous stage's weights does (eagle.init_draft,
joint.init_heads). A stage may set the data section, the train keys of STAGE_TRAIN_KEYS and the loss options its
config class names in `stage_keys`; the module's shape, the base, the batch size, seed and output folder stay.
Checkpoints record the stage, so --resume continues mid-stage; each finished stage leaves its heads and
evaluation in <output_dir>/stages/NN-name/, the last one's are also <output_dir>/heads and eval.json.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields, is_dataclass

from specheads.data.sharegpt import MissingDataFile, check_source, dataset_sources
from specheads.heads.files import OutputPathError, check_no_overlap
from specheads.train.config import ConfigError, _build, config_to_dict

STAGE_TRAIN_KEYS = ("epochs", "max_steps", "lr", "weight_decay", "adam_betas", "warmup_ratio", "max_grad_norm",
                    "head_loss_decay")
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


@dataclass(frozen=True)
class Stage:
    index: int
    name: str | None  # None: the run has no schedule (one implicit stage, the config itself)
    cfg: object  # the config this stage trains with (its schedule empty)
    count: int = 1

    @property
    def folder(self) -> str:
        return f"{self.index + 1:02d}-{self.name}"

    @property
    def label(self) -> str:
        return f"stage {self.index + 1}/{self.count} ({self.name})"


def settable_keys(config_class) -> dict[str, tuple[str, ...] | None]:
    """Section -> the keys a stage may set there (None: all of them)."""
    return {"data": None, "train": STAGE_TRAIN_KEYS, **getattr(config_class, "stage_keys", {})}


def stage_tree(tree: dict, index: int) -> dict:
    """The config tree (as config_to_dict gives it) stage `index` trains with: the sections with its overrides."""
    merged = {key: dict(value) if isinstance(value, dict) else value for key, value in tree.items()}
    for section, values in tree["schedule"][index].items():
        if section != "name":
            merged[section].update(values)
    merged["schedule"] = []
    return merged


def _check_stage(entry: dict, tree: dict, allowed: dict, label: str) -> None:
    shown = ", ".join(f"{section}.*" if keys is None else ", ".join(f"{section}.{k}" for k in keys)
                      for section, keys in allowed.items())
    for section, values in entry.items():
        if section == "name":
            continue
        if not isinstance(tree.get(section), dict):
            raise ValueError(f"{label}: unknown section {section!r} (a stage may set: name, {shown})")
        if not isinstance(values, dict):
            raise ValueError(f"{label}.{section} must be a mapping of key: value, got {type(values).__name__} "
                             f"{values!r}")
        for key in values:
            if key not in tree[section]:
                raise ValueError(f"{label}: unknown key '{section}.{key}' (a stage may set: name, {shown})")
            if section not in allowed or (allowed[section] is not None and key not in allowed[section]):
                raise ValueError(f"{label}: {section}.{key} is fixed for the whole run, a stage cannot set it "
                                 f"(a stage may set: name, {shown})")


def stages(config) -> list[Stage]:
    """The stages of a run: the config's schedule, each stage's config built and validated; ValueError naming
    the stage and the key. A config without a schedule is one stage, the config itself."""
    schedule = getattr(config, "schedule", None)
    if not schedule:
        return [Stage(0, None, config)]
    cls, tree, allowed = type(config), config_to_dict(config), settable_keys(type(config))
    found, names = [], set()
    for index, entry in enumerate(schedule):
        name = entry.get("name", f"stage{index + 1}")
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise ValueError(f"schedule[{index}].name must be letters, digits, '.', '_' or '-' (a folder name), "
                             f"got {name!r}")
        if name in names:
            raise ValueError(f"schedule[{index}].name {name!r} is also an earlier stage's name")
        names.add(name)
        label = f"schedule[{index}] ({name})"
        _check_stage(entry, tree, allowed, label)
        found.append(Stage(index, name, _build(cls, stage_tree(tree, index), "", label), len(schedule)))
    return found


def check_inputs(run_stages: list[Stage]) -> None:
    """Every stage's inputs resolved before the first step: each stage's data.dataset is there (a file missing in
    the last of 8 stages would otherwise stop the run hours in, after the others trained). MissingDataFile (a
    DataFileError and FileNotFoundError) naming the stage, the key and the file."""
    for stage in run_stages:
        try:
            check_source(stage.cfg.data.dataset)
        except FileNotFoundError as err:
            where = f"schedule[{stage.index}] ({stage.name}): " if stage.name else ""
            raise MissingDataFile(f"{where}data.dataset: {err}") from err


def check_output_dirs(run_stages: list[Stage]) -> None:
    """A run writes its lock, heads, checkpoints and logs under train.output_dir: never into what any stage reads
    (it may hold an input: it writes only its own subfolders). ConfigError naming both, before anything is
    written."""
    for stage in run_stages:
        try:
            check_no_overlap(stage.cfg.train.output_dir, stage_inputs(stage.cfg), above_inputs_ok=True,
                             what="train.output_dir")
        except OutputPathError as err:
            where = f"schedule[{stage.index}] ({stage.name}): " if stage.name else ""
            raise ConfigError(f"{where}{err}") from err


def stage_inputs(cfg) -> list[tuple[str, str]]:
    """(key, path) of what a stage reads from disk: each data.dataset source, model.name, any section's
    init_draft / init_heads (names that are not local paths are skipped by the overlap check)."""
    inputs = [("data.dataset", name) for name, _ in dataset_sources(cfg.data.dataset)]
    inputs.append(("model.name", cfg.model.name))
    for section in fields(cfg):
        value = getattr(cfg, section.name)
        for key in ("init_draft", "init_heads"):
            if is_dataclass(value) and key in {f.name for f in fields(value)}:
                inputs.append((f"{section.name}.{key}", getattr(value, key)))
    return inputs

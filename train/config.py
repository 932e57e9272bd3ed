"""Typed, validated training configs, and the sections every trainer shares (model, data, train).

A config is a tree of dataclasses loaded from YAML, plus `section.key=value` overrides from
the command line. Every key must exist, once, and every value must have the declared type; a
mistake is an error that names the key and the file it came from (and the line, for a repeated key).
A trainer's config class (train/medusa.py, train/eagle.py) adds its own sections and may have a `schedule`
(train/schedule.py).
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass
from pathlib import Path

import yaml


class ConfigError(ValueError):
    """A config (file, override or one of its values) that cannot be trained: names the field."""


class RunError(RuntimeError):
    """A run that cannot start or go on as asked (its folder in use or holding checkpoints, a --resume with other
    settings, no readable checkpoint); nothing was changed. Command lines print it as one line, exit 1."""


def _type_name(tp) -> str:
    return getattr(tp, "__name__", str(tp).replace("typing.", ""))


def _check_value(value, tp, where: str, source: str):
    """Return `value` as type `tp` (ints widen to float), or raise ConfigError naming `where`."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(tp)
        if value is None and type(None) in options:
            return None
        shaped = None  # the error of the option of the value's own shape (a list for list[...]), which says more
        for option in options:
            if option is type(None):
                continue
            try:
                return _check_value(value, option, where, source)
            except ConfigError as err:
                if isinstance(value, list) and typing.get_origin(option) is list or (
                        isinstance(value, dict) and dataclasses.is_dataclass(option)):
                    shaped = shaped or err
        if shaped is not None:
            raise shaped
        raise ConfigError(f"{source}: {where} must be {' or '.join(_type_name(o) for o in options)}, "
                          f"got {type(value).__name__} {value!r}")
    if origin is list:
        (item_type,) = typing.get_args(tp)
        if not isinstance(value, list):
            raise ConfigError(f"{source}: {where} must be a list, got {type(value).__name__} {value!r}")
        return [_check_value(item, item_type, f"{where}[{i}]", source) for i, item in enumerate(value)]
    if origin is typing.Literal:
        if value not in typing.get_args(tp):
            raise ConfigError(f"{source}: {where} must be one of {list(typing.get_args(tp))}, got {value!r}")
        return value
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, where, source)
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp is float and isinstance(value, str):  # YAML 1.1 reads `1e-3` (no dot) as a string
        try:
            return float(value)
        except ValueError:
            pass
    if tp is int and isinstance(value, bool) or not isinstance(value, tp):
        raise ConfigError(f"{source}: {where} must be {_type_name(tp)}, got {type(value).__name__} {value!r}")
    return value


def _build(cls, values, where: str, source: str):
    if not isinstance(values, dict):
        raise ConfigError(f"{source}: {where or 'the config'} must be a mapping, got {type(values).__name__}")
    hints = typing.get_type_hints(cls)
    field_names = [f.name for f in dataclasses.fields(cls)]
    for key in values:
        if key not in field_names:
            name = f"{where}.{key}" if where else key
            raise ConfigError(f"{source}: unknown key {name!r} (known here: {', '.join(field_names)})")
    kwargs = {key: _check_value(value, hints[key], f"{where}.{key}" if where else key, source)
              for key, value in values.items()}
    try:
        obj = cls(**kwargs)
    except TypeError as err:
        raise ConfigError(f"{source}: {where or 'config'}: {err}") from err
    validate = getattr(obj, "validate", None)
    if validate is not None:
        try:
            validate()
        except ValueError as err:
            raise ConfigError(f"{source}: {err}") from err
    return obj


def _field_type(cls, parts: list[str]):
    """The declared type of the dotted field `parts` of dataclass `cls` (None where it names no field)."""
    tp = cls
    for part in parts:
        if not dataclasses.is_dataclass(tp):
            return None
        tp = typing.get_type_hints(tp).get(part)
    return tp


def _apply_override(tree: dict, override: str, source: str, cls=None) -> None:
    if "=" not in override:
        raise ConfigError(f"{source}: override {override!r} must look like section.key=value")
    dotted, raw = override.split("=", 1)
    parts = dotted.strip().split(".")
    node = tree
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"{source}: {dotted!r} does not name a config key")
    value = yaml.safe_load(raw) if raw.strip() else ""
    if cls is not None and _field_type(cls, parts) is str and not isinstance(value, str):
        value = raw.strip()  # a str field takes the text as written: YAML would read `no` as False, `1.0` as 1.0
    node[parts[-1]] = value


def _check_unique_keys(node, source: str, where: str = "", seen: set | None = None) -> None:
    """Raise ConfigError at the first key a YAML mapping repeats (PyYAML keeps the last one silently)."""
    seen = set() if seen is None else seen
    if id(node) in seen:  # an alias of a node already checked (or of itself)
        return
    seen.add(id(node))
    if isinstance(node, yaml.MappingNode):
        first_line: dict = {}
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
            if key is not None and key != "<<":
                name = f"{where}.{key}" if where else key
                line = key_node.start_mark.line + 1
                if key in first_line:
                    raise ConfigError(f"{source}: line {line}: duplicate key {name!r} (first at line {first_line[key]})")
                first_line[key] = line
            _check_unique_keys(value_node, source, f"{where}.{key}" if where else str(key), seen)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _check_unique_keys(item, source, f"{where}[{i}]", seen)


def load_config(cls, path: str | Path | None, overrides: list[str] = ()):
    """Read YAML at `path` into dataclass `cls`, apply `section.key=value` overrides, validate."""
    tree = {}
    source = str(path) if path else "defaults"
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file not found: {path}")
        try:
            text = path.read_text()
            _check_unique_keys(yaml.compose(text, Loader=yaml.SafeLoader), str(path))
            tree = yaml.safe_load(text) or {}
        except yaml.YAMLError as err:
            raise ConfigError(f"{path}: not valid YAML: {err}") from err
    for override in overrides:
        _apply_override(tree, override, f"{source} (override {override!r})" if overrides else source, cls)
    return _build(cls, tree, "", source if not overrides else f"{source} + command-line overrides")


def config_to_dict(config) -> dict:
    return dataclasses.asdict(config)


# ---- config sections shared by every trainer -----------------------------------------------

@dataclass
class ModelSection:
    name: str = "smollm2-135m-instruct"  # built-in name, HF model id or local path
    dtype: str = "auto"  # dtype of the frozen base: auto | bf16 | fp32 | fp16 | fp64


@dataclass
class DataSource:
    """One source of a mixed data.dataset: `{source: answers.jsonl, weight: 2}`."""
    source: str
    weight: float = 1.0  # its training side this many times over (2: twice; 0.5: a seeded half; 0: held out only)

    def validate(self):
        check_finite("data.dataset[]", self, ["weight"], inclusive=True)


@dataclass
class DataSection:
    # built-in name, ShareGPT .json/.jsonl path, or HF dataset id; or a list of them mixed, each a string or a
    # {source, weight} mapping (data/sharegpt.load_mixture: each source keeps its own held-out split)
    dataset: str | list[str | DataSource] = "sharegpt"
    split: str = "train"  # the split of an HF dataset id (UltraChat: train_sft); files have none
    max_length: int = 512
    heldout_size: int = 200
    split_seed: int = 0
    max_train_conversations: int | None = None
    max_heldout_eval: int | None = None  # evaluate on the first N held-out conversations
    # The prompt format, for tokenizers that ship none (Vicuna) or to override theirs: a built-in name
    # (data/chat_templates.py: vicuna_v1.1, llama-2, chatml, zephyr, alpaca), a Jinja string or a file.
    chat_template: str | None = None

    def validate(self):
        from specheads.data.chat_templates import resolve_chat_template

        resolve_chat_template(self.chat_template, "data.chat_template")  # a wrong name stops before any weights load
        if isinstance(self.dataset, list) and not self.dataset:
            raise ValueError("data.dataset: an empty list names no data (give one source or several)")
        if isinstance(self.dataset, list) and all(isinstance(s, DataSource) and s.weight == 0 for s in self.dataset):
            raise ValueError("data.dataset: every source has weight 0, so nothing is left to train on (weight 0 "
                             "keeps a source for the held-out evaluation only)")
        if self.max_length < 8:
            raise ValueError(f"data.max_length must be >= 8, got {self.max_length}")
        if not self.split.strip():
            raise ValueError("data.split must name a split of the dataset (e.g. train, train_sft)")
        if self.heldout_size < 1:
            raise ValueError(f"data.heldout_size must be >= 1, got {self.heldout_size}")
        for name in ("max_train_conversations", "max_heldout_eval"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"data.{name} must be >= 1 (or null: all), got {getattr(self, name)}")


def check_finite(section: str, obj, names, minimum: float = 0.0, inclusive: bool = False) -> None:
    """ValueError naming `section.name` unless each value is a finite number > minimum (>= with inclusive)."""
    for name in names:
        value = getattr(obj, name)
        if not (math.isfinite(value) and (value >= minimum if inclusive else value > minimum)):
            raise ValueError(f"{section}.{name} must be a finite number {'>=' if inclusive else '>'} {minimum:g}, "
                             f"got {value}")


# What train.best_by may rank evaluations by (higher is better): the rollout τ at T=0 / T=1 (train/acceptance.py),
# or the chain estimate from per-head top-1 accuracy.
BEST_BY = ("tau_t0", "tau_t1", "estimated_tau")
# The draft's token loss: cross-entropy, the total-variation distance to the base (1 − T=1 acceptance), or both.
DRAFT_LOSSES = ("ce", "tv", "ce+tv")


def check_draft_loss(section: str, loss: str, tv_weight: float) -> None:
    if loss not in DRAFT_LOSSES:
        raise ValueError(f"{section}.loss must be one of {', '.join(DRAFT_LOSSES)}, got {loss!r}")
    check_finite(section, types.SimpleNamespace(tv_weight=tv_weight), ("tv_weight",))


@dataclass
class TrainSection:
    output_dir: str = "runs/medusa"
    epochs: float = 1.0
    max_steps: int | None = None  # optimizer updates; overrides epochs when set
    batch_size: int = 4  # sequences per process per micro-batch
    grad_accum: int = 1
    lr: float = 1e-3
    weight_decay: float = 0.0
    adam_betas: list[float] | None = None  # default (0.9, 0.999)
    warmup_ratio: float = 0.1
    max_grad_norm: float | None = None
    head_loss_decay: float = 0.8
    mixed_precision: str = "auto"  # auto | bf16 | fp16 | no
    seed: int = 42
    log_every: int = 10
    eval_every: int = 0  # 0: only at the end
    save_every: int = 100
    keep_checkpoints: int = 2  # 0: keep all
    accept_positions: int = 1024  # held-out answer tokens whose chains the evaluation rolls out (0: no rollout)
    best_by: str | None = None  # tau_t0 | tau_t1 | estimated_tau: also keep the best evaluation's heads in heads-best/

    def validate(self):
        if not self.output_dir.strip():
            raise ValueError(f"train.output_dir must name a folder, got {self.output_dir!r}")
        if self.mixed_precision not in ("auto", "bf16", "fp16", "no"):
            raise ValueError(f"train.mixed_precision must be auto, bf16, fp16 or no, got {self.mixed_precision!r}")
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError(f"train.max_steps must be >= 1 (or null: train.epochs decides), got {self.max_steps}")
        check_finite("train", self, ("lr", "epochs", "head_loss_decay"))
        check_finite("train", self, ("weight_decay",), inclusive=True)
        if self.max_grad_norm is not None and not (math.isfinite(self.max_grad_norm) and self.max_grad_norm > 0):
            raise ValueError(f"train.max_grad_norm must be a finite number > 0 (or null), got {self.max_grad_norm}")
        for name in ("batch_size", "grad_accum", "log_every", "save_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"train.{name} must be >= 1, got {getattr(self, name)}")
        for name, note in (("eval_every", ""), ("keep_checkpoints", " (0 keeps all)")):
            if getattr(self, name) < 0:
                raise ValueError(f"train.{name} must be >= 0{note}, got {getattr(self, name)}")
        if not 0 <= self.seed < 2**32:  # numpy's seed range (accelerate's set_seed seeds numpy too)
            raise ValueError(f"train.seed must be in [0, 2**32), got {self.seed}")
        if not 0 <= self.warmup_ratio < 1:
            raise ValueError(f"train.warmup_ratio must be in [0, 1), got {self.warmup_ratio}")
        if self.accept_positions < 0:
            raise ValueError(f"train.accept_positions must be >= 0 (0: no rollout acceptance), got {self.accept_positions}")
        if self.best_by is not None and self.best_by not in BEST_BY:
            raise ValueError(f"train.best_by must be one of {', '.join(BEST_BY)} (null: keep the last "
                             f"heads only), got {self.best_by!r}")
        if self.best_by in ("tau_t0", "tau_t1") and not self.accept_positions:
            raise ValueError(f"train.best_by: {self.best_by} is measured by the rollout acceptance, which "
                             "train.accept_positions: 0 turns off")
        if self.adam_betas is not None and (len(self.adam_betas) != 2 or not all(0 <= b < 1 for b in self.adam_betas)):
            raise ValueError(f"train.adam_betas must be two numbers in [0, 1), got {self.adam_betas}")

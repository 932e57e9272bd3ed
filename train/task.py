"""What a trainer adds to the shared run (train/trainer.py): a `Task`.

A task builds its trainable module on the frozen base, computes its loss on a batch and evaluates on held-out
examples; the Trainer owns everything else. A run with a `schedule` makes one task per stage (from that stage's
config), and the module the first one built carries over from stage to stage.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import torch

from specheads.train.acceptance import accuracy_extra, accuracy_logs, format_accuracy


class Task(Protocol):
    """What a trainer adds to the shared loop.

    The module `build` returns is what trains, checkpoints and is saved (its `save_pretrained(dir, extra,
    state_dict)`); only its parameters with requires_grad are optimised."""

    name: str  # TensorBoard project name and progress-bar label
    part_names: list[str]  # names of the loss components logged separately (e.g. one per head)

    def build(self, base, tokenizer, examples) -> torch.nn.Module: ...
    def restore(self, module, directory: Path, base) -> None: ...  # load a checkpoint's weights into module
    def param_groups(self, module, lr: float) -> list[dict]: ...
    def loss(self, module, base, batch: dict, indices: list[int], step: int) -> tuple[torch.Tensor, torch.Tensor]: ...
    def evaluate(self, module, base, examples, pad_token_id: int, batch_size: int, accelerator) -> dict: ...
    def format_result(self, result: dict) -> str: ...
    def eval_logs(self, result: dict) -> dict: ...
    def final_extra(self, result: dict) -> dict: ...


def trainable_parameters(module) -> list[torch.nn.Parameter]:
    return [p for p in module.parameters() if p.requires_grad]


class DraftTask:
    """Defaults of a Task whose module is the draft alone: restore from its saved folder, one parameter group, and
    the held-out accuracy per head or draft step (train/acceptance.py) as its report, logs and saved record."""

    format_result = staticmethod(format_accuracy)
    eval_logs = staticmethod(accuracy_logs)
    final_extra = staticmethod(accuracy_extra)

    def load(self, directory: Path, base) -> torch.nn.Module:
        raise NotImplementedError

    def restore(self, module, directory: Path, base) -> None:
        module.load_state_dict(self.load(directory, base).state_dict())

    def param_groups(self, module, lr: float) -> list[dict]:
        return [{"params": trainable_parameters(module), "lr": lr}]

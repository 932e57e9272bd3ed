"""`DraftModule`: the one save / load every draft model shares (HF's save_pretrained / from_pretrained, in our folder).

A folder is config.json (`model_type`, the config dataclass's fields, then the draft's metadata: tree, EAGLE tree,
base fingerprint, chat template, held-out accuracy, ...) and model.safetensors. A subclass names its MODEL_TYPE,
CONFIG_CLASS and WHAT (for messages), the state-dict prefixes it rebuilds rather than saves (NOT_SAVED: rotary
tables), and how its config is checked against a base (`check_base`). `metadata` holds the config.json fields that
are not the config's; they are saved back with the weights, so a loaded draft saved again loses nothing.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import ClassVar

import torch
from torch import nn

from .files import WEIGHTS_NAME, read_typed_config, write_folder
from .fingerprint import KEY as FINGERPRINT
from .fingerprint import check_fingerprint
from .weights import read_folder_safetensors


class DraftModule(nn.Module):
    MODEL_TYPE: ClassVar[str]
    CONFIG_CLASS: ClassVar[type]
    WHAT: ClassVar[str]  # "Medusa heads", "EAGLE draft", "DFlash drafter"
    NOT_SAVED: ClassVar[tuple[str, ...]] = ()

    def __init__(self):
        super().__init__()
        self.metadata: dict = {}  # config.json's other fields (tree, eagle_tree, base_fingerprint, chat_template, ...)

    @property
    def extra_config(self) -> dict:  # the older name
        return self.metadata

    @extra_config.setter
    def extra_config(self, value: dict) -> None:
        self.metadata = dict(value or {})

    @classmethod
    def check_base(cls, config, base_config, source: str) -> None:
        """Raise ValueError naming what does not fit when `config` is not for `base_config`."""
        raise NotImplementedError

    def save_pretrained(self, directory: str | Path, extra: dict | None = None, state_dict: dict | None = None) -> None:
        """config.json (the config, then `extra`, default this draft's metadata) and model.safetensors.

        state_dict: the weights gathered across ranks (DeepSpeed ZeRO-3); default this module's own."""
        state = {name: tensor.detach().contiguous().cpu()
                 for name, tensor in (self.state_dict() if state_dict is None else state_dict).items()
                 if not name.startswith(self.NOT_SAVED or ("\0",))}
        fields = self.metadata if extra is None else extra
        write_folder(directory, {"model_type": self.MODEL_TYPE, **asdict(self.config), **fields}, state)

    @classmethod
    def read_config(cls, directory: str | Path):
        """config.json -> (CONFIG_CLASS of its known fields, the other fields); errors name the file."""
        return read_typed_config(directory, cls.MODEL_TYPE, cls.CONFIG_CLASS, what=cls.WHAT)

    @classmethod
    def from_pretrained(cls, directory: str | Path, base_model=None, map_location: str = "cpu"):
        """Load a folder in specheads' format; with `base_model`, first check it fits (sizes, vocabulary, layers; a
        fingerprint of another base warns). Folders in other formats load with `heads.load_heads`."""
        config, extra = cls.read_config(directory)
        if base_model is not None:
            cls.check_base(config, base_model.config, str(directory))
            check_fingerprint(extra.get(FINGERPRINT), base_model, f"{cls.WHAT} {directory}")
        module = cls(config)
        state = read_folder_safetensors(directory, WEIGHTS_NAME, device=map_location)
        module.load_tensors(state, Path(directory) / WEIGHTS_NAME)
        module.metadata = extra
        return module

    def expected_tensors(self) -> dict[str, torch.Tensor]:
        return {k: v for k, v in self.state_dict().items() if not k.startswith(self.NOT_SAVED or ("\0",))}

    def load_tensors(self, state: dict[str, torch.Tensor], source) -> None:
        """Load `state` (the saved names), refusing a missing, unexpected or misshapen tensor by its name."""
        expected = self.expected_tensors()
        missing, unexpected = sorted(expected.keys() - state.keys()), sorted(state.keys() - expected.keys())
        if missing or unexpected:
            raise ValueError(f"{source}: missing tensors {missing}, unexpected tensors {unexpected}")
        for name, tensor in expected.items():
            if state[name].shape != tensor.shape:
                raise ValueError(f"{source}: tensor {name} has shape {tuple(state[name].shape)}, "
                                 f"expected {tuple(tensor.shape)}")
        self.load_state_dict(state, strict=False)

"""The heads committed in heads/trained/ load as they are and hold finite weights for the base they name."""

import json
from pathlib import Path

import pytest
import torch

from specheads.heads import EagleDraft, MedusaHeads

TRAINED = Path(__file__).resolve().parent.parent / "heads" / "trained"
FOLDERS = sorted(p for p in TRAINED.iterdir() if p.is_dir())


def test_there_are_committed_heads():
    assert {p.name for p in FOLDERS} >= {"smollm2-135m-medusa1", "smollm2-135m-eagle3"}


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda p: p.name)
def test_committed_heads_load_with_finite_weights(folder):
    config = json.loads((folder / "config.json").read_text())
    loader = {"specheads-medusa": MedusaHeads, "specheads-eagle": EagleDraft}[config["model_type"]]
    heads = loader.from_pretrained(folder)
    hidden_size = {"smollm2-135m-instruct": 576, "qwen2.5-coder-1.5b-instruct": 1536}
    assert config["hidden_size"] == hidden_size[config["base_model_name_or_path"]], "a built-in base, its width"
    assert all(torch.isfinite(p).all() for p in heads.parameters())
    assert (folder / "train_config.json").is_file(), "keep the config that trained them"
    assert (folder / "model.safetensors").stat().st_size < 20_000_000

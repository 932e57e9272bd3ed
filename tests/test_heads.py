"""Medusa heads: structure, zero-init, on-disk round trip, refusal of a mismatched base."""

import json

import pytest
import torch
from torch import nn

from specheads.heads import MedusaConfig, MedusaHeads, check_compatible


def make_heads(own_lm_head=False, hidden=16, vocab=50, num_heads=3, num_layers=2):
    config = MedusaConfig(num_heads=num_heads, num_layers=num_layers, hidden_size=hidden, vocab_size=vocab,
                          own_lm_head=own_lm_head, base_model_name_or_path="tiny")
    base_lm_head = nn.Linear(hidden, vocab, bias=False)
    return MedusaHeads(config, base_lm_head), base_lm_head


@pytest.mark.parametrize("own", [False, True])
def test_fresh_heads_equal_base_lm_head(own):
    heads, lm_head = make_heads(own)
    h = torch.randn(2, 5, 16)
    logits = heads(h, lm_head)
    assert logits.shape == (3, 2, 5, 50)
    for k in range(3):  # zero-initialised blocks are the identity
        torch.testing.assert_close(logits[k], lm_head(h))


def test_every_block_is_its_own_module():
    heads, _ = make_heads(num_layers=2)
    weights = [block.linear.weight for head in heads.blocks for block in head]
    assert len(weights) == 6
    assert len({w.data_ptr() for w in weights}) == 6
    with torch.no_grad():
        heads.blocks[0][0].linear.weight.fill_(1.0)
    assert heads.blocks[1][0].linear.weight.abs().sum() == 0 and heads.blocks[0][1].linear.weight.abs().sum() == 0


def test_shared_heads_train_only_blocks():
    shared, _ = make_heads(own_lm_head=False)
    own, _ = make_heads(own_lm_head=True)
    assert all(not name.startswith("lm_heads") for name, _ in shared.named_parameters())
    assert sum(p.numel() for p in own.parameters()) > sum(p.numel() for p in shared.parameters())
    with pytest.raises(ValueError, match="base_lm_head"):
        shared(torch.randn(1, 16))


@pytest.mark.parametrize("own", [False, True])
def test_save_load_round_trip(tmp_path, own):
    heads, lm_head = make_heads(own)
    for p in heads.parameters():
        nn.init.normal_(p)
    heads.save_pretrained(tmp_path, extra={"note": "x"})
    assert sorted(f.name for f in tmp_path.iterdir()) == ["config.json", "model.safetensors"]
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == "specheads-medusa"
    assert config["hidden_size"] == 16 and config["vocab_size"] == 50
    assert config["base_model_name_or_path"] == "tiny" and config["own_lm_head"] is own
    loaded = MedusaHeads.from_pretrained(tmp_path)
    assert loaded.extra_config == {"note": "x"}
    h = torch.randn(4, 16)
    torch.testing.assert_close(loaded(h, lm_head), heads(h, lm_head))


def test_mismatched_base_is_refused(tmp_path):
    heads, _ = make_heads()
    heads.save_pretrained(tmp_path)

    class Base:
        config = type("C", (), {"hidden_size": 32, "vocab_size": 60})()

    with pytest.raises(ValueError, match=r"hidden_size 16 \(heads\) != 32 \(base\).*vocab_size 50 \(heads\) != 60"):
        MedusaHeads.from_pretrained(tmp_path, base_model=Base())
    check_compatible(heads.config, type("C", (), {"hidden_size": 16, "vocab_size": 50})())


def test_damaged_files_name_the_file(tmp_path):
    heads, _ = make_heads()
    heads.save_pretrained(tmp_path)
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(ValueError, match="model.safetensors"):
        MedusaHeads.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text('{"model_type": "specheads-medusa", "num_heads": "four"}')
    with pytest.raises(ValueError, match="config.json.*num_heads"):
        MedusaHeads.from_pretrained(tmp_path)

"""Medusa heads: structure, zero-init, on-disk round trip, refusal of a mismatched base."""

import json

import pytest
import torch
from torch import nn

from specheads.heads import MedusaConfig, MedusaHeads, check_compatible
from specheads.heads.files import update_config


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


def draft_vocab_heads(own: bool, ids=(7, 3, 42, 0, 19, 25)):
    config = MedusaConfig(num_heads=3, num_layers=1, hidden_size=16, vocab_size=50, own_lm_head=own,
                          draft_vocab_size=len(ids))
    base_lm_head = nn.Linear(16, 50, bias=False)
    heads = MedusaHeads(config)
    heads.set_draft_vocabulary(torch.tensor(ids))
    if own:
        heads.init_from_base_lm_head(base_lm_head)
    for block in heads.blocks:
        nn.init.normal_(block[0].linear.weight, std=0.1)
    return heads, base_lm_head, torch.tensor(ids)


@pytest.mark.parametrize("own", [False, True])
def test_draft_vocabulary_projects_onto_its_rows_and_round_trips(tmp_path, own):
    heads, lm_head, ids = draft_vocab_heads(own)
    h = torch.randn(2, 4, 16)
    full = MedusaHeads(MedusaConfig(num_heads=3, num_layers=1, hidden_size=16, vocab_size=50))
    full.blocks.load_state_dict(heads.blocks.state_dict())
    logits = heads(h, lm_head)
    assert logits.shape == (3, 2, 4, 6)  # the draft vocabulary's rows only
    torch.testing.assert_close(logits, full(h, lm_head)[..., ids])
    if not own:  # the shared rows are gathered once, and again after the base lm_head changes
        rows = heads._draft_rows[2][0]
        heads(h, lm_head)
        assert heads._draft_rows[2][0] is rows
        with torch.no_grad():
            lm_head.weight.mul_(2.0)
        torch.testing.assert_close(heads(h, lm_head), 2 * logits)
        with torch.no_grad():
            lm_head.weight.div_(2.0)

    # index <-> token id; tokens outside the vocabulary become `missing`, IGNORE_INDEX stays
    assert heads.draft_to_token(torch.tensor([2, 0])).tolist() == [42, 7]
    assert heads.token_to_draft(torch.tensor([42, 7, 8, -100]), missing=-1).tolist() == [2, 0, -1, -100]

    heads.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["draft_vocab_size"] == 6
    loaded = MedusaHeads.from_pretrained(tmp_path)
    assert loaded.draft_ids.tolist() == ids.tolist()
    assert loaded.token_to_draft(torch.tensor([25, 1]), missing=-7).tolist() == [5, -7]
    torch.testing.assert_close(loaded(h, lm_head), logits)


def test_draft_vocabulary_refusals(tmp_path):
    with pytest.raises(ValueError, match="draft_vocab_size.*exceeds vocab_size"):
        MedusaConfig(hidden_size=16, vocab_size=50, draft_vocab_size=51)
    config = MedusaConfig(hidden_size=16, vocab_size=50, own_lm_head=True, draft_vocab_size=6)
    with pytest.raises(ValueError, match="set_draft_vocabulary, then init_from_base_lm_head"):
        MedusaHeads(config, nn.Linear(16, 50, bias=False))
    heads, _, _ = draft_vocab_heads(False)
    # a wrapping module's load_state_dict rebuilds the token -> index map too
    wrapper = nn.ModuleDict({"heads": MedusaHeads(heads.config)})
    wrapper.load_state_dict({"heads." + name: tensor for name, tensor in heads.state_dict().items()})
    assert wrapper["heads"].token_to_draft(torch.tensor([42]), missing=-1).tolist() == [2]
    for bad in ([1, 1, 2, 3, 4, 5], [1, 2, 3], [0, 1, 2, 3, 4, 50]):
        with pytest.raises(ValueError, match="6 distinct token ids in 0..49"):
            heads.set_draft_vocabulary(torch.tensor(bad))
    heads.save_pretrained(tmp_path)
    from safetensors.torch import load_file, save_file

    state = load_file(tmp_path / "model.safetensors")
    state["draft_ids"] = torch.zeros(6, dtype=torch.long)
    save_file(state, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match="model.safetensors: tensor draft_ids"):
        MedusaHeads.from_pretrained(tmp_path)


@pytest.mark.parametrize("own", [False, True])
def test_trained_heads_restricted_to_a_draft_vocabulary(own):
    heads, lm_head = make_heads(own)
    for p in heads.parameters():
        nn.init.normal_(p, std=0.1)
    heads.extra_config = {"tree": [[0]]}
    ids = torch.tensor([4, 9, 1, 33])
    restricted = heads.with_draft_vocabulary(ids)
    assert restricted.config.draft_vocab_size == 4 and restricted.extra_config == {"tree": [[0]]}
    h = torch.randn(3, 16)
    with torch.no_grad():
        torch.testing.assert_close(restricted(h, lm_head), heads(h, lm_head)[..., ids])
    with pytest.raises(ValueError, match="already have a draft vocabulary of 4 tokens"):
        restricted.with_draft_vocabulary(ids)


def test_update_config_on_a_full_disk_leaves_the_old_file_whole(tmp_path):
    """scripts/tune_eagle_tree.py and build_tree.py store what they chose in the heads' config.json. Written in
    place, a full disk left a 4,096-byte invalid file (issue 33, item 2); through update_config (temp file +
    os.replace) the old file stays as it was and no temporary file is left behind."""
    import subprocess
    import sys

    heads = MedusaHeads(MedusaConfig(num_heads=2, num_layers=1, hidden_size=8, vocab_size=16))
    heads.save_pretrained(tmp_path / "heads")
    before = (tmp_path / "heads" / "config.json").read_bytes()
    code = ("import resource, signal, sys\n"
            "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG\n"
            "resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))\n"
            "from specheads.heads.files import update_config\n"
            "update_config(sys.argv[1], {'eagle_tree_measurements': 'x' * 100000})\n")
    result = subprocess.run([sys.executable, "-c", code, str(tmp_path / "heads")], capture_output=True, text=True)
    assert result.returncode != 0 and "File too large" in result.stderr, result.stderr[-2000:]
    assert (tmp_path / "heads" / "config.json").read_bytes() == before
    assert sorted(p.name for p in (tmp_path / "heads").iterdir()) == ["config.json", "model.safetensors"]
    update_config(tmp_path / "heads", {"tree": [[0]]})
    assert MedusaHeads.read_config(tmp_path / "heads")[1]["tree"] == [[0]]

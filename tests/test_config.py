"""Typed config loading: unknown keys and wrong types are errors naming the key and the file."""

import pytest

from specheads.train.config import ConfigError, load_config
from specheads.train.medusa import MedusaTrainConfig


def write(tmp_path, text):
    path = tmp_path / "run.yaml"
    path.write_text(text)
    return path


def test_real_configs_load():
    for name in ("configs/smollm2-135m.yaml", "configs/vicuna7b.yaml"):
        cfg = load_config(MedusaTrainConfig, name)
        assert cfg.heads.num_heads >= 4
    assert load_config(MedusaTrainConfig, "configs/vicuna7b.yaml").model.name == "lmsys/vicuna-7b-v1.3"


def test_unknown_key_names_key_and_file(tmp_path):
    path = write(tmp_path, "train:\n  lrate: 0.1\n")
    with pytest.raises(ConfigError, match=r"run\.yaml.*unknown key 'train\.lrate'"):
        load_config(MedusaTrainConfig, path)


def test_unknown_section(tmp_path):
    with pytest.raises(ConfigError, match="unknown key 'optimizer'"):
        load_config(MedusaTrainConfig, write(tmp_path, "optimizer:\n  lr: 1\n"))


def test_wrong_type_names_key_and_file(tmp_path):
    path = write(tmp_path, "train:\n  batch_size: eight\n")
    with pytest.raises(ConfigError, match=r"run\.yaml.*train\.batch_size must be int, got str 'eight'"):
        load_config(MedusaTrainConfig, path)
    with pytest.raises(ConfigError, match="heads.own_lm_head must be bool"):
        load_config(MedusaTrainConfig, write(tmp_path, "heads:\n  own_lm_head: 1\n"))


def test_int_widens_to_float_and_optional_accepts_null(tmp_path):
    cfg = load_config(MedusaTrainConfig, write(tmp_path, "train:\n  lr: 1\n  max_steps: null\n"))
    assert cfg.train.lr == 1.0 and isinstance(cfg.train.lr, float) and cfg.train.max_steps is None


def test_overrides(tmp_path):
    path = write(tmp_path, "train:\n  lr: 0.1\n")
    cfg = load_config(MedusaTrainConfig, path, ["train.lr=3e-4", "heads.num_heads=5", "data.dataset=x.jsonl"])
    assert cfg.train.lr == 3e-4 and cfg.heads.num_heads == 5 and cfg.data.dataset == "x.jsonl"
    with pytest.raises(ConfigError, match="unknown key 'train.nope'"):
        load_config(MedusaTrainConfig, path, ["train.nope=1"])
    with pytest.raises(ConfigError, match="train.epochs must be float"):
        load_config(MedusaTrainConfig, path, ["train.epochs=many"])


def test_value_checks(tmp_path):
    with pytest.raises(ConfigError, match="train.mixed_precision"):
        load_config(MedusaTrainConfig, write(tmp_path, "train:\n  mixed_precision: fp8\n"))
    from specheads.train.eagle import EagleTrainConfig
    with pytest.raises(ConfigError, match="eagle.greedy_target_weight"):
        load_config(EagleTrainConfig, write(tmp_path, "eagle:\n  greedy_target_weight: 1.5\n"))
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(MedusaTrainConfig, tmp_path / "missing.yaml")


def test_cli_reports_config_error(tmp_path, capsys):
    from specheads.train.medusa import main

    assert main(["--config", str(write(tmp_path, "train:\n  lrate: 1\n"))]) == 2
    assert "unknown key 'train.lrate'" in capsys.readouterr().err

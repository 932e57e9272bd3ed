"""Training schedules (train/schedule.py): stages in one run folder, resumable mid-stage and between stages, equal
to the chain of separate runs they replace; a bad stage is refused naming the stage and the key."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from conftest import KILL_IN_NTH_SAVE, synthetic_sharegpt, tiny_train_config, write_jsonl

REPO = Path(__file__).resolve().parent.parent

# Two stages of 3 updates each (checkpoints every 2 and at each stage's end: run-wide updates 2, 3, 5, 6); the
# second trains on other data at another lr.
SCHEDULE = """
schedule:
  - name: first
    train: {{max_steps: 3}}
  - name: second
    data: {{dataset: {data2}}}
    train: {{max_steps: 3, lr: 5.0e-3, warmup_ratio: 0.0}}
"""


def train(script, config, *extra, patch=None):
    args = ["--config", str(config), *map(str, extra)]
    code = (patch or "") + f"\nimport sys, specheads.train.{script} as m\nsys.exit(m.main({args!r}))\n"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


def tensors(directory):
    return load_file(str(Path(directory) / "model.safetensors"))


def assert_same(a, b):
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


@pytest.fixture()
def scheduled(tmp_path, tiny_llama_dir):
    """(config writer, the second stage's data): a Medusa-1 config of the tiny Llama with a 2-stage schedule."""
    data, data2 = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    write_jsonl(data, synthetic_sharegpt(40))
    write_jsonl(data2, synthetic_sharegpt(30, seed=1))

    def config(name):
        path = tmp_path / f"{name}.yaml"
        path.write_text(tiny_train_config(tiny_llama_dir, data, tmp_path / name, max_steps=6)
                        + SCHEDULE.format(data2=data2))
        return path, tmp_path / name

    return config


def test_two_stages_run_in_one_folder_and_resume_after_kill_mid_stage_and_between_stages(scheduled):
    config, run = scheduled("reference")
    result = train("medusa", config)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "stage 1/2 (first): 32 training" in result.stdout and "stage 2/2 (second): 22 training" in result.stdout
    for stage in ("01-first", "02-second"):
        assert (run / "stages" / stage / "heads" / "model.safetensors").is_file()
        assert len(json.loads((run / "stages" / stage / "eval.json").read_text())["top1"]) == 3
    assert_same(tensors(run / "heads"), tensors(run / "stages" / "02-second" / "heads"))
    first, second = tensors(run / "stages" / "01-first" / "heads"), tensors(run / "heads")
    assert any(not torch.equal(first[k], second[k]) for k in first)  # the second stage trained on
    state = json.loads((run / "checkpoints" / "step-000006" / "trainer_state.json").read_text())
    assert (state["stage"], state["stage_name"], state["stage_start_step"], state["step"]) == (1, "second", 3, 3)
    assert state["config"]["schedule"][1]["train"]["lr"] == 5e-3

    # Each checkpoint writes optimizer + RNG with save_file: a kill in call 3 dies inside update 3's (the first
    # stage's last) checkpoint, resuming mid-stage from update 2; call 5 inside update 5's, resuming between the
    # stages from update 3; call 7 inside update 6's, resuming mid-stage two from update 5.
    for n, resumed_at in ((3, "step 2 of stage 1/2 (first)"), (5, "step 3 of stage 1/2 (first)"),
                          (7, "step 2 of stage 2/2 (second)")):
        config, run = scheduled(f"killed-{n}")
        killed = train("medusa", config, patch=KILL_IN_NTH_SAVE.format(n=n))
        assert killed.returncode == -9, killed.stdout + killed.stderr
        resumed = train("medusa", config, "--resume")
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr
        assert resumed_at in resumed.stdout, resumed.stdout
        assert_same(tensors(run / "heads"), tensors(scheduled("reference")[1] / "heads"))
        assert_same(tensors(run / "stages" / "01-first" / "heads"), first)


def test_an_eagle_schedule_equals_the_chain_of_runs_it_replaces(tmp_path, tiny_llama_dir):
    """Stage 2 starts from stage 1's weights with a fresh optimizer and lr schedule: the same weights as a second
    run started with eagle.init_draft from the first run's heads (what the Makefile's chain did)."""
    data, data2 = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    write_jsonl(data, synthetic_sharegpt(20))
    write_jsonl(data2, synthetic_sharegpt(16, seed=1))

    def config(name, schedule=None, **overrides):
        tree = {"model": {"name": str(tiny_llama_dir), "dtype": "fp32"},
                "data": {"dataset": str(data), "max_length": 48, "heldout_size": 2},
                "eagle": {"variant": "eagle3", "draft_vocab_size": 500, "aux_layer_ids": [0, 1, 1], "ttt_steps": 2,
                          "eval_steps": 2, "cache_dir": str(tmp_path / "cache")},
                "train": {"output_dir": str(tmp_path / name), "epochs": 1, "batch_size": 4, "lr": 1e-2,
                          "mixed_precision": "no", "save_every": 2}}
        for section, values in overrides.items():
            tree[section].update(values)
        if schedule:
            tree["schedule"] = schedule
        path = tmp_path / f"{name}.yaml"
        path.write_text(json.dumps(tree))
        return path

    second = {"data": {"dataset": str(data2)}, "train": {"epochs": 2, "lr": 5e-3},
              "eagle": {"greedy_target_weight": 0.5}}
    runs = [("scheduled", config("scheduled", [{"name": "one"}, {"name": "two", **second}])),
            ("one", config("one")),
            ("two", config("two", data=second["data"], train=second["train"],
                           eagle={**second["eagle"], "init_draft": str(tmp_path / "one" / "heads")}))]
    for name, path in runs:
        result = train("eagle", path)
        assert result.returncode == 0, name + result.stdout + result.stderr
    assert_same(tensors(tmp_path / "scheduled" / "stages" / "01-one" / "heads"), tensors(tmp_path / "one" / "heads"))
    assert_same(tensors(tmp_path / "scheduled" / "heads"), tensors(tmp_path / "two" / "heads"))
    assert (json.loads((tmp_path / "scheduled" / "eval.json").read_text())["top1"]
            == json.loads((tmp_path / "two" / "eval.json").read_text())["top1"])


@pytest.mark.parametrize("stage,message", [
    ("{name: b, train: {lrr: 1.0}}", "schedule[1] (b): unknown key 'train.lrr' (a stage may set: name, data.*, "
                                     "train.epochs"),
    ("{name: b, train: {batch_size: 2}}", "schedule[1] (b): train.batch_size is fixed for the whole run"),
    ("{name: b, model: {name: other}}", "schedule[1] (b): model.name is fixed for the whole run"),
    ("{name: b, eagle: {variant: eagle1}}", "schedule[1] (b): eagle.variant is fixed for the whole run"),
    ("{name: b, train: {lr: fast}}", "schedule[1] (b): train.lr must be float, got str 'fast'"),
    ("{name: b, eagle: {greedy_target_weight: 2}}",
     "schedule[1] (b): eagle.greedy_target_weight must be in [0, 1], got 2.0"),
    ("{name: b, train: {lr: -1}}", "schedule[1] (b): train.lr must be a finite number > 0, got -1.0"),
    ("{name: b, trian: {lr: 1.0}}", "schedule[1] (b): unknown section 'trian'"),
    ("{name: b, train: 3}", "schedule[1] (b).train must be a mapping of key: value, got int 3"),
    ("{name: a}", "schedule[1].name 'a' is also an earlier stage's name"),
    ("{name: 'b c'}", "schedule[1].name must be letters, digits"),
    ("3", "schedule[1] must be dict, got int 3"),
])
def test_a_bad_stage_is_refused_naming_the_stage_and_the_key(tmp_path, stage, message):
    from specheads.train.config import ConfigError, load_config
    from specheads.train.eagle import EagleTrainConfig

    config = tmp_path / "c.yaml"
    config.write_text(f"schedule:\n  - {{name: a, train: {{epochs: 2}}}}\n  - {stage}\n")
    with pytest.raises(ConfigError) as err:
        load_config(EagleTrainConfig, config)
    assert str(err.value).startswith(f"{config}: ") and message in str(err.value), str(err.value)


def test_a_bad_stage_stops_the_command_before_anything_is_written(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text(f"train: {{output_dir: {tmp_path / 'run'}}}\nschedule:\n  - {{joint: {{heads_weight: x}}}}\n")
    result = train("medusa", config)
    assert result.returncode == 2
    assert "config error" in result.stderr and "schedule[0] (stage1): joint.heads_weight must be float" in result.stderr
    assert not (tmp_path / "run").exists()


def test_the_committed_recipe_is_a_valid_schedule():
    from specheads.train.config import load_config
    from specheads.train.eagle import EagleTrainConfig
    from specheads.train.schedule import stages

    cfg = load_config(EagleTrainConfig, REPO / "configs" / "smollm2-135m-eagle3-recipe.yaml")
    found = stages(cfg)
    assert [s.name for s in found][:2] == ["3k-240", "3k-560"] and len(found) == 8  # the draft's own history
    for stage in found:
        assert Path(REPO / stage.cfg.data.dataset).is_file(), stage.cfg.data.dataset
    assert [s.cfg.eagle.greedy_target_weight for s in found] == [0.0] * 2 + [0.5] * 6
    assert [s.cfg.train.max_steps for s in found[:2]] == [240, 320]

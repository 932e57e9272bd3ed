"""Issue 33, the trainers' config, resume and concurrency faults: nothing lost, nothing silent.

Each fault is driven through the real entry point as a user would run it (train/medusa.py in a subprocess) and
must end in one of two ways: refused with a non-zero exit, a last stderr line naming the culprit, no traceback and
every file that was there before left byte for byte as it was; or honoured exactly, and said so. One tiny run
(4 updates, checkpoints at 2 and 4) is trained once per module; the tests work on copies of it.
"""

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from conftest import snapshot, synthetic_sharegpt, tiny_train_config, write_jsonl

REPO = Path(__file__).resolve().parent.parent
TRAIN = str(REPO / "train" / "medusa.py")
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}  # a tiny model: a second thread only costs CPU time


def write_config(directory: Path, model: Path, data: Path, output_dir: Path, text: str = "") -> Path:
    """tiny.yaml in `directory`: 4 updates of the tiny model (or `text` as it is)."""
    config = directory / "tiny.yaml"
    config.write_text(text or tiny_train_config(model, data, output_dir, max_steps=4))
    return config


def train(config, *extra, cwd=REPO, patch=None) -> subprocess.CompletedProcess:
    """train/medusa.py in a fresh process (stdin empty); `patch` is code run first (fault injection)."""
    args = ["--config", str(config), *map(str, extra)]
    if patch is None:
        command = [sys.executable, TRAIN, *args]
    else:
        command = [sys.executable, "-c", patch + f"\nimport sys, specheads.train.medusa as m\nsys.exit(m.main({args!r}))\n"]
    return subprocess.run(command, capture_output=True, text=True, cwd=cwd, timeout=300, stdin=subprocess.DEVNULL,
                          env=ENV)


def assert_refused(result, *names) -> str:
    """Non-zero exit, no traceback, the last stderr line naming every one of `names`."""
    assert result.returncode != 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "Traceback" not in result.stderr, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    for name in names:
        assert str(name) in last, (name, last)
    return last


def heads_tensors(run: Path) -> dict:
    return load_file(str(run / "heads" / "model.safetensors"))


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_llama_dir):
    """(config, finished run): 4 updates of the tiny Llama, checkpoints step-2 and step-4."""
    root = tmp_path_factory.mktemp("faults-train")
    data = root / "conversations.jsonl"
    write_jsonl(data, synthetic_sharegpt(40))
    config = write_config(root, tiny_llama_dir, data, root / "run")
    result = train(config)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return config, root / "run"


@pytest.fixture()
def run_copy(trained, tmp_path):
    """A private copy of the finished run, and the overrides that point the config at it."""
    config, run = trained
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    return copy, [f"train.output_dir={copy}"]


# ---- resume with changed settings (3) ----------------------------------------------------------


def test_resume_with_a_new_lr_runs_on_at_the_new_lr(trained, run_copy):
    """train.lr changed on --resume: the schedule continues from the new lr, and the run says so."""
    config, _ = trained
    run, overrides = run_copy
    result = train(config, "--resume", *overrides, "train.max_steps=8", "train.lr=1e-3")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    output = result.stdout + result.stderr
    assert "train.lr: 0.01 -> 0.001" in output, output[-3000:]
    for step in (6, 8):
        state = json.loads((run / "checkpoints" / f"step-{step:06d}" / "trainer_state.json").read_text())
        assert state["scheduler"]["base_lrs"] == [1e-3]
        (group,) = state["optimizer_param_groups"]
        assert group["initial_lr"] == 1e-3
        # cosine over 8 updates, no warm-up (int(0.1 * 8) = 0): lr = 1e-3 * 0.5 * (1 + cos(pi * step / 8))
        assert group["lr"] == pytest.approx(1e-3 * 0.5 * (1 + math.cos(math.pi * step / 8)), rel=1e-9, abs=1e-15)


def test_resume_refuses_a_changed_data_position(trained, run_copy):
    """batch_size, grad_accum and seed decide which examples the saved data position points at."""
    config, _ = trained
    run, overrides = run_copy
    before = snapshot(run, config.parent / "conversations.jsonl", config)
    result = train(config, "--resume", *overrides, "train.max_steps=8", "train.batch_size=2", "train.grad_accum=1",
                   "train.seed=7")
    assert_refused(result, "--resume", "train.batch_size: 4 -> 2", "train.grad_accum: 2 -> 1", "train.seed: 42 -> 7")
    assert snapshot(run, config.parent / "conversations.jsonl", config) == before


# ---- duplicate YAML keys (4) ---------------------------------------------------------------------


def test_duplicate_yaml_keys_are_an_error_naming_file_key_and_line(trained, tmp_path):
    config, _ = trained
    text = config.read_text()
    # a second train: section at the end, whose output_dir would win silently
    doubled = write_config(tmp_path, None, None, None, text + f"train:\n  output_dir: {tmp_path / 'second'}\n"
                                                               f"  max_steps: 2\n")
    lines = doubled.read_text().splitlines()
    first = lines.index("train:") + 1
    line = lines.index("train:", first) + 1
    before = snapshot(tmp_path, config.parent / "conversations.jsonl")
    result = train(doubled, cwd=tmp_path)
    last = assert_refused(result, str(doubled), "duplicate key 'train'", f"line {line}")
    assert f"first at line {first}" in last
    assert result.returncode == 2
    assert snapshot(tmp_path, config.parent / "conversations.jsonl") == before

    # at any depth: a repeated key inside a section names its dotted path
    from specheads.train.config import ConfigError, load_config
    from specheads.train.medusa import MedusaTrainConfig

    nested = tmp_path / "nested.yaml"
    nested.write_text("train:\n  lr: 0.1\n  batch_size: 2\n  lr: 0.2\n")
    with pytest.raises(ConfigError, match=r"nested\.yaml: line 4: duplicate key 'train\.lr' \(first at line 2\)"):
        load_config(MedusaTrainConfig, nested)
    flow = tmp_path / "flow.yaml"
    flow.write_text("data: {max_length: 64, max_length: 32}\n")
    with pytest.raises(ConfigError, match=r"flow\.yaml: line 1: duplicate key 'data\.max_length'"):
        load_config(MedusaTrainConfig, flow)


# ---- numbers checked on load (6) ------------------------------------------------------------------


@pytest.mark.parametrize("override, field, value", [
    ("train.max_steps=-3", "train.max_steps", "-3"),  # saved untrained heads, exit 0
    ("train.output_dir=", "train.output_dir", "''"),  # wrote heads/, logs/, checkpoints/ into the working directory
])
def test_bad_numbers_stop_the_run_before_anything_is_written(trained, tmp_path, override, field, value):
    """Run from tmp_path, so that what a bad number used to write lands there (and is seen); the other numbers are
    checked by the same validation, below, without a process each."""
    config, _ = trained
    before = snapshot(tmp_path, config.parent / "conversations.jsonl", config)
    result = train(config, f"train.output_dir={tmp_path / 'run'}", override, cwd=tmp_path)
    assert_refused(result, "config error", str(config), field, value)
    assert result.returncode == 2
    assert snapshot(tmp_path, config.parent / "conversations.jsonl", config) == before


@pytest.mark.parametrize("override, message", [
    ("data.heldout_size=-5", "data.heldout_size must be >= 1, got -5"),  # inverted the split: 5 train, 35 held out
    ("train.lr=.nan", "train.lr must be a finite number > 0, got nan"),  # a traceback from AdamW after the model loaded
    ("train.lr=0", "train.lr must be a finite number > 0, got 0.0"),
    ("train.lr=-1e-3", "train.lr must be a finite number > 0, got -0.001"),
    ("train.lr=.inf", "train.lr must be a finite number > 0, got inf"),
    ("train.max_steps=0", "train.max_steps must be >= 1 (or null: train.epochs decides), got 0"),
    ("train.epochs=0", "train.epochs must be a finite number > 0, got 0.0"),
    ("train.weight_decay=-1", "train.weight_decay must be a finite number >= 0, got -1.0"),
    ("train.max_grad_norm=0", "train.max_grad_norm must be a finite number > 0 (or null), got 0.0"),
    ("train.head_loss_decay=.nan", "train.head_loss_decay must be a finite number > 0, got nan"),
    ("train.adam_betas=[0.9,1.5]", "train.adam_betas must be two numbers in [0, 1), got [0.9, 1.5]"),
    ("train.eval_every=-1", "train.eval_every must be >= 0, got -1"),
    ("train.keep_checkpoints=-1", "train.keep_checkpoints must be >= 0 (0 keeps all), got -1"),
    ("train.seed=-1", "train.seed must be in [0, 2**32), got -1"),
    ("train.output_dir='  '", "train.output_dir must name a folder, got '  '"),
    ("data.heldout_size=0", "data.heldout_size must be >= 1, got 0"),
    ("data.max_train_conversations=0", "data.max_train_conversations must be >= 1 (or null: all), got 0"),
    ("data.max_heldout_eval=-2", "data.max_heldout_eval must be >= 1 (or null: all), got -2"),
    ("heads.num_heads=0", "heads.num_heads must be >= 1, got 0"),
    ("heads.num_layers=-1", "heads.num_layers must be >= 0, got -1"),
])
def test_number_checks_name_field_and_value(trained, override, message):
    from specheads.train.config import ConfigError, load_config
    from specheads.train.medusa import MedusaTrainConfig

    config, _ = trained
    with pytest.raises(ConfigError) as err:
        load_config(MedusaTrainConfig, config, [override])
    assert str(err.value).startswith(str(config)) and str(err.value).endswith(message), str(err.value)


def test_eagle_number_checks(trained):
    from specheads.train.config import ConfigError, load_config
    from specheads.train.eagle import EagleTrainConfig

    config, _ = trained
    text = config.read_text().replace("heads:\n  num_heads: 3\n", "")
    for override, message in [("train.max_steps=-3", "train.max_steps must be >= 1"),
                              ("eagle.draft_vocab_size=-1", "eagle.draft_vocab_size must be >= 0, got -1"),
                              ("eagle.input_noise=-0.1", "eagle.input_noise must be a finite number >= 0, got -0.1"),
                              ("eagle.token_loss_weight=.nan", "eagle.token_loss_weight must be a finite number >= 0")]:
        eagle = config.parent / "eagle.yaml"
        eagle.write_text(text)
        with pytest.raises(ConfigError, match=message.replace(".", r"\.").replace("(", r"\(").replace(")", r"\)")):
            load_config(EagleTrainConfig, eagle, [override])


# ---- one run per output_dir (5) --------------------------------------------------------------------

PAUSE_AT_MODEL_LOAD = """
import sys
import specheads.train.trainer as trainer
def paused(*args, **kwargs):
    print("paused", flush=True)
    sys.stdin.read()  # until the test closes stdin or kills this process
    raise SystemExit(3)
trainer.load_base_model = paused
"""


def test_a_second_run_on_the_same_output_dir_fails_at_once_and_a_killed_one_blocks_nothing(trained, run_copy):
    config, _ = trained
    run, overrides = run_copy
    args = ["--config", str(config), "--resume", *overrides]
    first = subprocess.Popen([sys.executable, "-c", PAUSE_AT_MODEL_LOAD +
                              f"\nimport specheads.train.medusa as m\nsys.exit(m.main({args!r}))\n"],
                             cwd=REPO, env=ENV, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    try:
        assert first.stdout.readline().strip() == "paused", first.stderr.read() if first.poll() is not None else ""
        before = snapshot(run)
        second = train(config, "--resume", *overrides)
        assert_refused(second, str(run), "in use", f"pid {first.pid}")
        assert snapshot(run) == before
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=60)
        first.stdout.close()
        first.stderr.close()
        first.stdin.close()
    assert first.returncode == -9
    # the OS dropped the killed holder's lock (its files stay): the next run takes it at once, as the trainer does
    from specheads.train.run_dir import OutputDirLock

    assert (run / ".lock").exists() and f"pid {first.pid} " in (run / ".lock.owner").read_text()
    lock = OutputDirLock(run)
    lock.acquire()
    assert (run / ".lock.owner").read_text().startswith(f"pid {os.getpid()} ")
    lock.release()
    assert not (run / ".lock.owner").exists()


# ---- a damaged newest checkpoint (10) -----------------------------------------------------------------


def test_truncated_trainer_state_resumes_from_the_newest_complete_checkpoint(trained, run_copy):
    config, finished = trained
    run, overrides = run_copy
    state = run / "checkpoints" / "step-000004" / "trainer_state.json"
    text = state.read_text()
    state.write_text(text[: len(text) // 2])  # a disk that filled up mid-write
    result = train(config, "--resume", *overrides)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    output = result.stdout + result.stderr
    warning = next((line for line in output.splitlines() if "step-000004" in line and "damaged" in line), None)
    assert warning is not None and "step-000002" in warning, output[-3000:]
    assert "resumed from " + str(run / "checkpoints" / "step-000002") in output
    # updates 3 and 4 again, from step 2: the same heads as the uninterrupted run
    expected, actual = heads_tensors(finished), heads_tensors(run)
    assert expected.keys() == actual.keys()
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], rtol=1e-5, atol=1e-6)
    assert json.loads(state.read_text())["step"] == 4  # rewritten whole by the resumed run

    # every checkpoint damaged: refused (starting afresh would overwrite the run), nothing touched
    for name in ("step-000002", "step-000004"):
        (run / "checkpoints" / name / "trainer_state.json").write_text("{")
    before = snapshot(run)
    refused = train(config, "--resume", *overrides)
    assert_refused(refused, "--resume", "no readable checkpoint", "step-000002", "step-000004")
    assert snapshot(run) == before


# ---- disk full while saving a checkpoint ---------------------------------------------------------


def test_disk_full_while_saving_loses_no_checkpoint(trained, run_copy):
    """A disk that fills up mid-run (an 8 KB file-size limit: the step-6 checkpoint's weights do not fit) stops
    the run with one line naming the step; the checkpoints and heads that were there are byte for byte as they
    were, no half-written checkpoint is left, and --resume without the limit goes on from step 4."""
    config, _ = trained
    run, overrides = run_copy
    kept = snapshot(run / "checkpoints", run / "heads")
    limited = ("import resource, signal\n"
               "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG\n"
               "resource.setrlimit(resource.RLIMIT_FSIZE, (8192, 8192))\n")
    result = train(config, "--resume", *overrides, "train.max_steps=8", patch=limited)
    assert_refused(result, "step-000006")
    assert snapshot(run / "checkpoints", run / "heads") == kept
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-000002", "step-000004"]
    again = train(config, "--resume", *overrides, "train.max_steps=8")
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-3000:]
    assert "resumed from" in again.stdout + again.stderr and "step-000004" in again.stdout + again.stderr
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-000006", "step-000008"]


def test_a_damaged_data_file_is_one_line_naming_file_and_line(trained, tmp_path):
    """A data line that is JSON but not an object stops the trainer with one line naming the file and line (it was
    a DataFileError traceback), before anything is written."""
    config, _ = trained
    data = tmp_path / "bad.jsonl"
    write_jsonl(data, synthetic_sharegpt(12))
    lines = data.read_text().splitlines()
    lines[4] = "[1, 2, 3]"
    data.write_text("\n".join(lines) + "\n")
    before = snapshot(tmp_path)
    result = train(config, f"data.dataset={data}", f"train.output_dir={tmp_path / 'run'}")
    assert_refused(result, f"{data}:5")
    assert snapshot(tmp_path) == before


# ---- issue 45: inputs checked before the first step; Ctrl-C; a str field on the command line -----------------


def test_a_missing_dataset_in_a_later_stage_stops_the_run_before_the_first_step(trained, tmp_path):
    """The second stage's data.dataset is not there: the run used to train the first stage (hours, in the 8-stage
    recipe) and then stop. Every stage's inputs are resolved first: one line naming the stage and the file, no
    checkpoint, no stage folder, no heads."""
    config, _ = trained
    missing = tmp_path / "more-data.jsonl"
    scheduled = write_config(tmp_path, None, None, None, config.read_text() + f"""
schedule:
  - name: first
  - name: more-data
    data: {{dataset: {missing}}}
""")
    run = tmp_path / "run"
    result = train(scheduled, f"train.output_dir={run}")
    assert_refused(result, "schedule[1] (more-data)", "data.dataset", f"{missing}: no such file")
    assert not any((run / name).exists() for name in ("checkpoints", "stages", "heads")), list(run.iterdir())


def test_an_output_dir_in_what_the_run_reads_is_refused_before_anything_is_written(trained, tmp_path, tiny_llama_dir):
    """train.output_dir that is, or lies inside, an input (the model folder, a later stage's data) would get the
    run's lock, heads and checkpoints written into what it reads: one line naming both, before anything is
    written there."""
    config, _ = trained
    model = tmp_path / "model"
    shutil.copytree(tiny_llama_dir, model)
    before = snapshot(model), sorted(model.rglob("*"))
    for out in (model, model / "run"):
        result = train(config, f"model.name={model}", f"train.output_dir={out}")
        assert_refused(result, "train.output_dir", "model.name", "apart from every input")
        assert (snapshot(model), sorted(model.rglob("*"))) == before  # not even the lock folder
    data = tmp_path / "later" / "answers.jsonl"
    data.parent.mkdir()
    write_jsonl(data, synthetic_sharegpt(40))
    scheduled = write_config(tmp_path, None, None, None, config.read_text() + f"""
schedule:
  - name: first
  - name: later
    data: {{dataset: {data}}}
""")
    result = train(scheduled, f"train.output_dir={data}")
    assert_refused(result, "schedule[1] (later)", "train.output_dir", "data.dataset")
    assert data.is_file() and not (tmp_path / "run").exists()


def test_a_dataset_smaller_than_one_batch_is_one_line(trained, tmp_path):
    """6 conversations, half held out: 3 left for batches of 4 (a ValueError traceback from the data order)."""
    config, _ = trained
    data = tmp_path / "small.jsonl"
    write_jsonl(data, synthetic_sharegpt(6))
    result = train(config, f"data.dataset={data}", f"train.output_dir={tmp_path / 'run'}")
    assert_refused(result, "3 training examples cannot fill one batch of 4", "train.batch_size", "data.dataset")
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_ctrl_c_during_training_is_one_line_with_the_resume_hint(trained, tmp_path):
    """SIGINT mid-run: exit 130, no traceback (it was 29 frames), a last line saying to rerun with --resume, and
    the checkpoints written so far kept."""
    config, _ = trained
    run = tmp_path / "run"
    process = subprocess.Popen([sys.executable, TRAIN, "--config", str(config), f"train.output_dir={run}",
                                "train.max_steps=100000"], cwd=REPO, env=ENV, stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               # as from a terminal: a background job's children ignore SIGINT otherwise
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 240
        while not (run / "checkpoints" / "step-000002").is_dir() and time.monotonic() < deadline:
            assert process.poll() is None, process.communicate()[1][-3000:]
            time.sleep(0.2)
        assert (run / "checkpoints" / "step-000002").is_dir(), "no checkpoint within 240 s"
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=120)
    finally:
        process.kill()
    assert process.returncode == 130, err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert "interrupted" in last and "--resume" in last and str(run) in last, last
    assert (run / "checkpoints" / "step-000002" / "trainer_state.json").is_file()


def test_a_str_field_on_the_command_line_keeps_the_text(trained):
    """`train.mixed_precision=no` was read as YAML's boolean False and refused as not a str; a str field takes
    the override as written (a YAML-quoted one too), other fields still go through YAML."""
    from specheads.train.config import ConfigError, load_config
    from specheads.train.medusa import MedusaTrainConfig

    config, _ = trained
    cfg = load_config(MedusaTrainConfig, config, ["train.mixed_precision=no", "model.name=1.5", "train.lr=3e-4"])
    assert (cfg.train.mixed_precision, cfg.model.name, cfg.train.lr) == ("no", "1.5", 3e-4)
    assert load_config(MedusaTrainConfig, config, ["train.mixed_precision='no'"]).train.mixed_precision == "no"
    with pytest.raises(ConfigError, match="train.mixed_precision must be auto, bf16, fp16 or no, got 'off'"):
        load_config(MedusaTrainConfig, config, ["train.mixed_precision=off"])
    with pytest.raises(ConfigError, match="train.batch_size must be int"):
        load_config(MedusaTrainConfig, config, ["train.batch_size=no"])

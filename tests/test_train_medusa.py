"""Medusa-1 training end to end on a tiny random Llama: outputs, resume after SIGKILL, non-finite loss."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from conftest import KILL_IN_NTH_SAVE

REPO = Path(__file__).resolve().parent.parent


NAN_FROM_STEP = """
import specheads.train.medusa as medusa
original, calls = medusa.medusa_loss, [0]
def poisoned_loss(*args, **kwargs):
    calls[0] += 1
    total, per_head = original(*args, **kwargs)
    return (total * float("nan") if calls[0] > {n} else total), per_head
medusa.medusa_loss = poisoned_loss
"""


def run_training(config, *extra, patch=None, check=True):
    """Run train/medusa.py in a fresh process; `patch` is code run first (fault injection)."""
    if patch is None:
        cmd = [sys.executable, str(REPO / "train" / "medusa.py"), "--config", str(config), *extra]
    else:
        args = ["--config", str(config), *extra]
        cmd = [sys.executable, "-c", patch + f"\nimport sys, specheads.train.medusa as m\nsys.exit(m.main({args!r}))\n"]
    result = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    if check and result.returncode != 0:
        raise AssertionError(f"training failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    return result


def heads_tensors(run_dir):
    return load_file(str(Path(run_dir) / "heads" / "model.safetensors"))


def test_training_writes_heads_eval_and_tensorboard(run_config, tmp_path):
    result = run_training(run_config)
    run = tmp_path / "run"
    assert "held-out accuracy" in result.stdout and "top-1" in result.stdout
    evaluation = json.loads((run / "eval.json").read_text())
    assert len(evaluation["top1"]) == 3 and all(0 <= a <= 1 for a in evaluation["top5"])
    heads_config = json.loads((run / "heads" / "config.json").read_text())
    assert heads_config["num_heads"] == 3 and heads_config["heldout_accuracy"]["top1"] == evaluation["top1"]
    from transformers import AutoModelForCausalLM

    from specheads.heads.fingerprint import base_fingerprint

    base = AutoModelForCausalLM.from_pretrained(heads_config["base_model_name_or_path"])
    assert heads_config["base_fingerprint"] == base_fingerprint(base)  # which base they were trained on
    assert any(f.name.startswith("events.out.tfevents") for f in (run / "logs").rglob("*"))
    checkpoints = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert checkpoints == ["step-000004", "step-000006"]  # keep_checkpoints=2
    # the blocks moved away from their zero init
    assert any(t.abs().sum() > 0 for t in heads_tensors(run).values())
    # a second run without --resume refuses to overwrite
    again = run_training(run_config, check=False)
    assert again.returncode != 0 and "pass --resume" in again.stderr
    # resuming with another head layout is refused, naming what changed
    other = run_training(run_config, "--resume", "heads.num_heads=2", check=False)
    assert other.returncode != 0 and "heads.num_heads: 3 -> 2" in other.stderr


def test_resume_after_sigkill_matches_uninterrupted_run(run_config, tmp_path):
    reference = run_training(run_config, "train.output_dir=" + str(tmp_path / "reference"))
    assert reference.returncode == 0

    interrupted = tmp_path / "interrupted"
    # checkpoint.save_file runs twice per checkpoint (optimizer, rng). Call 3 is the optimizer of
    # the step-4 checkpoint: the process dies with that checkpoint half-written (heads already on disk).
    killed = run_training(run_config, "train.output_dir=" + str(interrupted), patch=KILL_IN_NTH_SAVE.format(n=3), check=False)
    assert killed.returncode == -9
    complete = sorted(p.name for p in (interrupted / "checkpoints").iterdir() if not p.name.startswith("."))
    assert complete == ["step-000002"]
    assert (interrupted / "checkpoints" / ".tmp-step-000004" / "heads" / "model.safetensors").is_file()
    resumed = run_training(run_config, "train.output_dir=" + str(interrupted), "--resume")
    assert "resumed from" in resumed.stdout + resumed.stderr

    expected, actual = heads_tensors(tmp_path / "reference"), heads_tensors(interrupted)
    assert expected.keys() == actual.keys()
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], rtol=1e-5, atol=1e-6)
    assert json.loads((interrupted / "eval.json").read_text())["top1"] == pytest.approx(
        json.loads((tmp_path / "reference" / "eval.json").read_text())["top1"])


def test_non_finite_loss_stops_and_keeps_last_good_checkpoint(run_config, tmp_path):
    # micro-batches 1-4 are fine (2 updates with grad_accum=2), the 5th loss is NaN
    result = run_training(run_config, "train.save_every=1", patch=NAN_FROM_STEP.format(n=4), check=False)
    assert result.returncode == 1
    assert "non-finite loss" in result.stdout + result.stderr
    checkpoints = sorted((tmp_path / "run" / "checkpoints").glob("step-*"))
    assert [c.name for c in checkpoints] == ["step-000001", "step-000002"], "the last good checkpoints survive"
    assert "Last good checkpoint: " + str(checkpoints[-1]) in result.stdout + result.stderr
    for tensor in load_file(str(checkpoints[-1] / "heads" / "model.safetensors")).values():
        assert torch.isfinite(tensor).all()
    assert not (tmp_path / "run" / "heads").exists()


def test_accelerate_launch_entry_point(run_config, tmp_path):
    accelerate = Path(sys.executable).parent / "accelerate"
    result = subprocess.run([str(accelerate), "launch", "--num_processes", "1", "--num_machines", "1", "--cpu",
                             "--mixed_precision", "no", "--dynamo_backend", "no",
                             str(REPO / "train" / "medusa.py"), "--config", str(run_config), "train.max_steps=2"],
                            capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "run" / "heads" / "model.safetensors").is_file()


def test_cached_hidden_states_and_chunked_loss(run_config, tmp_path):
    """The chunked loss trains the same heads; epoch 2 reads the states cached in epoch 1 (one file per example)."""
    cache = tmp_path / "cache"
    runs = {"online": [], "chunked": ["heads.loss_chunk=16"],
            "cached": ["heads.loss_chunk=16", "heads.cache_hidden_states=true", f"heads.cache_dir={cache}"]}
    for name, extra in runs.items():
        run_training(run_config, "train.output_dir=" + str(tmp_path / name), "train.max_steps=8", *extra)
    files = {p.name.split("-")[0]: len(list(p.glob("*.safetensors"))) for p in cache.iterdir()}
    assert files == {"train": 32, "heldout": 8}  # 8 updates x 4 x grad_accum 2 = 2 epochs of 32: each computed once
    online, chunked, cached = (heads_tensors(tmp_path / name) for name in runs)
    for name in online:
        torch.testing.assert_close(chunked[name], online[name], rtol=1e-4, atol=1e-5)
        # bf16 states on disk: close, not equal
        assert (cached[name] - online[name]).norm() <= 0.05 * online[name].norm() + 1e-6, name
    refused = run_training(run_config, "mode=medusa2", "heads.cache_hidden_states=true", check=False)
    assert refused.returncode != 0 and "needs a frozen base" in refused.stderr


def test_draft_vocabulary_is_the_most_frequent_answer_tokens(run_config, tmp_path):
    """heads.draft_vocab_size: the heads store the ids of the most frequent assistant tokens and are
    evaluated on every held-out token (those outside the vocabulary count as misses)."""
    from specheads.data.models import load_tokenizer
    from specheads.heads import MedusaHeads
    from specheads.train.config import load_config
    from specheads.train.data_order import load_examples
    from specheads.train.medusa import MedusaTrainConfig

    run_training(run_config, "train.max_steps=2", "heads.draft_vocab_size=24")
    heads = MedusaHeads.from_pretrained(tmp_path / "run" / "heads")
    cfg = load_config(MedusaTrainConfig, run_config)
    train, _ = load_examples(cfg, load_tokenizer(cfg.model.name))
    counts = torch.zeros(heads.config.vocab_size)
    for example in train:
        labels = torch.tensor(example.labels)
        counts += torch.bincount(labels[labels >= 0], minlength=heads.config.vocab_size)
    assert heads.draft_ids.shape == (24,) and counts[heads.draft_ids].min() >= counts.sort(descending=True).values[23]
    evaluation = json.loads((tmp_path / "run" / "eval.json").read_text())
    full = run_training(run_config, "train.max_steps=2", f"train.output_dir={tmp_path / 'full'}")
    assert full.returncode == 0
    assert evaluation["tokens"] == json.loads((tmp_path / "full" / "eval.json").read_text())["tokens"]
    refused = run_training(run_config, "mode=medusa2", "heads.draft_vocab_size=24", check=False)
    assert refused.returncode != 0 and "medusa1 only" in refused.stderr


def test_draft_vocab_script_restricts_trained_heads(run_config, tmp_path):
    import importlib.util

    from specheads.heads import MedusaHeads

    run_training(run_config, "train.max_steps=2")
    spec = importlib.util.spec_from_file_location("draft_vocab", REPO / "scripts" / "draft_vocab.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    heads_dir = tmp_path / "run" / "heads"
    before = MedusaHeads.from_pretrained(heads_dir)
    (heads_dir / "README.md").write_text("model card")
    result = script.main(["--heads", str(heads_dir), "--size", "24"])
    assert (heads_dir / "README.md").read_text() == "model card"
    assert result["changed"] and 0 < result["heldout_coverage"] <= 1
    after = MedusaHeads.from_pretrained(heads_dir)
    assert after.config.draft_vocab_size == 24 and sorted(p.name for p in heads_dir.parent.iterdir()) == sorted(
        ["heads", "checkpoints", "logs", "eval.json", "evaluations.jsonl", "train_config.json", ".lock"])  # no staging or old folder left
    for name, tensor in before.state_dict().items():
        torch.testing.assert_close(after.state_dict()[name], tensor)
    assert script.main(["--heads", str(heads_dir), "--size", "24"])["changed"] is False
    # a second `make demo`: training resumes (and re-reports) the finished run, then the vocabulary is given again
    run_training(run_config, "train.max_steps=2", "--resume")
    script.main(["--heads", str(heads_dir), "--size", "24"])
    assert MedusaHeads.from_pretrained(heads_dir).config.draft_vocab_size == 24
    with pytest.raises(SystemExit, match="already have a draft vocabulary of 24 tokens"):
        script.main(["--heads", str(heads_dir), "--size", "30"])
    config = json.loads((heads_dir / "config.json").read_text())
    (heads_dir / "adapter").mkdir()
    (heads_dir / "adapter" / "adapter_config.json").write_text("{}")
    (heads_dir / "config.json").write_text(json.dumps({**config, "adapter": "adapter"}))
    with pytest.raises(SystemExit, match="Medusa-2 heads"):
        script.main(["--heads", str(heads_dir), "--size", "24"])

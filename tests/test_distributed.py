"""`accelerate launch --num_processes 2` on CPU: data parallel over gloo, and DeepSpeed ZeRO-2 / ZeRO-3 with
DeepSpeed's CPU accelerator, for Medusa-1 and Medusa-2 on a tiny model, using the shipped accelerate configs.

Each run must: really be 2 processes of the named kind, keep identical trained weights on both ranks,
lower the loss, and leave checkpoints and heads that load (ZeRO-3: gathered to full tensors). A DeepSpeed run
resumed from a checkpoint (ZeRO-2: after a kill -9 of both ranks mid-checkpoint; ZeRO-3: from the uninterrupted
run's checkpoint) ends with the uninterrupted run's weights: the checkpoint holds ZeRO's optimizer state.
Each kind of run is launched once per module (`runs`); tests that continue one work on copies."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from conftest import synthetic_sharegpt, write_jsonl
from test_medusa2 import scalars

REPO = Path(__file__).resolve().parent.parent
LAUNCH = {
    "ddp": ["--multi_gpu"],  # on a machine without GPUs the trainer turns this into a gloo CPU group
    "zero2": ["--config_file", str(REPO / "configs" / "accelerate" / "deepspeed_zero2.yaml")],
    "zero3": ["--config_file", str(REPO / "configs" / "accelerate" / "deepspeed_zero3.yaml")],
}


def launch(kind: str, mode: str, folder: Path, data: Path, tiny_llama_dir, *extra, script=None, check=True):
    """8 updates (checkpoints every 4) of `mode` in 2 processes of `kind`, output in folder/run; `script` replaces
    train/medusa.py (fault injection), `extra` are command-line arguments (--resume, overrides)."""
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / f"{mode}.yaml"
    config.write_text(f"""
mode: {mode}
model: {{name: {tiny_llama_dir}, dtype: fp32}}
data: {{dataset: {data}, max_length: 64, heldout_size: 8}}
heads: {{num_heads: 2}}
lora: {{r: 4, alpha: 8}}
joint: {{heads_weight: 1.0}}
train: {{output_dir: {folder / 'run'}, max_steps: 8, batch_size: 2, grad_accum: 2, lr: 3.0e-2,
         mixed_precision: "no", log_every: 1, save_every: 4}}
""")
    command = [str(Path(sys.executable).parent / "accelerate"), "launch", *LAUNCH[kind], "--num_processes", "2",
               "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
    if kind != "ddp":
        command += ["--gradient_accumulation_steps", "2", "--gradient_clipping", "1.0"]
    command += [str(script or REPO / "train" / "medusa.py"), "--config", str(config), *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(command, capture_output=True, text=True, cwd=REPO, env=env, timeout=600)
    if check:
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    return result, folder / "run"


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_llama_dir):
    """trained(kind, mode) -> (result, run folder): that run, launched the first time it is asked for."""
    root = tmp_path_factory.mktemp("distributed")
    data = root / "conversations.jsonl"
    write_jsonl(data, synthetic_sharegpt(48))
    done = {}

    def trained(kind, mode):
        if (kind, mode) not in done:
            done[kind, mode] = launch(kind, mode, root / f"{kind}-{mode}", data, tiny_llama_dir)
        return done[kind, mode]

    trained.data = data
    return trained


@pytest.mark.parametrize("kind, mode", [("ddp", "medusa1"), ("ddp", "medusa2"), ("zero2", "medusa1"),
                                        ("zero3", "medusa2")])
def test_two_processes_train_in_step(kind, mode, runs, tiny_llama_dir):
    from specheads.data.models import load_base_model
    from specheads.heads import MedusaHeads
    from specheads.heads.joint import load_adapted_base

    result, run = runs(kind, mode)
    expected_type = "MULTI_CPU" if kind == "ddp" else "DEEPSPEED"
    assert f"2 process(es), {expected_type}" in result.stdout + result.stderr
    evaluation = json.loads((run / "eval.json").read_text())
    assert evaluation["throughput"]["processes"] == 2
    checksums = evaluation["rank_checksums"]
    if kind == "zero3":
        assert checksums is None  # partitioned; the gathered save is checked below
    else:
        assert len(checksums) == 2 and checksums[0] == checksums[1], "ranks diverged"
    losses = scalars(run, "train/loss_head1")
    assert len(losses) == 8 and sum(losses[-2:]) < sum(losses[:2]), losses

    checkpoint = run / "checkpoints" / "step-000008" / "heads"
    final = load_file(str(run / "heads" / "model.safetensors"))
    saved = load_file(str(checkpoint / "model.safetensors"))
    assert final.keys() == saved.keys() and all(torch.equal(final[k], saved[k]) for k in final)
    assert all(t.numel() > 0 for t in final.values()) and any(t.abs().sum() > 0 for t in final.values())
    base = load_base_model(str(tiny_llama_dir), "fp32")
    if mode == "medusa2":
        adapter = load_file(str(checkpoint / "adapter" / "adapter_model.safetensors"))
        assert all(t.numel() > 0 for t in adapter.values())
        base = load_adapted_base(base, checkpoint)
    heads = MedusaHeads.from_pretrained(checkpoint, base_model=base)
    logits = heads(torch.zeros(1, base.config.hidden_size), base.get_output_embeddings())
    assert logits.shape == (2, 1, base.config.vocab_size)


# Every rank, once DeepSpeed has written its files of checkpoint 6 and before the trainer's own: kill -9 (as the
# machine going away would), so the staging folder holds DeepSpeed's half of a checkpoint and no trainer state.
DIE_IN_CHECKPOINT_6 = """
import os, signal, sys
import specheads.train.trainer as trainer
original = trainer.save_engine_state
def dying(accelerator, engine, root, step):
    record = original(accelerator, engine, root, step)
    if step == 6:
        os.kill(os.getpid(), signal.SIGKILL)
    return record
trainer.save_engine_state = dying
import specheads.train.medusa as medusa
sys.exit(medusa.main())
"""


def trained_tensors(run: Path, mode: str) -> dict:
    names = ["model.safetensors"] + (["adapter/adapter_model.safetensors"] if mode == "medusa2" else [])
    return {f"{name}:{key}": tensor for name in names for key, tensor in load_file(str(run / "heads" / name)).items()}


def assert_same_weights(actual: dict, expected: dict) -> None:
    """Bit for bit: the same processes in the same reduction order, and the checkpoint holds all the state."""
    assert actual.keys() == expected.keys()
    differ = {name: (actual[name] - expected[name]).abs().max().item() for name in expected
              if not torch.equal(actual[name], expected[name])}
    worst = max(differ, key=differ.get) if differ else None
    assert not differ, (f"{len(differ)} of {len(expected)} tensors differ from the uninterrupted run; largest "
                        f"|difference| {differ.get(worst)} in {worst}")


def test_zero2_killed_mid_checkpoint_resumes_to_the_uninterrupted_weights(runs, tmp_path, tiny_llama_dir):
    """ZeRO-2, both ranks killed -9 inside checkpoint 6 (checkpoints every 2 updates): --resume continues from
    checkpoint 4 with its ZeRO optimizer state (Adam's moments, fp32 master weights) and ends with the weights of
    the uninterrupted 8-update run, bit for bit. With the moments restarted they differ by ~4e-2 (lr 3e-2)."""
    from specheads.train.checkpoint import checkpoint_problem

    _, reference = runs("zero2", "medusa1")
    script = tmp_path / "dying_medusa.py"
    script.write_text(DIE_IN_CHECKPOINT_6)
    killed, run = launch("zero2", "medusa1", tmp_path, runs.data, tiny_llama_dir, "train.save_every=2",
                         script=script, check=False)
    assert killed.returncode != 0 and "Signal 9 (SIGKILL)" in killed.stderr, killed.stderr[-3000:]
    checkpoints = run / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == [".tmp-step-000006", "step-000002", "step-000004"]
    staged = checkpoints / ".tmp-step-000006"
    assert list((staged / "deepspeed" / "zero").glob("*optim_states.pt")) and not (staged / "trainer_state.json").exists()
    state = json.loads((checkpoints / "step-000004" / "trainer_state.json").read_text())
    assert state["deepspeed"] == {"folder": "deepspeed", "tag": "zero", "zero_stage": 2, "processes": 2}
    assert len(list((checkpoints / "step-000004" / "deepspeed" / "zero").glob("*optim_states.pt"))) == 2

    resumed, _ = launch("zero2", "medusa1", tmp_path, runs.data, tiny_llama_dir, "--resume", "train.save_every=2")
    output = resumed.stdout + resumed.stderr
    assert f"resumed from {checkpoints / 'step-000004'}" in output, output[-3000:]
    assert "restored DeepSpeed ZeRO-2 optimizer state" in output
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step-000006", "step-000008"]  # keep_checkpoints 2
    assert_same_weights(trained_tensors(run, "medusa1"), trained_tensors(reference, "medusa1"))
    evaluation = json.loads((run / "eval.json").read_text())
    assert evaluation["rank_checksums"] == json.loads((reference / "eval.json").read_text())["rank_checksums"]

    # a DeepSpeed file cut short or missing makes the checkpoint damaged (--resume takes the one before it)
    last = checkpoints / "step-000008"
    assert checkpoint_problem(last) is None
    rank1 = next((last / "deepspeed" / "zero").glob("*rank_1_*optim_states.pt"))
    rank1.write_bytes(rank1.read_bytes()[:-100])
    assert checkpoint_problem(last) == f"{rank1.relative_to(last)}: not a complete torch.save archive"
    rank1.unlink()
    assert "holds 1 *optim_states.pt files, one per rank of the 2" in checkpoint_problem(last)


@pytest.mark.parametrize("kind", ["ddp", "zero3"])
def test_medusa2_resumes_to_the_uninterrupted_weights(kind, runs, tmp_path, tiny_llama_dir):
    """Medusa-2 (LoRA dropout: the ranks' generators drift apart, and every rank's is restored), in 2 processes of
    data parallelism or ZeRO-3 (weights partitioned too): the uninterrupted run's folder as a run killed after
    checkpoint 4 leaves it; --resume ends with its weights, bit for bit."""
    _, reference = runs(kind, "medusa2")
    run = tmp_path / "run"
    shutil.copytree(reference, run)
    for later in ("heads", "eval.json", "checkpoints/step-000008"):
        shutil.rmtree(run / later) if (run / later).is_dir() else (run / later).unlink()
    resumed, _ = launch(kind, "medusa2", tmp_path, runs.data, tiny_llama_dir, "--resume")
    output = resumed.stdout + resumed.stderr
    assert f"resumed from {run / 'checkpoints' / 'step-000004'}" in output, output[-3000:]
    assert ("restored DeepSpeed ZeRO-3 optimizer state" in output) == (kind == "zero3")
    assert_same_weights(trained_tensors(run, "medusa2"), trained_tensors(reference, "medusa2"))


def test_resume_refuses_another_zero_stage():
    from specheads.train.config import RunError
    from specheads.train.resume import check_same_run

    with pytest.raises(RunError, match=r"step-000004 was trained with other settings \(DeepSpeed zero_stage: 2 -> 3\)"):
        check_same_run({}, {}, "step-000004", 2, 2, 2, 3)
    check_same_run({}, {}, "step-000004", 2, 2, None, 3)  # a checkpoint from before DeepSpeed's state was kept


@pytest.mark.parametrize("kind", ["ddp", "zero2"])
def test_eagle3_trains_in_two_processes(kind, tmp_path, tiny_llama_dir):
    """EAGLE-3 under DDP and DeepSpeed: the draft's own methods (fuse, logits, its vocabulary map) are reached
    through the wrapper's module (they once were called on the wrapper: AttributeError under both), ranks agree."""
    data = tmp_path / "conversations.jsonl"
    write_jsonl(data, synthetic_sharegpt(24))
    config = tmp_path / "eagle3.yaml"
    config.write_text(f"""
model: {{name: {tiny_llama_dir}, dtype: fp32}}
data: {{dataset: {data}, max_length: 64, heldout_size: 4}}
eagle: {{variant: eagle3, draft_vocab_size: 256, aux_layer_ids: [0, 1, 1], ttt_steps: 2, eval_steps: 2,
         cache_features: false}}
train: {{output_dir: {tmp_path / 'run'}, max_steps: 2, batch_size: 2, grad_accum: 2, lr: 1.0e-3,
         mixed_precision: "no", log_every: 1, save_every: 2, accept_positions: 16}}
""")
    command = [str(Path(sys.executable).parent / "accelerate"), "launch", *LAUNCH[kind], "--num_processes", "2",
               "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
    if kind != "ddp":
        command += ["--gradient_accumulation_steps", "2", "--gradient_clipping", "1.0"]
    command += [str(REPO / "train" / "eagle.py"), "--config", str(config)]
    result = subprocess.run(command, capture_output=True, text=True, cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"},
                            timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    checksums = json.loads((tmp_path / "run" / "eval.json").read_text())["rank_checksums"]
    assert len(checksums) == 2 and checksums[0] == checksums[1], "ranks diverged"

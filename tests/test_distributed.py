"""`accelerate launch --num_processes 2` on CPU: data parallel over gloo, and DeepSpeed ZeRO-2 / ZeRO-3 with
DeepSpeed's CPU accelerator, for Medusa-1 and Medusa-2 on a tiny model, using the shipped accelerate configs.

Each run must: really be 2 processes of the named kind, keep identical trained weights on both ranks,
lower the loss, and leave checkpoints and heads that load (ZeRO-3: gathered to full tensors)."""

import json
import os
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


def launch(kind: str, mode: str, tmp_path, tiny_llama_dir):
    data = tmp_path / "conversations.jsonl"
    write_jsonl(data, synthetic_sharegpt(48))
    config = tmp_path / f"{mode}.yaml"
    config.write_text(f"""
mode: {mode}
model: {{name: {tiny_llama_dir}, dtype: fp32}}
data: {{dataset: {data}, max_length: 64, heldout_size: 8}}
heads: {{num_heads: 2}}
lora: {{r: 4, alpha: 8}}
joint: {{heads_weight: 1.0}}
train: {{output_dir: {tmp_path / 'run'}, max_steps: 8, batch_size: 2, grad_accum: 2, lr: 3.0e-2,
         mixed_precision: "no", log_every: 1, save_every: 4}}
""")
    command = [str(Path(sys.executable).parent / "accelerate"), "launch", *LAUNCH[kind], "--num_processes", "2",
               "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
    if kind != "ddp":
        command += ["--gradient_accumulation_steps", "2", "--gradient_clipping", "1.0"]
    command += [str(REPO / "train" / "medusa.py"), "--config", str(config)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(command, capture_output=True, text=True, cwd=REPO, env=env, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    return result, tmp_path / "run"


@pytest.mark.parametrize("kind, mode", [("ddp", "medusa1"), ("ddp", "medusa2"), ("zero2", "medusa1"),
                                        ("zero3", "medusa2")])
def test_two_processes_train_in_step(kind, mode, tmp_path, tiny_llama_dir):
    from specheads.data.models import load_base_model
    from specheads.heads import MedusaHeads
    from specheads.heads.joint import load_adapted_base

    result, run = launch(kind, mode, tmp_path, tiny_llama_dir)
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

"""Medusa-2: the joint loss, LoRA training end to end, resume, the two saved forms, and decoding with them."""

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from conftest import write_jsonl
from test_train_medusa import KILL_IN_NTH_SAVE, run_training

from specheads.data.tokenization import IGNORE_INDEX
from specheads.train.losses import heads_weight_at, medusa2_loss, next_token_positions

REPO = Path(__file__).resolve().parent.parent


# ---- pure functions ------------------------------------------------------------------------

def test_heads_weight_warms_up_then_stays():
    assert heads_weight_at(0, 0.2, 10, "sine") == 0.0
    assert heads_weight_at(5, 0.2, 10, "sine") == pytest.approx(0.2 * math.sin(math.pi / 4))
    assert heads_weight_at(5, 0.2, 10, "linear") == pytest.approx(0.1)
    assert heads_weight_at(10, 0.2, 10, "sine") == heads_weight_at(99, 0.2, 10, "linear") == 0.2
    assert heads_weight_at(0, 0.2, 10, "constant") == heads_weight_at(0, 0.2, 0, "sine") == 0.2


def test_next_token_positions_hand_checked():
    labels = torch.tensor([[IGNORE_INDEX, IGNORE_INDEX, 7, 8, IGNORE_INDEX],
                           [IGNORE_INDEX, 5, IGNORE_INDEX, 6, 9]])
    keep, targets = next_token_positions(labels)
    assert keep.tolist() == [[False, True, True, False, False], [True, False, True, True, False]]
    assert targets.tolist() == [7, 8, 5, 6, 9]


def test_medusa2_loss_is_base_term_plus_weighted_heads():
    torch.manual_seed(0)
    lm_logits, lm_targets = torch.randn(6, 11), torch.randint(0, 11, (6,))
    head_logits, head_targets = torch.randn(2, 5, 11), torch.randint(0, 11, (2, 5))
    head_targets[1, 4] = IGNORE_INDEX
    heads_only = [F.cross_entropy(head_logits[0], head_targets[0]), F.cross_entropy(head_logits[1, :4], head_targets[1, :4])]
    total, parts = medusa2_loss(lm_logits, lm_targets, head_logits, head_targets, heads_weight=0.5, decay=0.8)
    expected_base = F.cross_entropy(lm_logits, lm_targets)
    torch.testing.assert_close(parts, torch.stack([expected_base, *heads_only]))
    torch.testing.assert_close(total, expected_base + 0.5 * (0.8 * heads_only[0] + 0.64 * heads_only[1]))
    # self-distillation: KL(teacher ‖ student) is 0 when they agree and matches the definition otherwise
    _, same = medusa2_loss(lm_logits, lm_targets, head_logits, head_targets, 0.5, teacher_logits=lm_logits)
    assert same[0].abs() < 1e-6
    teacher = torch.randn(6, 11)
    _, parts = medusa2_loss(lm_logits, lm_targets, head_logits, head_targets, 0.5, teacher_logits=teacher)
    p, log_q = teacher.softmax(-1), lm_logits.log_softmax(-1)
    torch.testing.assert_close(parts[0], (p * (p.log() - log_q)).sum(-1).mean())


# ---- training ------------------------------------------------------------------------------

@pytest.fixture()
def medusa2_config(run_config):
    """The Medusa-1 test config in medusa2 mode, with a small LoRA and a 2-update λ warm-up."""
    run_config.write_text("mode: medusa2\n" + run_config.read_text() + """
lora:
  r: 4
  alpha: 8
joint:
  heads_weight: 0.5
  heads_weight_warmup_steps: 2
""")
    return run_config


def scalars(run_dir, tag):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (events,) = Path(run_dir, "logs").glob("*/events.out.tfevents*")  # the run's scalars (not the hparams files)
    accumulator = EventAccumulator(str(events))
    accumulator.Reload()
    return [event.value for event in accumulator.Scalars(tag)]


def test_medusa2_trains_lora_and_heads_and_reports_base_loss(medusa2_config, tmp_path, tiny_llama_dir):
    result = run_training(medusa2_config)
    run = tmp_path / "run"
    assert "held-out LM loss of the base" in result.stdout
    evaluation = json.loads((run / "eval.json").read_text())
    assert math.isfinite(evaluation["lm_loss_before"]) and evaluation["lm_loss_before"] != evaluation["lm_loss_after"]
    config = json.loads((run / "heads" / "config.json").read_text())
    assert config["adapter"] == "adapter" and config["quality_guard"]["heldout_lm_loss_after"] == evaluation["lm_loss_after"]
    adapter = load_file(str(run / "heads" / "adapter" / "adapter_model.safetensors"))
    lora_b = [t for name, t in adapter.items() if "lora_B" in name]
    assert len(lora_b) == 2 * 7, "every attention and MLP projection of both layers carries LoRA"
    assert all(t.abs().sum() > 0 for t in lora_b), "LoRA B starts at zero and must have trained"
    assert any(t.abs().sum() > 0 for t in load_file(str(run / "heads" / "model.safetensors")).values())
    assert not any(name.startswith("base.") for name in load_file(str(run / "heads" / "model.safetensors")))
    assert len(scalars(run, "train/loss_base")) == len(scalars(run, "train/loss_head1")) == 6
    # the base model on disk is untouched: training never writes it
    assert not list(Path(tiny_llama_dir).glob("adapter*"))


def test_medusa2_resume_after_sigkill_matches_uninterrupted_run(medusa2_config, tmp_path):
    run_training(medusa2_config, "train.output_dir=" + str(tmp_path / "reference"))
    interrupted = tmp_path / "interrupted"
    killed = run_training(medusa2_config, "train.output_dir=" + str(interrupted), patch=KILL_IN_NTH_SAVE.format(n=3),
                          check=False)
    assert killed.returncode == -9
    resumed = run_training(medusa2_config, "train.output_dir=" + str(interrupted), "--resume")
    assert "resumed from" in resumed.stdout + resumed.stderr
    for name in ("model.safetensors", "adapter/adapter_model.safetensors"):
        expected = load_file(str(tmp_path / "reference" / "heads" / name))
        actual = load_file(str(interrupted / "heads" / name))
        assert expected.keys() == actual.keys()
        for key in expected:
            torch.testing.assert_close(actual[key], expected[key], rtol=1e-5, atol=1e-6)


def test_two_stage_recipe_with_self_distillation_kl(medusa2_config, tmp_path):
    stage1 = run_training(medusa2_config, "mode=medusa1", "train.output_dir=" + str(tmp_path / "stage1"))
    assert stage1.returncode == 0
    run_training(medusa2_config, "joint.base_loss=distill_kl", f"joint.init_heads={tmp_path / 'stage1' / 'heads'}",
                 "train.max_steps=2", "train.output_dir=" + str(tmp_path / "stage2"))
    # LoRA B starts at zero, so the adapted base is the teacher itself at the first update: KL = 0; later a KL
    # (>= 0) up to float rounding (one thread per test worker once gave -2.6e-10 right after that update)
    kl = scalars(tmp_path / "stage2", "train/loss_base")
    assert abs(kl[0]) < 1e-5 and kl[-1] >= -1e-6
    # the heads started from stage 1: their first losses are stage 1's final heads' losses, not a fresh start's
    fresh = run_training(medusa2_config, "joint.base_loss=distill_kl", "train.max_steps=2",
                         "train.output_dir=" + str(tmp_path / "fresh"))
    assert fresh.returncode == 0
    assert scalars(tmp_path / "stage2", "train/loss_head1")[0] < scalars(tmp_path / "fresh", "train/loss_head1")[0]


@pytest.mark.parametrize("override, message", [
    ("mode=medusa3", "mode must be one of"),
    ("lora.dropout=1.5", "lora.dropout must be in [0, 1)"),
    ("lora.target_modules=[qkv_proj]", "no modules named ['qkv_proj']"),
    ("joint.heads_lr_multiplier=0", "joint.heads_lr_multiplier must be > 0"),
])
def test_medusa2_config_errors_name_the_field(medusa2_config, override, message):
    result = run_training(medusa2_config, override, check=False)
    assert result.returncode != 0 and message in result.stderr + result.stdout


# ---- the two saved forms, decoded losslessly -------------------------------------------------

@pytest.fixture()
def medusa2_run(medusa2_config, tmp_path):
    run_training(medusa2_config)
    return tmp_path / "run" / "heads"


def hf_greedy(model, prompt_ids, new_tokens, eos):
    out = model.generate(prompt_ids, max_new_tokens=new_tokens, do_sample=False, eos_token_id=eos,
                         attention_mask=torch.ones_like(prompt_ids))
    return out[0, prompt_ids.shape[1]:].tolist()


def test_adapter_form_and_merged_form_decode_like_the_adapted_model(medusa2_run, tmp_path, tiny_llama_dir):
    from specheads.data.models import load_base_model
    from specheads.heads import MedusaHeads
    from specheads.heads.export import export
    from specheads.heads.joint import load_adapted_base
    from specheads.inference.decoder import TreeDecoder
    from specheads.inference.generate import SpeculativeGenerator

    tree = [[0], [1], [0, 0], [0, 1], [0, 0, 0]]
    adapted = load_adapted_base(load_base_model(str(tiny_llama_dir), "fp32"), medusa2_run)
    prompt = torch.tensor([[1, 50, 300, 2000, 17, 99]])

    # adapter + heads (the training output as it is): the generator folds the adapter in
    generator = SpeculativeGenerator.from_pretrained(str(tiny_llama_dir), heads=str(medusa2_run), dtype="fp32", tree=tree)
    expected = hf_greedy(adapted, prompt, 24, generator.eos)
    got = [t for chunk in generator.stream_ids(prompt, 24) for t in chunk]
    assert got == expected
    for name, parameter in generator.model.named_parameters():
        torch.testing.assert_close(parameter, dict(adapted.named_parameters())[name])

    # merged: a full model folder plus plain heads
    out = export("merged", medusa2_run, tmp_path / "merged", model=str(tiny_llama_dir), dtype="fp32")
    merged = load_base_model(str(out / "model"), "fp32")
    with torch.no_grad():
        torch.testing.assert_close(merged(prompt).logits, adapted(prompt).logits)
    heads = MedusaHeads.from_pretrained(out / "heads", base_model=merged)
    decoder = TreeDecoder(merged, heads, tree)
    assert decoder.generate_ids(prompt, 24, eos_token_ids=generator.eos) == expected
    assert "adapter" not in json.loads((out / "heads" / "config.json").read_text())
    # the export refuses plain heads and a non-empty folder, writing nothing
    with pytest.raises(FileExistsError):
        export("merged", medusa2_run, out, model=str(tiny_llama_dir))
    with pytest.raises(ValueError, match="plain heads"):
        export("merged", out / "heads", tmp_path / "again", model=str(tiny_llama_dir))
    assert not (tmp_path / "again").exists()


def test_missing_adapter_is_a_clear_error(medusa2_run, tiny_llama_dir):
    from specheads.data.models import load_base_model
    from specheads.heads.joint import load_adapted_base

    shutil.rmtree(medusa2_run / "adapter")
    with pytest.raises(ValueError, match="adapter_config.json is missing"):
        load_adapted_base(load_base_model(str(tiny_llama_dir), "fp32"), medusa2_run)


def test_bench_compares_heads_sets_each_against_its_own_model(medusa2_run, tmp_path, tiny_llama_dir):
    from specheads.inference import bench

    questions = tmp_path / "q.jsonl"
    write_jsonl(questions, [{"question_id": f"q{i}", "category": "qa", "turns": [f"Count the words from {w}."]}
                            for i, w in enumerate(["alpha", "gamma"])])
    results = bench.main(["--model", str(tiny_llama_dir), "--heads", f"joint={medusa2_run}", "--methods", "baseline,medusa",
                          "--tree", "[[0],[1],[0,0]]", "--questions", str(questions), "--max-new-tokens", "12",
                          "--dtype", "fp32", "--out", str(tmp_path / "bench")])
    methods = results["methods"]
    assert set(methods) == {"baseline", "medusa:joint", "baseline:joint"}
    assert methods["medusa:joint"]["overall"]["greedy_match"] == 1.0  # against HF greedy of the adapted model

"""Devices: --device / --dtype on every command line that loads a base, `auto` takes a GPU when there is one, and
nothing in the package pins a model or tensor to the CPU outside the places listed here with their reason."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from specheads.data.models import DeviceError, resolve_device

REPO = Path(__file__).resolve().parent.parent
PACKAGE = ("heads", "data", "train", "inference")

# Every place the package names the CPU, with why it may: files on disk are read and written from host memory,
# host-side bookkeeping reads small results back, CPU-only tuning is gated on the model being on the CPU, and
# constructor defaults that every caller in the package overrides with the model's device (inference/methods.py).
ALLOWED = {
    ("heads/module.py", "DraftModule.save_pretrained"): "weights to a file (every draft model's)",
    ("heads/module.py", "DraftModule.from_pretrained"): "map_location default of a file read; decoding moves drafts",
    ("heads/weights.py", "read_safetensors"): "a file read into host memory",
    ("heads/weights.py", "read_pickle_weights_only"): "a file read into host memory",
    ("heads/weights.py", "read_folder_safetensors"): "a file read into host memory",
    ("heads/weights.py", "read_folder_weights"): "a file read into host memory",
    ("heads/export.py", "export_specheads"): "export is file work: a 7B fp32 base may not fit a GPU",
    ("heads/formats/common.py", "base_lm_head_weight"): "export is file work: a 7B fp32 base may not fit a GPU",
    ("heads/formats/common.py", "own_copies"): "tensors to a file",
    ("heads/formats/eagle_layer.py", "EagleLayout.to_tensors"): "tensors to a file",
    ("heads/formats/vllm_dflash.py", "to_tensors"): "tensors to a file",
    ("heads/fingerprint.py", "base_fingerprint"): "a hash of weight bytes",
    ("data/models.py", "pick_dtype"): "a default for the dtype choice only",
    ("data/models.py", "resolve_device"): "auto's last choice, and the name check",
    ("train/checkpoint.py", "_optimizer_to_files"): "optimizer state to a file",
    ("train/features.py", "FeatureSource.__call__"): "cached base states to a file",
    ("train/trainer.py", "Trainer.step"): "loss parts for the log line",
    ("train/distributed.py", "accelerator_settings"): "accelerate's cpu flag where no GPU backend runs",
    ("train/distributed.py", "rank_rng_states"): "RNG states gathered to a file (the CPU generator state is a host tensor)",
    ("inference/cpu_verify.py", "packing_kind"): "CPU-only tuning, gated",
    ("inference/cpu_verify.py", "prepare_cpu_verify"): "CPU-only tuning, gated",
    ("inference/eagle.py", "EagleCandidates.propose"): "tree scores to Python (host bookkeeping)",
    ("inference/eagle.py", "SampledEagleCandidates._children"): "Gumbel draws in fp64 on the host",
    ("inference/speculative.py", "DraftModelCandidates.observe"): "draft tokens compared on the host",
    ("inference/batched.py", "left_pad"): "a default; callers pass the model's device",
    ("inference/candidates.py", "NoCandidates.__init__"): "a default; callers pass the model's device",
    ("inference/candidates.py", "MedusaCandidates.__init__"): "a default; for_model passes the model's device",
    ("inference/candidates.py", "PromptLookupCandidates.__init__"): "a default; callers pass the model's device",
    ("inference/candidates.py", "lookup_with_heads"): "a default; callers pass the model's device",
    ("inference/lookahead.py", "LookaheadCandidates.__init__"): "a default; callers pass the model's device",
    ("inference/speculative.py", "DraftModelCandidates.__init__"): "a default; callers pass the model's device",
}


def cpu_pins(root: Path) -> set[tuple[str, str]]:
    """(file, enclosing function) of every "cpu" string and every `.cpu()` call in the package."""
    found = set()
    for top in PACKAGE:
        for path in sorted((root / top).rglob("*.py")):
            rel, scope = str(path.relative_to(root)), []

            class Visitor(ast.NodeVisitor):
                def visit_FunctionDef(self, node):
                    scope.append(node.name)
                    self.generic_visit(node)
                    scope.pop()

                visit_AsyncFunctionDef = visit_ClassDef = visit_FunctionDef

                def visit_Constant(self, node):
                    if isinstance(node.value, str) and node.value.split(":")[0] == "cpu":
                        found.add((rel, ".".join(scope) or "<module>"))

                def visit_Call(self, node):
                    if isinstance(node.func, ast.Attribute) and node.func.attr == "cpu" and not node.args:
                        found.add((rel, ".".join(scope) or "<module>"))
                    self.generic_visit(node)

            Visitor().visit(ast.parse(path.read_text()))
    return found


def test_nothing_is_pinned_to_the_cpu_outside_the_listed_places():
    found = cpu_pins(REPO)
    assert sorted(found - ALLOWED.keys()) == [], "a new CPU pin: use the model's device, or list it with its reason"
    assert sorted(ALLOWED.keys() - found) == [], "a listed place no longer names the CPU: remove it from ALLOWED"


def test_the_scan_finds_a_pin(tmp_path):
    (tmp_path / "inference").mkdir()
    (tmp_path / "inference" / "x.py").write_text("def f(m):\n    return m.to('cpu'), m.cpu()\n")
    for top in PACKAGE[:-1]:
        (tmp_path / top).mkdir()
    assert cpu_pins(tmp_path) == {("inference/x.py", "f")}


def test_auto_takes_the_gpu_when_there_is_one(monkeypatch):
    assert resolve_device("auto") == torch.device("cuda" if torch.cuda.is_available() else "cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == torch.device("cuda")


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA GPU is here")
@pytest.mark.parametrize("name, message", [
    ("cuda", "no CUDA GPU is visible"), ("cuda:1", "no CUDA GPU is visible"), ("tpu", "unknown device 'tpu'"),
    ("gpu", "unknown device 'gpu'")])
def test_a_device_this_machine_lacks_is_named(name, message):
    with pytest.raises(DeviceError, match=message):
        resolve_device(name)


def test_generator_loads_on_the_device_asked(tiny_llama_dir):
    from specheads.inference.generate import SpeculativeGenerator

    gen = SpeculativeGenerator.from_pretrained(str(tiny_llama_dir), dtype="fp32", device="cpu")
    assert gen.model.device.type == "cpu" and gen.model.dtype == torch.float32


@pytest.mark.parametrize("script", ["inference/chat.py", "scripts/bench.py", "scripts/build_tree.py",
                                    "scripts/tune_eagle_tree.py", "scripts/self_distill.py"])
def test_every_decoding_command_takes_device_and_dtype(script):
    out = subprocess.run([sys.executable, script, "--help"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    for flag in ("--device", "--dtype", "--device-map", "--chat-template"):
        assert flag in out.stdout, f"{script} has no {flag}"


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA GPU is here")
def test_chat_on_a_missing_gpu_is_one_line(tiny_llama_dir):
    out = subprocess.run([sys.executable, "inference/chat.py", "--model", str(tiny_llama_dir), "--no-heads",
                          "--device", "cuda", "--prompt", "hi"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "Traceback" not in out.stderr, out.stderr
    assert "device 'cuda': no CUDA GPU is visible" in out.stderr

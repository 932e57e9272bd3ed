"""Interop: vLLM Medusa export and its reverse, FasterDecoding/Medusa v0.1 import, safe weight loading,
and Hub upload (dry run, and failure without a reachable Hub leaving local files intact)."""

import argparse
import hashlib
import importlib.util
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from specheads.heads import MedusaConfig, MedusaHeads
from specheads.heads.export import export
from specheads.heads.formats import faster_decoding, vllm_medusa
from specheads.heads.loading import load_heads, load_medusa_heads
from specheads.heads.hub import HubUploadError, push_to_hub
from specheads.heads.model_card import render_model_card
from specheads.heads.weights import UnsafeWeightsError

REPO = Path(__file__).resolve().parents[1]
H, V, K, L = 32, 100, 3, 2


def load_script(name):
    spec = importlib.util.spec_from_file_location(f"{name}_script", REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def random_heads(own: bool, base: str = "tiny-base", num_layers: int = L) -> MedusaHeads:
    torch.manual_seed(0)
    heads = MedusaHeads(MedusaConfig(num_heads=K, num_layers=num_layers, hidden_size=H, vocab_size=V,
                                     own_lm_head=own, base_model_name_or_path=base))
    with torch.no_grad():
        for p in heads.parameters():
            p.normal_(0, 0.2)
    return heads


@pytest.fixture
def base_lm_head():
    torch.manual_seed(1)
    return nn.Linear(H, V, bias=False)


def file_hashes(directory: Path) -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


def reference_logits(h, blocks, lm_heads):
    """Medusa by hand: per head, x + SiLU(W x + b) per layer, then the head's projection."""
    out = []
    for (layers, lm_head) in zip(blocks, lm_heads):
        x = h
        for weight, bias in layers:
            x = x + torch.nn.functional.silu(x @ weight.T + bias)
        out.append(x @ lm_head.T)
    return torch.stack(out)


# ---- vLLM Medusa ------------------------------------------------------------------------------

@pytest.mark.parametrize("own", [False, True])
def test_vllm_medusa_export_names_shapes_config_and_round_trip(tmp_path, own, base_lm_head):
    heads = random_heads(own)
    heads.save_pretrained(tmp_path / "heads", extra={"tree": [[0]]})
    out = vllm_medusa.export(tmp_path / "heads", tmp_path / "vllm", lm_head_weight=base_lm_head.weight)

    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    assert json.loads((out / "config.json").read_text()) == {
        "model_type": "medusa", "architectures": ["MedusaModel"], "hidden_size": H, "vocab_size": V,
        "num_heads": K, "num_hidden_layers": L, "truncated_vocab_size": V, "medusa_fc_bias": True,
        "original_lm_head": not own, "base_model_name_or_path": "tiny-base"}
    tensors = load_file(out / "model.safetensors")
    expected = {f"blocks.{i}.layers.{j}.{kind}": (H, H) if kind == "weight" else (H,)
                for i in range(K) for j in range(L) for kind in ("weight", "bias")}
    expected.update({f"lm_heads.{i}.weight": (V, H) for i in (range(K) if own else [0])})
    assert {name: tuple(t.shape) for name, t in tensors.items()} == expected
    torch.testing.assert_close(tensors["blocks.2.layers.1.weight"], heads.blocks[2][1].linear.weight)
    torch.testing.assert_close(tensors["lm_heads.0.weight"],
                               heads.lm_heads[0].weight if own else base_lm_head.weight)

    back = load_medusa_heads(out)  # recognised as a vLLM Medusa folder
    assert back.config.own_lm_head is own and back.extra_config == {"imported_from": "vllm-medusa"}
    h = torch.randn(2, 5, H)
    with torch.no_grad():
        torch.testing.assert_close(back(h, base_lm_head), heads(h, base_lm_head), rtol=0, atol=0)


@pytest.mark.parametrize("own", [False, True])
def test_vllm_medusa_export_of_a_draft_vocabulary(tmp_path, own, base_lm_head):
    """vLLM refuses a folder carrying token_map (it never reports it loaded): shared-lm_head heads go out at the
    full vocabulary with a warning, heads with own lm_heads over a draft vocabulary are refused."""
    torch.manual_seed(0)
    heads = MedusaHeads(MedusaConfig(num_heads=K, num_layers=1, hidden_size=H, vocab_size=V, own_lm_head=own,
                                     draft_vocab_size=20))
    with torch.no_grad():
        for p in heads.parameters():
            p.normal_(0, 0.2)
    heads.set_draft_vocabulary(torch.randperm(V)[:20])
    heads.save_pretrained(tmp_path / "heads")
    if own:
        with pytest.raises(ValueError, match="own lm_heads over a draft vocabulary of 20 tokens.*token_map"):
            vllm_medusa.export(tmp_path / "heads", tmp_path / "vllm", lm_head_weight=base_lm_head.weight)
        assert not (tmp_path / "vllm").exists()
        with pytest.raises(ValueError, match="FasterDecoding's Medusa \\(and TGI\\) cannot load a draft vocabulary"):
            export("faster-decoding", tmp_path / "heads", tmp_path / "fd")
        return
    with pytest.warns(UserWarning, match="ranks all 100 tokens, not the heads' 20"):
        out = vllm_medusa.export(tmp_path / "heads", tmp_path / "vllm", lm_head_weight=base_lm_head.weight)
    assert json.loads((out / "config.json").read_text())["truncated_vocab_size"] == V
    tensors = load_file(out / "model.safetensors")
    assert "token_map" not in tensors and tuple(tensors["lm_heads.0.weight"].shape) == (V, H)
    torch.testing.assert_close(tensors["lm_heads.0.weight"], base_lm_head.weight)
    back = load_medusa_heads(out)
    assert back.config.draft_vocab_size == 0
    h = torch.randn(2, H)
    with torch.no_grad():  # the same blocks, ranked over the whole vocabulary
        torch.testing.assert_close(back(h, base_lm_head), base_lm_head(torch.stack([b(h) for b in heads.blocks])),
                                   rtol=0, atol=0)


@pytest.mark.parametrize("own", [False, True])
def test_faster_decoding_export_is_what_tgi_and_fasterdecoding_read(tmp_path, own, base_lm_head):
    """--format faster-decoding: config.json (medusa_num_heads/layers) + medusa_lm_head.safetensors with
    `{head}.{layer}.linear.*` and each head's own `{head}.{L}.weight` (the base lm_head per head when shared),
    names and shapes written out by hand from REFERENCE §6; read back, the heads compute the same logits."""
    heads = random_heads(own, base="smollm2-135m-instruct")
    heads.save_pretrained(tmp_path / "heads")
    out = faster_decoding.export(tmp_path / "heads", tmp_path / "fd", lm_head_weight=base_lm_head.weight)
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "medusa_lm_head.safetensors"]
    assert json.loads((out / "config.json").read_text()) == {
        "medusa_num_heads": K, "medusa_num_layers": L, "base_model_name_or_path": "HuggingFaceTB/SmolLM2-135M-Instruct",
        "hidden_size": H, "vocab_size": V}
    tensors = load_file(out / "medusa_lm_head.safetensors")
    expected = {f"{i}.{j}.linear.{kind}": (H, H) if kind == "weight" else (H,)
                for i in range(K) for j in range(L) for kind in ("weight", "bias")}
    expected.update({f"{i}.{L}.weight": (V, H) for i in range(K)})
    assert {name: tuple(t.shape) for name, t in tensors.items()} == expected
    back = load_medusa_heads(out)
    assert back.config.own_lm_head and back.extra_config == {"imported_from": "faster-decoding"}
    h = torch.randn(2, 5, H)
    exact = {"rtol": 0, "atol": 0} if own else {}  # shared: one matmul for all heads vs one per head
    with torch.no_grad():
        torch.testing.assert_close(back(h), heads(h, base_lm_head), **exact)


def test_vllm_medusa_export_takes_lm_head_from_the_base_model(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(2)
    base = LlamaForCausalLM(LlamaConfig(vocab_size=V, hidden_size=H, intermediate_size=64, num_hidden_layers=1,
                                        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False))
    base.save_pretrained(tmp_path / "base")
    random_heads(own=False, base=str(tmp_path / "base")).save_pretrained(tmp_path / "heads")
    load_script("export").main(["--format", "vllm-medusa", "--heads", str(tmp_path / "heads"),
                                "--out", str(tmp_path / "vllm")])
    tensors = load_file(tmp_path / "vllm" / "model.safetensors")
    torch.testing.assert_close(tensors["lm_heads.0.weight"], base.lm_head.weight)


def test_export_refusals(tmp_path, base_lm_head):
    export = load_script("export").main
    random_heads(own=False, base="").save_pretrained(tmp_path / "heads")
    with pytest.raises(SystemExit, match="share the base lm_head.*--model"):
        export(["--format", "vllm-medusa", "--heads", str(tmp_path / "heads"), "--out", str(tmp_path / "o")])
    with pytest.raises(ValueError, match="heads folder itself"):
        vllm_medusa.export(tmp_path / "heads", tmp_path / "heads", lm_head_weight=base_lm_head.weight)
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="busy is not empty"):
        vllm_medusa.export(tmp_path / "heads", tmp_path / "busy", lm_head_weight=base_lm_head.weight)
    with pytest.raises(ValueError, match=r"shape \(100, 16\).*\(100, 32\)"):
        vllm_medusa.export(tmp_path / "heads", tmp_path / "o", lm_head_weight=torch.zeros(V, 16))
    for fmt in ("vllm-eagle", "sglang-eagle", "vllm-eagle3", "sglang-eagle3"):
        with pytest.raises(SystemExit, match="EAGLE heads"):
            export(["--format", fmt, "--heads", str(tmp_path / "heads"), "--out", str(tmp_path / "o")])


def test_vllm_medusa_import_without_bias_and_refusals(tmp_path):
    heads = random_heads(own=True, num_layers=1)
    folder = tmp_path / "vllm"
    folder.mkdir()
    config = {"model_type": "medusa", "architectures": ["MedusaModel"], "hidden_size": H, "vocab_size": V,
              "num_heads": K, "num_hidden_layers": 1, "truncated_vocab_size": V, "medusa_fc_bias": False,
              "original_lm_head": False}
    (folder / "config.json").write_text(json.dumps(config))
    tensors = {f"blocks.{i}.layers.0.weight": heads.blocks[i][0].linear.weight.detach() for i in range(K)}
    tensors.update({f"lm_heads.{i}.weight": heads.lm_heads[i].weight.detach() for i in range(K)})
    save_file(tensors, folder / "model.safetensors")
    back = load_medusa_heads(folder)
    assert all(not block[0].linear.bias.any() for block in back.blocks)
    torch.testing.assert_close(back.blocks[1][0].linear.weight, heads.blocks[1][0].linear.weight)

    save_file({**tensors, "blocks.0.layers.7.weight": torch.zeros(H, H)}, folder / "model.safetensors")
    with pytest.raises(ValueError, match=r"model.safetensors: unexpected tensors blocks.0.layers.7.weight"):
        load_medusa_heads(folder)
    save_file(tensors, folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps({**config, "truncated_vocab_size": 50}))
    with pytest.raises(ValueError, match="model.safetensors: truncated_vocab_size 50 < vocab_size needs a token_map"):
        load_medusa_heads(folder)
    (folder / "config.json").write_text(json.dumps({**config, "truncated_vocab_size": V + 1}))
    with pytest.raises(ValueError, match="config.json: MedusaConfig.draft_vocab_size .* exceeds vocab_size"):
        load_medusa_heads(folder)


# ---- FasterDecoding/Medusa v0.1 ---------------------------------------------------------------

def write_faster_decoding(folder: Path, own: bool, suffix: str, vocab_in_config: bool = False,
                          base: str = "lmsys/vicuna-7b-v1.3"):
    """A v0.1 checkpoint: state dict of ModuleList[Sequential(ResBlock * L, Linear)] (the lm_head optional)."""
    torch.manual_seed(3)
    blocks = [[(torch.randn(H, H) * 0.2, torch.randn(H) * 0.2) for _ in range(L)] for _ in range(K)]
    lm_heads = [torch.randn(V, H) for _ in range(K)]
    state = {}
    for i in range(K):
        for j, (weight, bias) in enumerate(blocks[i]):
            state[f"{i}.{j}.linear.weight"], state[f"{i}.{j}.linear.bias"] = weight, bias
        if own:
            state[f"{i}.{L}.weight"] = lm_heads[i]
    folder.mkdir(parents=True, exist_ok=True)
    config = {"medusa_num_heads": K, "medusa_num_layers": L, "base_model_name_or_path": base,
              "transformers_version": "4.31.0"}
    if vocab_in_config:
        config["vocab_size"] = V
    (folder / "config.json").write_text(json.dumps(config))
    if suffix == "pt":
        torch.save(state, folder / "medusa_lm_head.pt")
    else:
        save_file(state, folder / "medusa_lm_head.safetensors")
    return blocks, lm_heads


@pytest.mark.parametrize("suffix", ["pt", "safetensors"])
@pytest.mark.parametrize("own", [True, False])
def test_faster_decoding_import_matches_hand_computed_heads(tmp_path, suffix, own, base_lm_head):
    blocks, lm_heads = write_faster_decoding(tmp_path / "fd", own, suffix)

    class Base:
        config = type("C", (), {"hidden_size": H, "vocab_size": V})()

    heads = load_medusa_heads(tmp_path / "fd", base_model=None if own else Base())
    assert (heads.config.num_heads, heads.config.num_layers, heads.config.hidden_size, heads.config.vocab_size,
            heads.config.own_lm_head) == (K, L, H, V, own)
    assert heads.config.base_model_name_or_path == "lmsys/vicuna-7b-v1.3"
    h = torch.randn(4, H)
    expected = reference_logits(h, blocks, lm_heads if own else [base_lm_head.weight.detach()] * K)
    with torch.no_grad():
        torch.testing.assert_close(heads(h, base_lm_head), expected)


def test_faster_decoding_shared_layout_takes_vocab_from_config_or_base_config(tmp_path):
    from transformers import LlamaConfig

    write_faster_decoding(tmp_path / "a", own=False, suffix="safetensors", vocab_in_config=True)
    assert load_medusa_heads(tmp_path / "a").config.vocab_size == V
    LlamaConfig(vocab_size=V, hidden_size=H).save_pretrained(tmp_path / "base")
    write_faster_decoding(tmp_path / "b", own=False, suffix="safetensors", base=str(tmp_path / "base"))
    assert load_medusa_heads(tmp_path / "b").config.vocab_size == V
    write_faster_decoding(tmp_path / "c", own=False, suffix="safetensors", base=str(tmp_path / "no-base"))
    with pytest.raises(ValueError, match="config.json: these heads share the base lm_head.*no-base"):
        load_medusa_heads(tmp_path / "c")  # no base config to read: say what is needed


def test_faster_decoding_config_that_disagrees_with_its_tensors_loads_the_tensors(tmp_path, base_lm_head):
    """medusa-vicuna-7b-v1.3's config says 2 heads and its file holds 5: upstream builds what the file holds."""
    blocks, lm_heads = write_faster_decoding(tmp_path / "fd", own=True, suffix="safetensors")
    config = json.loads((tmp_path / "fd" / "config.json").read_text())
    (tmp_path / "fd" / "config.json").write_text(json.dumps({**config, "medusa_num_heads": 2}))
    with pytest.warns(UserWarning, match=f"config.json: medusa_num_heads is 2, but medusa_lm_head.safetensors "
                                         f"holds {K}; using the tensors"):
        heads = load_medusa_heads(tmp_path / "fd")
    assert heads.config.num_heads == K
    h = torch.randn(4, H)
    with torch.no_grad():
        torch.testing.assert_close(heads(h, base_lm_head), reference_logits(h, blocks, lm_heads))


def test_faster_decoding_bad_tensor_names_and_shapes_are_named(tmp_path):
    folder = tmp_path / "fd"
    write_faster_decoding(folder, own=True, suffix="safetensors")
    state = load_file(folder / "medusa_lm_head.safetensors")
    save_file({**state, "5.0.linear.weight": torch.zeros(H, H)}, folder / "medusa_lm_head.safetensors")
    with pytest.warns(UserWarning, match="medusa_num_heads is 3, but medusa_lm_head.safetensors holds 6"), \
            pytest.raises(ValueError, match="medusa_lm_head.safetensors: missing tensors for blocks.3.0.linear.bias"):
        load_medusa_heads(folder)  # the tensors are trusted: head 5 without head 4 is incomplete
    save_file({**state, "0.9.linear.x": torch.zeros(H, H)}, folder / "medusa_lm_head.safetensors")
    with pytest.raises(ValueError, match="medusa_lm_head.safetensors: unexpected tensor '0.9.linear.x'"):
        load_medusa_heads(folder)
    save_file({**state, "1.0.linear.bias": torch.zeros(7)}, folder / "medusa_lm_head.safetensors")
    with pytest.raises(ValueError, match=r"tensor '1.0.linear.bias' has shape \(7,\), expected \(32,\)"):
        load_medusa_heads(folder)
    del state["2.2.weight"]
    save_file(state, folder / "medusa_lm_head.safetensors")
    with pytest.raises(ValueError, match="missing tensors for lm_heads.2.weight"):
        load_medusa_heads(folder)


# ---- no pickles but the one weights-only path; damaged files are named --------------------------

class Payload:
    """Unpickling this would run code (touch a file)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_pickles_are_refused_or_read_weights_only(tmp_path, monkeypatch):
    heads = random_heads(own=False)
    heads.save_pretrained(tmp_path / "heads")
    (tmp_path / "heads" / "model.safetensors").unlink()
    torch.save(heads.state_dict(), tmp_path / "heads" / "pytorch_model.bin")

    def no_unpickling(*args, **kwargs):
        raise AssertionError("torch.load must not be called")

    monkeypatch.setattr(torch, "load", no_unpickling)
    with pytest.raises(UnsafeWeightsError, match="model.safetensors is missing.*will not unpickle pytorch_model.bin"):
        load_medusa_heads(tmp_path / "heads")
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "config.json").write_text(json.dumps({"model_type": "medusa", "num_heads": K,
        "num_hidden_layers": 1, "hidden_size": H, "vocab_size": V}))
    (tmp_path / "vllm" / "weights.pt").write_bytes(b"any pickle")
    with pytest.raises(UnsafeWeightsError, match="will not unpickle weights.pt"):
        load_medusa_heads(tmp_path / "vllm")
    fd = tmp_path / "fd"
    write_faster_decoding(fd, own=True, suffix="safetensors")
    (fd / "medusa_lm_head.safetensors").rename(fd / "medusa_lm_head.bin")
    with pytest.raises(UnsafeWeightsError, match="will not unpickle medusa_lm_head.bin"):
        load_medusa_heads(fd)
    monkeypatch.undo()

    marker = tmp_path / "code-ran"
    torch.save({"0.0.linear.weight": Payload(marker)}, fd / "medusa_lm_head.pt")
    with pytest.raises(ValueError, match=r"refusing .*medusa_lm_head.pt: torch.load\(weights_only=True\) rejected"):
        load_medusa_heads(fd)
    assert not marker.exists()
    torch.save({"0.0.linear.weight": torch.zeros(H, H), "step": 3}, fd / "medusa_lm_head.pt")
    with pytest.raises(ValueError, match="medusa_lm_head.pt: expected a flat dict of tensors; not tensors: step"):
        load_medusa_heads(fd)
    torch.save(argparse.Namespace(), fd / "medusa_lm_head.pt")
    with pytest.raises(ValueError, match="medusa_lm_head.pt"):
        load_medusa_heads(fd)


@pytest.mark.parametrize("damage", ["truncate", "flip-length", "flip-header"])
def test_damaged_safetensors_name_the_file(tmp_path, damage):
    random_heads(own=True).save_pretrained(tmp_path)
    path = tmp_path / "model.safetensors"
    data = bytearray(path.read_bytes())
    if damage == "truncate":
        data = data[: len(data) // 2]
    else:
        span = range(0, 8) if damage == "flip-length" else range(10, 30)
        for i in span:
            data[i] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"cannot read .*model.safetensors: not a valid safetensors file"):
        load_medusa_heads(tmp_path)


# ---- Hub --------------------------------------------------------------------------------------

@pytest.fixture
def run_dir(tmp_path):
    """A finished run: heads with accuracy and tree, train_config.json, bench/results.json."""
    run = tmp_path / "run"
    accuracy = {"top1": [0.5, 0.25, 0.125], "top5": [0.75, 0.5, 0.3], "tokens": [1000.0] * 3, "estimated_tau": 1.67}
    random_heads(own=False, base="smollm2-135m-instruct").save_pretrained(
        run / "heads", extra={"heldout_accuracy": accuracy, "tree": [[0], [1], [0, 0]]})
    (run / "train_config.json").write_text(json.dumps({
        "model": {"name": "smollm2-135m-instruct"}, "heads": {"num_heads": K},
        "data": {"dataset": "sharegpt", "max_length": 320, "heldout_size": 100, "split_seed": 0,
                 "max_train_conversations": 640},
        "train": {"lr": 0.01, "epochs": 1.0}}))
    (run / "bench").mkdir()
    overall = {"tau": 1.5, "tokens_per_s": 30.0, "speedup": 1.2, "greedy_match": 1.0}
    (run / "bench" / "results.json").write_text(json.dumps({
        "heads": str(run / "heads"), "model": "smollm2-135m-instruct", "questions": 4, "machine": "test",
        "methods": {"baseline": {"overall": {"tau": 1.0, "tokens_per_s": 25.0, "speedup": 1.0}},
                    "medusa": {"overall": overall}}}))
    return run


def test_dry_run_writes_exactly_the_upload(tmp_path, run_dir):
    before = file_hashes(run_dir / "heads")
    out = load_script("push_to_hub").main(["--heads", str(run_dir / "heads"), "--repo-id", "me/tiny-medusa",
                                           "--dry-run", str(tmp_path / "upload")])
    assert out is None
    upload = tmp_path / "upload"
    # vLLM cannot serve these heads: no engine files at the root, specheads' folder in specheads/
    assert sorted(str(p.relative_to(upload)) for p in upload.rglob("*") if p.is_file()) == [
        "README.md", "specheads/config.json", "specheads/model.safetensors", "specheads/train_config.json"]
    assert (upload / "specheads" / "train_config.json").read_bytes() == (run_dir / "train_config.json").read_bytes()
    assert {k: v for k, v in file_hashes(upload / "specheads").items() if k in before} == before
    assert file_hashes(run_dir / "heads") == before
    card = (upload / "README.md").read_text()
    front = card.split("---\n")[1]
    assert "library_name: specheads" in front and "base_model: HuggingFaceTB/SmolLM2-135M-Instruct" in front
    assert "- medusa" in front and "- speculative-decoding" in front
    assert "license: apache-2.0" in front and "- anon8231489123/ShareGPT_Vicuna_unfiltered" in front
    # random 32-wide heads cannot take SmolLM2's lm_head: no vllm/ folder, and the card says why
    assert "vLLM cannot serve these heads as they are: base lm_head weight has shape (49152, 576)" in card
    assert "root holds no engine files; specheads loads them from `specheads/`" in card
    for text in ["| 2 | 0.250 | 0.500 |", "**1.67**", "[[0], [1], [0, 0]]", "| `train.lr` | `0.01` |",
                 "Dataset `sharegpt`", "| medusa | 1.50 | 30.0 | 1.20x | 1.00 |",
                 "inference/chat.py --model HuggingFaceTB/SmolLM2-135M-Instruct --heads me/tiny-medusa",
                 'heads="me/tiny-medusa"']:
        assert text in card, text
    with pytest.raises(FileExistsError, match="not empty"):
        push_to_hub(run_dir / "heads", "me/tiny-medusa", dry_run_dir=upload)


def test_model_card_without_run_files(tmp_path):
    random_heads(own=True, base=str(tmp_path)).save_pretrained(tmp_path / "heads")
    card = render_model_card(tmp_path / "heads")
    assert "base_model:" not in card  # a local folder is not a Hub id
    assert "configuration was not found" in card and "No benchmark results" in card and "No tree" in card


def test_model_card_skips_a_benchmark_of_other_heads(run_dir):
    results = json.loads((run_dir / "bench" / "results.json").read_text())
    (run_dir / "bench" / "results.json").write_text(json.dumps({**results, "heads": "runs/other/heads-v2"}))
    assert "No benchmark results" in render_model_card(run_dir / "heads")


@pytest.mark.parametrize("unreachable", ["offline", "endpoint"])
def test_unreachable_hub_is_a_clear_error_and_changes_nothing(tmp_path, run_dir, monkeypatch, unreachable):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    if unreachable == "offline":
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
        expected = r"me/tiny-medusa on .*HF_HUB_OFFLINE is set"
    else:
        monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
        expected = r"me/tiny-medusa on http://127.0.0.1:9: .*No local file changed"
    before = {p.relative_to(run_dir): hashlib.sha256(p.read_bytes()).hexdigest()
              for p in run_dir.rglob("*") if p.is_file()}
    with pytest.raises(HubUploadError, match=expected):
        push_to_hub(run_dir / "heads", "me/tiny-medusa", token="hf_not_a_real_token")
    with pytest.raises(SystemExit, match="push_to_hub.py: cannot push"):
        load_script("push_to_hub").main(["--heads", str(run_dir / "heads"), "--repo-id", "me/tiny-medusa",
                                         "--token", "hf_not_a_real_token"])
    heads = MedusaHeads.from_pretrained(run_dir / "heads")
    with pytest.raises(HubUploadError, match="me/tiny-medusa"):
        push_to_hub(heads, "me/tiny-medusa", token="hf_not_a_real_token")
    after = {p.relative_to(run_dir): hashlib.sha256(p.read_bytes()).hexdigest()
             for p in run_dir.rglob("*") if p.is_file()}
    assert after == before


def test_push_heads_in_memory_dry_run(tmp_path, run_dir):
    heads = MedusaHeads.from_pretrained(run_dir / "heads")
    push_to_hub(heads, "me/tiny-medusa", dry_run_dir=tmp_path / "upload",
                train_config=run_dir / "train_config.json", bench_results=run_dir / "bench" / "results.json")
    own = tmp_path / "upload" / "specheads"
    assert sorted(p.name for p in own.iterdir()) == ["config.json", "model.safetensors", "train_config.json"]
    assert json.loads((own / "config.json").read_text())["tree"] == [[0], [1], [0, 0]]
    assert "| medusa | 1.50 |" in (tmp_path / "upload" / "README.md").read_text()
    reloaded = load_heads(tmp_path / "upload")  # a pushed repo's local copy: its specheads/ is what loads
    torch.testing.assert_close(reloaded.state_dict(), heads.state_dict())


def test_eagle_draft_push_is_served_by_its_repo_id(tmp_path):
    """EAGLE drafts publish too: the vllm-eagle3 export the engine tests serve at the repo's root (what vLLM reads
    by id), our folder with train_config.json in specheads/, and a card whose `vllm serve` command is
    heads.serving's (the one the engine test starts) with the repo id as the draft model."""
    from transformers import LlamaConfig

    from specheads.heads import EagleConfig, EagleDraft
    from specheads.heads import load_heads

    base = LlamaConfig(vocab_size=V, hidden_size=H, intermediate_size=64, num_hidden_layers=8, num_attention_heads=4,
                       num_key_value_heads=2)
    torch.manual_seed(0)
    draft = EagleDraft(EagleConfig.for_base(base, "smollm2-135m-instruct", variant="eagle3", draft_vocab_size=40))
    draft.save_pretrained(tmp_path / "run" / "heads", extra={"eagle_tree": {"top_k": 4, "depth": 3,
                                                                            "total_tokens": 9}})
    (tmp_path / "run" / "train_config.json").write_text(json.dumps({"data": {"dataset": "sharegpt"}}))
    before = file_hashes(tmp_path / "run" / "heads")
    upload = Path(push_to_hub(tmp_path / "run" / "heads", "me/tiny-eagle3", dry_run_dir=tmp_path / "upload",
                              revision="v1"))
    assert sorted(str(p.relative_to(upload)) for p in upload.rglob("*") if p.is_file()) == [
        "README.md", "config.json", "model.safetensors", "specheads/config.json", "specheads/model.safetensors",
        "specheads/train_config.json"]
    assert file_hashes(tmp_path / "run" / "heads") == before
    assert json.loads((upload / "config.json").read_text())["speculators_model_type"] == "eagle3"
    (tmp_path / "engine").mkdir()  # the root's files, as vLLM fetches them by the repo's id
    for name in ("config.json", "model.safetensors"):
        shutil.copyfile(upload / name, tmp_path / "engine" / name)
    engine = load_heads(tmp_path / "engine")
    torch.testing.assert_close(engine.state_dict()["fc.weight"], draft.state_dict()["fc.weight"], rtol=0, atol=0)
    ours = load_heads(upload)
    assert ours.extra_config["eagle_tree"] == {"top_k": 4, "depth": 3, "total_tokens": 9}
    card = (upload / "README.md").read_text()
    for text in ["# EAGLE-3 draft for HuggingFaceTB/SmolLM2-135M-Instruct", "- eagle", "license: apache-2.0",
                 "vllm serve HuggingFaceTB/SmolLM2-135M-Instruct --dtype bfloat16 --enforce-eager --port 8000 "
                 """--speculative-config '{"method":"eagle3","model":"me/tiny-eagle3","num_speculative_tokens":5,"""
                 """"revision":"v1"}'""",
                 "--heads me/tiny-eagle3@v1", "top-k 4, depth 3, 9 nodes"]:
        assert text in card, text


def test_medusa_dry_run_with_a_draft_vocabulary_ships_vllm_folder_and_says_what_changed(tmp_path):
    """Heads with a draft vocabulary on a base that fits them: vllm/ is written (full vocabulary, the base's lm_head
    as lm_heads.0) and the card notes the dropped draft vocabulary."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(2)
    base = LlamaForCausalLM(LlamaConfig(vocab_size=V, hidden_size=H, intermediate_size=64, num_hidden_layers=1,
                                        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False))
    base.save_pretrained(tmp_path / "base")
    heads = MedusaHeads(MedusaConfig(num_heads=K, num_layers=1, hidden_size=H, vocab_size=V, draft_vocab_size=20,
                                     base_model_name_or_path=str(tmp_path / "base")))
    heads.save_pretrained(tmp_path / "heads")
    upload = Path(push_to_hub(tmp_path / "heads", "me/tiny", dry_run_dir=tmp_path / "upload"))
    tensors = load_file(upload / "model.safetensors")
    torch.testing.assert_close(tensors["lm_heads.0.weight"], base.lm_head.weight)
    card = (upload / "README.md").read_text()
    assert '"method":"medusa","model":"me/tiny","num_speculative_tokens":3' in card
    assert "Note: vLLM's Medusa (no token_map) cannot load a draft vocabulary: the export ranks all 100 tokens" in card


def test_dflash_drafter_pushes_and_is_served_by_its_repo_id(tmp_path, tiny_llama_dir):
    """DFlash drafters push like the others (they were refused, with a hint that pointed back at itself): vLLM's
    `dflash` export at the root, specheads' folder in specheads/, a card with the id-based `vllm serve` command."""
    from transformers import AutoConfig

    from specheads.heads import DFlashConfig, DFlashDraft

    torch.manual_seed(0)
    base_config = AutoConfig.from_pretrained(tiny_llama_dir)
    draft = DFlashDraft(DFlashConfig.for_base(base_config, str(tiny_llama_dir), block_size=4, target_layer_ids=[0]))
    draft.save_pretrained(tmp_path / "heads")
    upload = Path(push_to_hub(tmp_path / "heads", "me/tiny-dflash", dry_run_dir=tmp_path / "upload"))
    assert sorted(str(p.relative_to(upload)) for p in upload.rglob("*") if p.is_file()) == [
        "README.md", "config.json", "model.safetensors", "specheads/config.json", "specheads/model.safetensors"]
    assert json.loads((upload / "config.json").read_text())["architectures"] == ["DFlashDraftModel"]
    back = load_heads(upload)
    assert isinstance(back, DFlashDraft)
    torch.testing.assert_close(back.state_dict(), draft.state_dict(), rtol=0, atol=0)
    card = (upload / "README.md").read_text()
    for text in ["# DFlash drafter for", "- dflash", "block of 4 positions",
                 """'{"method":"dflash","model":"me/tiny-dflash","num_speculative_tokens":3}'"""]:
        assert text in card, text

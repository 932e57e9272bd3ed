"""EAGLE exports for vLLM / SGLang / speculators (scripts/export.py --format vllm-eagle | sglang-eagle |
vllm-eagle3 | sglang-eagle3): tensor names and shapes, config fields, and the reverse back to an EagleDraft
with identical outputs, on tiny random Llama and Qwen2 bases."""

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import LlamaConfig, Qwen2Config, Qwen3Config

from specheads.heads import load_heads
from specheads.heads.eagle import EagleConfig, EagleDraft
from specheads.heads.export import export
from specheads.heads.formats import FORMATS

REPO = Path(__file__).resolve().parents[1]
H, V, I, DV, LAYERS = 32, 100, 64, 40, 8
BASES = {"llama": LlamaConfig, "qwen2": Qwen2Config}
VARIANT = {"vllm-eagle": "eagle1", "sglang-eagle": "eagle1", "vllm-eagle3": "eagle3", "sglang-eagle3": "eagle3"}


def export_eagle(format, draft):
    """(config.json, tensors) of `draft` in an EAGLE `format` (heads.formats)."""
    return FORMATS[format].convert(draft)


def export_main(argv):
    spec = importlib.util.spec_from_file_location("export_script", REPO / "scripts" / "export.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main(argv)


def base_config(kind: str, config_class=None):
    config_class = config_class or BASES[kind]
    return config_class(vocab_size=V, hidden_size=H, intermediate_size=I, num_hidden_layers=LAYERS,
                        num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5,
                        max_position_embeddings=512, tie_word_embeddings=False)


def random_draft(kind: str, variant: str, name: str = "tiny", config_class=None, **settings) -> EagleDraft:
    """settings: for_base's layer / fc_bias (default: a new draft's, i.e. a Llama layer for EAGLE-3, no fc bias)."""
    torch.manual_seed(0)
    config = EagleConfig.for_base(base_config(kind, config_class), name, variant=variant,
                                  draft_vocab_size=DV if variant == "eagle3" else 0, **settings)
    draft = EagleDraft(config).double()
    with torch.no_grad():
        for parameter in draft.parameters():
            parameter.normal_(0, 0.3)
    if variant == "eagle3":
        draft.set_vocab_mapping(torch.randperm(V)[:DV])  # scattered ids: d2t far from zero
    return draft


def expected_tensors(kind: str, format: str) -> dict[str, tuple]:
    """The exported names and shapes, written out by hand from REFERENCE §6 (SGLang's EAGLE-3 layer is
    `midlayer`, the speculators library's `layers.0`)."""
    variant = VARIANT[format]
    if variant == "eagle1":
        prefix, wide = "layers.0.", H
        names = {"fc.weight": (H, 2 * H)}
    else:
        prefix, wide = "midlayer." if format == "sglang-eagle3" else "layers.0.", 2 * H
        names = {"fc.weight": (H, 3 * H), "norm.weight": (H,), "lm_head.weight": (DV, H), "d2t": (DV,),
                 "t2d": (V,), f"{prefix}input_layernorm.weight": (H,), f"{prefix}hidden_norm.weight": (H,)}
    names.update({f"{prefix}self_attn.q_proj.weight": (H, wide), f"{prefix}self_attn.k_proj.weight": (16, wide),
                  f"{prefix}self_attn.v_proj.weight": (16, wide), f"{prefix}self_attn.o_proj.weight": (H, H),
                  f"{prefix}mlp.gate_proj.weight": (I, H), f"{prefix}mlp.up_proj.weight": (I, H),
                  f"{prefix}mlp.down_proj.weight": (H, I), f"{prefix}post_attention_layernorm.weight": (H,)})
    if kind == "qwen2" and variant == "eagle1":  # EAGLE-3 drafts have a Llama layer whatever the base
        names.update({f"{prefix}self_attn.q_proj.bias": (H,), f"{prefix}self_attn.k_proj.bias": (16,),
                      f"{prefix}self_attn.v_proj.bias": (16,)})
    return names


def check_layer_fields(layer: dict, kind: str):
    assert layer["hidden_size"] == H and layer["vocab_size"] == V and layer["intermediate_size"] == I
    assert layer["num_hidden_layers"] == 1
    assert (layer["num_attention_heads"], layer["num_key_value_heads"], layer["head_dim"]) == (4, 2, 8)
    assert layer["rms_norm_eps"] == 1e-5 and layer["max_position_embeddings"] == 512
    assert layer["rope_theta"] == 10000.0 and layer["rope_parameters"]["rope_theta"] == 10000.0
    assert layer["torch_dtype"] == "float64" and layer["hidden_act"] == "silu"
    assert layer["attention_bias"] is False and layer["qkv_bias"] is (kind == "qwen2")


def same_outputs(draft: EagleDraft, back: EagleDraft):
    torch.manual_seed(5)
    dtype = draft.fc.weight.dtype
    features, embeddings = torch.randn(2, 7, H, dtype=dtype), torch.randn(2, 7, H, dtype=dtype)
    positions = torch.arange(3, 10).expand(2, 7)
    causal = torch.full((7, 7), float("-inf"), dtype=dtype).triu(1)[None, None].expand(2, 1, 7, 7)
    lm_head = torch.nn.Linear(H, V, bias=False).to(dtype)
    with torch.no_grad():
        for mask in (None, causal):
            ours, theirs = draft(features, embeddings, positions, mask), back(features, embeddings, positions, mask)
            torch.testing.assert_close(theirs, ours, rtol=0, atol=0)
        torch.testing.assert_close(back.logits(ours, lm_head), draft.logits(ours, lm_head), rtol=0, atol=0)
        fused = [torch.randn(2, 7, H, dtype=dtype) for _ in draft.config.feature_layers]
        torch.testing.assert_close(back.fuse(fused), draft.fuse(fused), rtol=0, atol=0)
    if draft.config.variant == "eagle3":
        assert torch.equal(back.d2t, draft.d2t) and back.d2t.dtype == torch.int64
        assert torch.equal(back.t2d, draft.t2d) and back.t2d.dtype == torch.bool
        ids = torch.arange(DV)
        assert torch.equal(back.draft_to_target(ids), draft.draft_to_target(ids))


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
@pytest.mark.parametrize("format", list(VARIANT))
def test_eagle_export_names_shapes_config_and_round_trip(tmp_path, kind, format):
    variant = VARIANT[format]
    draft = random_draft(kind, variant, name="smollm2-135m-instruct")
    draft.save_pretrained(tmp_path / "heads", extra={"heldout_accuracy": {"top1": [0.5]}})
    export_main(["--format", format, "--heads", str(tmp_path / "heads"), "--out", str(tmp_path / "out")])
    out = tmp_path / "out"

    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    tensors = load_file(out / "model.safetensors")
    assert {name: tuple(t.shape) for name, t in tensors.items()} == expected_tensors(kind, format)
    if variant == "eagle1":
        torch.testing.assert_close(tensors["fc.weight"], draft.fc.weight.detach(), rtol=0, atol=0)
        torch.testing.assert_close(tensors["layers.0.self_attn.q_proj.weight"],
                                   draft.layers[0].self_attn.q_proj.weight.detach(), rtol=0, atol=0)
    else:
        assert tensors["d2t"].dtype == torch.int64 and tensors["t2d"].dtype == torch.bool
        assert torch.equal(tensors["d2t"], draft.d2t) and torch.equal(tensors["t2d"], draft.t2d)
        assert int(tensors["t2d"].sum()) == DV and tensors["d2t"].abs().sum() > 0
        layer = "midlayer" if format == "sglang-eagle3" else "layers.0"
        torch.testing.assert_close(tensors[f"{layer}.hidden_norm.weight"], draft.hidden_norm.weight.detach(),
                                   rtol=0, atol=0)
        torch.testing.assert_close(tensors["lm_head.weight"], draft.lm_head.weight.detach(), rtol=0, atol=0)

    config = json.loads((out / "config.json").read_text())
    aux = draft.config.aux_layer_ids
    if format == "vllm-eagle3":
        assert config["speculators_model_type"] == "eagle3" and config["architectures"] == ["Eagle3Speculator"]
        assert config["draft_vocab_size"] == DV and config["eagle_aux_hidden_state_layer_ids"] == aux == [2, 4, 5]
        assert config["norm_before_residual"] is False
        spec = config["speculators_config"]
        assert spec["algorithm"] == "eagle3" and spec["default_proposal_method"] == "greedy"
        assert spec["proposal_methods"][0]["proposal_type"] == "greedy"
        assert spec["proposal_methods"][0]["speculative_tokens"] == 5
        assert spec["verifier"] == {"name_or_path": "HuggingFaceTB/SmolLM2-135M-Instruct",
                                    "architectures": [{"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}[kind]]}
        layer = config["transformer_layer_config"]
        assert layer["model_type"] == "llama"
        check_layer_fields(layer, "llama")
    else:
        assert config["model_type"] == "llama"
        assert config["architectures"] == {"vllm-eagle": ["LlamaForCausalLM"], "sglang-eagle": ["LlamaForCausalLMEagle"],
                                           "sglang-eagle3": ["LlamaForCausalLMEagle3"]}[format]
        check_layer_fields(config, kind if variant == "eagle1" else "llama")
        assert config["tie_word_embeddings"] is False
        if variant == "eagle1":
            assert "draft_vocab_size" not in config
            assert config.get("bias") is (False if format == "sglang-eagle" else None)  # vLLM: o_proj's, never set
        else:
            assert "bias" not in config and config["draft_vocab_size"] == DV
            # SGLang reads its id k as the stream entering layer k + 1: ids one less read the trained layers
            assert config["eagle_config"] == {"eagle_aux_hidden_state_layer_ids": [1, 3, 4]}

    back = load_heads(out)  # the format is recognised from config.json
    assert back.extra_config == {"imported_from": format}
    assert (back.config.variant, back.config.hidden_size, back.config.vocab_size, back.config.draft_vocab_size,
            back.config.aux_layer_ids, back.config.base_model_name_or_path) == (
        variant, H, V, DV if variant == "eagle3" else 0, aux, "smollm2-135m-instruct")
    assert back.config.layer_config["model_type"] == (kind if variant == "eagle1" else "llama")
    same_outputs(draft.eval(), back.eval())

    export("specheads", out, tmp_path / "own")  # and into specheads' own format
    same_outputs(draft.float(), EagleDraft.from_pretrained(tmp_path / "own"))  # specheads loads float32


@pytest.mark.parametrize("format", list(VARIANT))
def test_wrong_variant_names_variant_and_format(tmp_path, format):
    variant = VARIANT[format]
    other = "eagle3" if variant == "eagle1" else "eagle1"
    random_draft("llama", other).save_pretrained(tmp_path / "heads")
    with pytest.raises(SystemExit, match=f"format '{format}' needs an {variant} draft.*variant is '{other}'"):
        export_main(["--format", format, "--heads", str(tmp_path / "heads"), "--out", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


def test_eagle_export_refusals(tmp_path):
    draft = random_draft("llama", "eagle1")
    draft.save_pretrained(tmp_path / "heads")
    with pytest.raises(ValueError, match="heads folder itself"):
        export("vllm-eagle", tmp_path / "heads", tmp_path / "heads")
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="busy is not empty"):
        export("sglang-eagle", tmp_path / "heads", tmp_path / "busy")

    out = export("vllm-eagle", tmp_path / "heads", tmp_path / "out", model="me/base")
    assert json.loads((out / "config.json").read_text())["base_model_name_or_path"] == "me/base"
    tensors = load_file(out / "model.safetensors")
    from safetensors.torch import save_file

    save_file({**tensors, "layers.0.self_attn.o_proj.bias": torch.zeros(H)}, out / "model.safetensors")
    with pytest.raises(ValueError, match=r"unexpected tensors \['layers.0.self_attn.o_proj.bias'\]"):
        load_heads(out)
    save_file({**tensors, "fc.weight": torch.zeros(H, 3 * H)}, out / "model.safetensors")
    with pytest.raises(ValueError, match=r"tensor fc.weight has shape \(32, 96\), expected \(32, 64\)"):
        load_heads(out)

    # a layer a Llama-style EAGLE layer cannot hold (Qwen3's q_norm/k_norm) is refused, not dropped
    qwen3 = random_draft("qwen3", "eagle1", config_class=Qwen3Config)
    with pytest.raises(ValueError, match="model_type 'qwen3'.*q_norm.*Llama-style"):
        export_eagle("vllm-eagle", qwen3)


def test_fc_bias_goes_to_sglang_and_is_refused_for_vllm(tmp_path):
    """vLLM's EAGLE-1 fc has no bias and drops a shipped one silently: a non-zero fc.bias is refused by name,
    a zero one left out; SGLang's fc has one ("bias": true) and gets it."""
    draft = random_draft("llama", "eagle1", fc_bias=True)
    with pytest.raises(ValueError, match="tensor fc.bias is not zero.*vLLM's EAGLE-1 fc has no bias.*sglang-eagle"):
        export_eagle("vllm-eagle", draft)
    config, tensors = export_eagle("sglang-eagle", draft)
    assert config["bias"] is True and torch.equal(tensors["fc.bias"], draft.fc.bias.detach())
    draft.save_pretrained(tmp_path / "heads")
    export("sglang-eagle", tmp_path / "heads", tmp_path / "sglang")
    same_outputs(draft.eval(), load_heads(tmp_path / "sglang").eval())
    with torch.no_grad():
        draft.fc.bias.zero_()
    config, tensors = export_eagle("vllm-eagle", draft)
    assert "fc.bias" not in tensors and "bias" not in config


def test_vllm_eagle3_refuses_a_layer_vllm_cannot_build():
    """A Qwen2-style EAGLE-3 layer (q/k/v biases; drafts made before eagle.layer defaulted to llama) is refused
    for vLLM, which builds Llama-style EAGLE-3 layers only."""
    draft = random_draft("qwen2", "eagle3", layer="base")
    assert draft.layers[0].self_attn.q_proj.bias is not None
    with pytest.raises(ValueError, match="'qwen2'-style; vLLM's EAGLE-3 loads Llama-style layers.*eagle.layer: llama"):
        export_eagle("vllm-eagle3", draft)
    export_eagle("sglang-eagle3", draft)  # SGLang's loader is only read, not run here: the names stay as they were


def test_old_qwen2_layer_converts_to_llama_saying_what_it_drops(tmp_path, capsys):
    """--llama-layer gives an old Qwen2-style EAGLE-3 draft the Llama layer vLLM builds: with zero q/k/v biases
    the converted draft computes exactly the same; otherwise the warning names each dropped bias and the
    converted draft is the old one with those biases zeroed."""
    draft = random_draft("qwen2", "eagle3", layer="base")
    draft.save_pretrained(tmp_path / "old")
    with pytest.warns(UserWarning, match=r"qwen2-style draft layer becomes a Llama layer; dropped "
                                         r"layers.0.self_attn.q_proj.bias \(max \|value\| [0-9.]+\), "
                                         r"layers.0.self_attn.k_proj.bias .*, layers.0.self_attn.v_proj.bias"):
        out = export("vllm-eagle3", tmp_path / "old", tmp_path / "vllm", llama_layer=True)
    back = load_heads(out)
    assert back.config.layer_config["model_type"] == "llama"
    assert back.layers[0].self_attn.q_proj.bias is None
    with torch.no_grad():
        for name in ("q_proj", "k_proj", "v_proj"):
            getattr(draft.layers[0].self_attn, name).bias.zero_()
    same_outputs(draft.eval(), back.eval())  # the old draft without its biases, nothing else changed
    with pytest.raises(SystemExit, match="2"):  # argparse's usage error
        export_main(["--format", "sglang-eagle3", "--heads", str(tmp_path / "old"), "--out", str(tmp_path / "x"),
                     "--llama-layer"])
    assert "--llama-layer applies to --format vllm-eagle3 only" in capsys.readouterr().err
    with pytest.raises(ValueError, match="format 'sglang-eagle3' takes no option llama_layer"):
        export("sglang-eagle3", tmp_path / "old", tmp_path / "y", llama_layer=True)


def test_vllm_eagle3_refuses_a_layer_read_twice():
    """vLLM collects each aux layer once: ids [2, 3, 3] (the default for a 6-layer base) cannot be served."""
    draft = random_draft("llama", "eagle3", aux_layer_ids=[2, 3, 3])
    with pytest.raises(ValueError, match=r"\[2, 3, 3\] name a layer twice; vLLM collects each layer once"):
        export_eagle("vllm-eagle3", draft)


def test_sglang_aux_ids_read_the_trained_layers(tmp_path):
    """A foreign SGLang folder's ids come back one higher; a draft reading the embeddings (id 0) is refused."""
    draft = random_draft("llama", "eagle3", aux_layer_ids=[0, 4, 5])
    with pytest.raises(ValueError, match=r"\[0, 4, 5\]: SGLang cannot read the embeddings"):
        export_eagle("sglang-eagle3", draft)
    draft = random_draft("llama", "eagle3")
    draft.save_pretrained(tmp_path / "heads")
    out = export("sglang-eagle3", tmp_path / "heads", tmp_path / "sglang")
    config = json.loads((out / "config.json").read_text())
    del config["specheads"]  # as SGLang's own checkpoints are
    (out / "config.json").write_text(json.dumps(config))
    assert load_heads(out).config.aux_layer_ids == [2, 4, 5]


def test_export_states_the_dtype_of_its_tensors(tmp_path):
    """A bf16 copy of a draft trained in fp32 exports as bfloat16, not as the training dtype."""
    draft = random_draft("llama", "eagle3").to(torch.bfloat16)
    draft.config.layer_config["torch_dtype"] = "float32"
    config, tensors = export_eagle("vllm-eagle3", draft)
    assert tensors["fc.weight"].dtype == torch.bfloat16
    assert config["torch_dtype"] == config["transformer_layer_config"]["torch_dtype"] == "bfloat16"

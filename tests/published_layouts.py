"""Published draft folders at tiny shapes, written exactly as their projects write them (shared/PUBLISHED-LAYOUTS.md):
file names, config fields, tensor names, dtypes and pickles as published, only the sizes shrunk to fit `tiny_base`.

Each writer returns the tensors it wrote (the reference the tests compute with by hand). The sizes: hidden 32,
vocabulary 96, 8 target layers (EAGLE-3's default taps 2, L//2, L-3 = 2, 4, 5 are distinct only from 7 layers on).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

H, V, I, LAYERS, HEADS, KV_HEADS = 32, 96, 64, 8, 4, 2
HEAD_DIM = H // HEADS
DRAFT_VOCAB = 40


def tiny_base():
    """A random Llama target in fp32, untied like Vicuna and Llama-3.1 (lm_head != embed_tokens)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=V, hidden_size=H, intermediate_size=I, num_hidden_layers=LAYERS,
                         num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, max_position_embeddings=256,
                         tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    return LlamaForCausalLM(config).eval()


def _randn(*shape, scale=0.2, generator):
    return torch.randn(*shape, generator=generator) * scale


def _norm(generator):
    return 1 + _randn(H, scale=0.1, generator=generator)


def _write_config(folder: Path, config: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2))


def draft_vocabulary(size: int = DRAFT_VOCAB, seed: int = 5) -> torch.Tensor:
    """Sorted target ids of a draft vocabulary (EAGLE-3 keeps the most frequent tokens, sorted by id)."""
    ids = torch.randperm(V, generator=torch.Generator().manual_seed(seed))[:size].sort().values
    return ids


# ---- 1. FasterDecoding medusa-vicuna-7b-v1.3 --------------------------------------------------------

MEDUSA_VICUNA_CONFIG = {"base_model_name_or_path": "lmsys/vicuna-7b-v1.3", "medusa_num_heads": 2,
                        "medusa_num_layers": 1, "transformers_version": "4.31.0"}  # as published: says 2 heads
MEDUSA_VICUNA_HEADS = 5  # ... and the file holds 5


def write_medusa_vicuna(folder: Path, base, dtype=torch.bfloat16) -> dict[str, torch.Tensor]:
    """config.json as published + medusa_lm_head.pt = torch.save(ModuleList[Sequential(ResBlock, Linear)].state_dict()):
    `{i}.0.linear.weight/bias`, `{i}.1.weight` (each head's projection, initialised from the base lm_head)."""
    g = torch.Generator().manual_seed(11)
    state = {}
    for i in range(MEDUSA_VICUNA_HEADS):
        state[f"{i}.0.linear.weight"] = _randn(H, H, scale=0.1, generator=g).to(dtype)
        state[f"{i}.0.linear.bias"] = _randn(H, scale=0.1, generator=g).to(dtype)
        state[f"{i}.1.weight"] = (base.lm_head.weight.detach() + _randn(V, H, scale=0.01, generator=g)).to(dtype)
    _write_config(folder, MEDUSA_VICUNA_CONFIG)
    torch.save(state, folder / "medusa_lm_head.pt")
    return state


# ---- 2. EAGLE-1 for Vicuna (yuhuili/EAGLE-Vicuna-7B-v1.3) --------------------------------------------

def eagle1_vicuna_config() -> dict:
    """v1:eagle/train/vicuna_7B_config.json at tiny sizes: a LlamaConfig of transformers 4.28, one layer, no "bias"
    key (so fc has a bias), no num_key_value_heads (multi-head attention), fp16."""
    return {"architectures": ["LlamaForCausalLM"], "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
            "hidden_size": H, "initializer_range": 0.02, "intermediate_size": I, "max_position_embeddings": 2048,
            "model_type": "llama", "num_attention_heads": HEADS, "num_hidden_layers": 1, "pad_token_id": 0,
            "rms_norm_eps": 1e-06, "tie_word_embeddings": False, "torch_dtype": "float16",
            "transformers_version": "4.28.1", "use_cache": True, "vocab_size": V}


def write_eagle1_vicuna(folder: Path, base, rotary_cache: bool = False) -> dict[str, torch.Tensor]:
    """pytorch_model.bin (a pickle of the state dict, fp16): embed_tokens.weight (the base's), layers.0.* without
    input_layernorm, fc.weight [H, 2H] (embedding, then feature) and fc.bias."""
    g = torch.Generator().manual_seed(12)
    state = {"embed_tokens.weight": base.model.embed_tokens.weight.detach().clone()}
    for name in ("q", "k", "v", "o"):
        state[f"layers.0.self_attn.{name}_proj.weight"] = _randn(H, H, generator=g)
    state["layers.0.mlp.gate_proj.weight"] = _randn(I, H, generator=g)
    state["layers.0.mlp.up_proj.weight"] = _randn(I, H, generator=g)
    state["layers.0.mlp.down_proj.weight"] = _randn(H, I, generator=g)
    state["layers.0.post_attention_layernorm.weight"] = _norm(g)
    if rotary_cache:  # transformers 4.28 kept the rotary frequencies as a persistent buffer
        state["layers.0.self_attn.rotary_emb.inv_freq"] = 1.0 / 10000 ** (torch.arange(0, HEAD_DIM, 2) / HEAD_DIM)
    state["fc.weight"] = _randn(H, 2 * H, generator=g)
    state["fc.bias"] = _randn(H, generator=g)
    state = {name: tensor.half() for name, tensor in state.items()}
    _write_config(folder, eagle1_vicuna_config())
    torch.save(state, folder / "pytorch_model.bin")
    return state


# ---- 3-5. EAGLE-3: the EAGLE authors', SpecForge's, speculators' ------------------------------------

def llama31_layer_config() -> dict:
    """The draft layer as a Llama-3.1 config (GQA, rope 500000 with llama3 scaling), one layer, tiny."""
    return {"attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2,
            "hidden_act": "silu", "hidden_size": H, "initializer_range": 0.02, "intermediate_size": I,
            "max_position_embeddings": 2048, "mlp_bias": False, "model_type": "llama",
            "num_attention_heads": HEADS, "num_hidden_layers": 1, "num_key_value_heads": KV_HEADS,
            "pretraining_tp": 1, "rms_norm_eps": 1e-05,
            "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                             "original_max_position_embeddings": 64, "rope_type": "llama3"},
            "rope_theta": 500000.0, "tie_word_embeddings": False, "use_cache": True, "vocab_size": V}


def eagle3_tensors(seed: int, draft_vocab: int, prefix: str = "midlayer.") -> dict[str, torch.Tensor]:
    """cnets.py's Model state dict: the layer under `prefix` (attention reads 2H), fc [H, 3H] (no bias), norm,
    lm_head [draft_vocab, H], d2t / t2d when the draft vocabulary is smaller than the target's."""
    g = torch.Generator().manual_seed(seed)
    state = {
        f"{prefix}self_attn.q_proj.weight": _randn(HEADS * HEAD_DIM, 2 * H, generator=g),
        f"{prefix}self_attn.k_proj.weight": _randn(KV_HEADS * HEAD_DIM, 2 * H, generator=g),
        f"{prefix}self_attn.v_proj.weight": _randn(KV_HEADS * HEAD_DIM, 2 * H, generator=g),
        f"{prefix}self_attn.o_proj.weight": _randn(H, HEADS * HEAD_DIM, generator=g),
        f"{prefix}mlp.gate_proj.weight": _randn(I, H, generator=g),
        f"{prefix}mlp.up_proj.weight": _randn(I, H, generator=g),
        f"{prefix}mlp.down_proj.weight": _randn(H, I, generator=g),
        f"{prefix}hidden_norm.weight": _norm(g),
        f"{prefix}input_layernorm.weight": _norm(g),
        f"{prefix}post_attention_layernorm.weight": _norm(g),
        "fc.weight": _randn(H, 3 * H, generator=g),
        "norm.weight": _norm(g),
        "lm_head.weight": _randn(draft_vocab, H, scale=0.5, generator=g),
    }
    if draft_vocab != V:
        ids = draft_vocabulary(draft_vocab)
        state["d2t"] = ids - torch.arange(draft_vocab)  # int64: target = draft + d2t[draft]
        t2d = torch.zeros(V, dtype=torch.bool)
        t2d[ids] = True
        state["t2d"] = t2d
    return state


def write_eagle3_official(folder: Path, draft_vocab: int = DRAFT_VOCAB) -> dict[str, torch.Tensor]:
    """yuhuili/EAGLE3-LLaMA3.1-Instruct-8B: eagle/traineagle3/config.json (the EAGLE-1 Llama-3 config + draft_vocab_size,
    arch LlamaForCausalLM, "bias": false, no aux layer ids) + an fp16 pytorch_model.bin without embed_tokens."""
    state = {name: t.half() if t.is_floating_point() else t for name, t in eagle3_tensors(13, draft_vocab).items()}
    _write_config(folder, {**llama31_layer_config(), "architectures": ["LlamaForCausalLM"], "bias": False,
                           "draft_vocab_size": draft_vocab, "torch_dtype": "float16",
                           "transformers_version": "4.46.2"})
    torch.save(state, folder / "pytorch_model.bin")
    return state


def write_specforge(folder: Path, draft_vocab: int = DRAFT_VOCAB, sglang_aux_ids: list[int] | None = None,
                    fc_norm: bool = False) -> dict[str, torch.Tensor]:
    """SpecForge's epoch_E_step_S/: configs/llama3-8B-eagle3.json (arch LlamaForCausalLMEagle3, draft_vocab_size,
    aux ids, if any, in eagle_config in SGLang's numbering) + bf16 model.safetensors with the EAGLE authors' keys, the
    embedding left out; optionally fc_norm.{0,1,2}; and training_state.pt beside them."""
    state = {name: t.bfloat16() if t.is_floating_point() else t for name, t in eagle3_tensors(14, draft_vocab).items()}
    if fc_norm:
        g = torch.Generator().manual_seed(15)
        state.update({f"fc_norm.{i}.weight": _norm(g).bfloat16() for i in range(3)})
    config = {**llama31_layer_config(), "architectures": ["LlamaForCausalLMEagle3"], "draft_vocab_size": draft_vocab,
              "torch_dtype": "bfloat16"}
    if sglang_aux_ids is not None:
        config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": sglang_aux_ids}
    _write_config(folder, config)
    save_file(state, folder / "model.safetensors")
    torch.save({"epoch": 0, "global_step": 10}, folder / "training_state.pt")  # never read
    return state


def write_speculators(folder: Path, base, draft_vocab: int = V, aux_ids: list[int] | None = None,
                      **options) -> dict[str, torch.Tensor]:
    """A speculators eagle3 folder (models/eagle3/config.py, PR #53's example): speculators_config with the verifier,
    transformer_layer_config, layers.0.* keys, embed_tokens.weight (saved, the verifier's), d2t/t2d only when the draft
    vocabulary is smaller, fp32 model.safetensors. `options`: config fields such as norm_before_residual."""
    state = eagle3_tensors(16, draft_vocab, prefix="layers.0.")
    state["embed_tokens.weight"] = base.model.embed_tokens.weight.detach().clone()
    config = {
        "architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3", "speculators_version": "0.1.0.dev21",
        "draft_vocab_size": draft_vocab, "norm_before_residual": False, "target_hidden_size": None,
        "eagle_aux_hidden_state_layer_ids": aux_ids, "transformer_layer_config": llama31_layer_config(),
        "speculators_config": {
            "algorithm": "eagle3", "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 5, "accept_tolerance": 0.0,
                                  "verifier_accept_k": 1}],
            "verifier": {"architectures": ["LlamaForCausalLM"], "name_or_path": "meta-llama/Llama-3.1-8B-Instruct"}},
        "torch_dtype": "float32", **options}
    _write_config(folder, config)
    save_file(state, folder / "model.safetensors")
    return state


# ---- 6. z-lab DFlash ---------------------------------------------------------------------------------

DFLASH_LAYERS, DFLASH_BLOCK, DFLASH_TARGET_IDS = 2, 4, [1, 3, 5]


def dflash_zlab_config() -> dict:
    """z-lab's Qwen3-8B-DFlash-b16 config.json at tiny sizes: a Qwen3 config with DFlashDraftModel, auto_map, block_size
    top-level, num_target_layers, dflash_config {mask_token_id, target_layer_ids}."""
    return {"architectures": ["DFlashDraftModel"], "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
            "attention_bias": False, "attention_dropout": 0.0, "block_size": DFLASH_BLOCK, "bos_token_id": 1,
            "dflash_config": {"mask_token_id": V - 1, "target_layer_ids": DFLASH_TARGET_IDS}, "dtype": "bfloat16",
            "eos_token_id": 2, "head_dim": HEAD_DIM, "hidden_act": "silu", "hidden_size": H, "initializer_range": 0.02,
            "intermediate_size": I, "layer_types": ["full_attention"] * DFLASH_LAYERS, "max_position_embeddings": 4096,
            "max_window_layers": DFLASH_LAYERS, "model_type": "qwen3", "num_attention_heads": HEADS,
            "num_hidden_layers": DFLASH_LAYERS, "num_key_value_heads": KV_HEADS, "num_target_layers": LAYERS,
            "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None,
            "tie_word_embeddings": False, "transformers_version": "4.57.1", "use_cache": True,
            "use_sliding_window": False, "vocab_size": V}


def write_dflash_zlab(folder: Path) -> dict[str, torch.Tensor]:
    """model.safetensors (bf16) with dflash/model.py's names: layers.N.* (q_norm/k_norm per head), fc [H, n*H],
    hidden_norm, norm; no embeddings, no lm_head."""
    g = torch.Generator().manual_seed(17)
    state = {}
    for n in range(DFLASH_LAYERS):
        p = f"layers.{n}."
        state.update({
            p + "self_attn.q_proj.weight": _randn(HEADS * HEAD_DIM, H, generator=g),
            p + "self_attn.k_proj.weight": _randn(KV_HEADS * HEAD_DIM, H, generator=g),
            p + "self_attn.v_proj.weight": _randn(KV_HEADS * HEAD_DIM, H, generator=g),
            p + "self_attn.o_proj.weight": _randn(H, HEADS * HEAD_DIM, generator=g),
            p + "self_attn.q_norm.weight": 1 + _randn(HEAD_DIM, scale=0.1, generator=g),
            p + "self_attn.k_norm.weight": 1 + _randn(HEAD_DIM, scale=0.1, generator=g),
            p + "mlp.gate_proj.weight": _randn(I, H, generator=g),
            p + "mlp.up_proj.weight": _randn(I, H, generator=g),
            p + "mlp.down_proj.weight": _randn(H, I, generator=g),
            p + "input_layernorm.weight": _norm(g),
            p + "post_attention_layernorm.weight": _norm(g)})
    state["fc.weight"] = _randn(H, len(DFLASH_TARGET_IDS) * H, generator=g)
    state["hidden_norm.weight"] = _norm(g)
    state["norm.weight"] = _norm(g)
    state = {name: t.bfloat16() for name, t in state.items()}
    _write_config(folder, dflash_zlab_config())
    save_file(state, folder / "model.safetensors")
    return state

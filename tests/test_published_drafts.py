"""Published drafts import (issue 44): folders written exactly as FasterDecoding, the EAGLE authors, SpecForge,
speculators and z-lab write them (tests/published_layouts.py, tiny shapes) load with load_heads, compute what their
own code computes (by hand here, from the published tensors), decode losslessly (fp32, the base's greedy tokens) and
export to the engines' formats, which load back to the same draft."""

from __future__ import annotations

import importlib.util
import json
import math
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from published_layouts import (DFLASH_BLOCK, DFLASH_TARGET_IDS, DRAFT_VOCAB, HEAD_DIM, HEADS, KV_HEADS, LAYERS,
                               MEDUSA_VICUNA_HEADS, H, V, draft_vocabulary, eagle1_vicuna_config, llama31_layer_config,
                               tiny_base, write_dflash_zlab, write_eagle1_vicuna, write_eagle3_official,
                               write_medusa_vicuna, write_specforge, write_speculators)
from specheads.heads import DFlashDraft, EagleDraft, MedusaHeads
from specheads.heads.export import EXPORTS, export
from specheads.heads.loading import folder_kind, load_heads
from specheads.heads.weights import UnsafeWeightsError
from specheads.inference.methods import build_decoder, method_for
from specheads.inference.tree import MEDUSA_DEFAULT_TREE, default_medusa_tree

REPO = Path(__file__).resolve().parents[1]
PROMPT = torch.tensor([[1, 17, 33, 17, 33, 54, 17, 33, 9, 71]])
NEW_TOKENS = 24


@pytest.fixture(scope="module")
def base():
    return tiny_base()


@pytest.fixture(scope="module")
def base_dir(base, tmp_path_factory):
    """The base as a model folder: what `export(..., model=)` (scripts/export.py --model) names."""
    path = tmp_path_factory.mktemp("tiny-base")
    base.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def base_greedy(base):
    with torch.inference_mode():
        out = base.generate(PROMPT, max_new_tokens=NEW_TOKENS, do_sample=False, temperature=None, top_p=None,
                            top_k=None, attention_mask=torch.ones_like(PROMPT), pad_token_id=0, eos_token_id=None)
    return out[0, PROMPT.shape[1]:].tolist()


def load_script_export(argv):
    spec = importlib.util.spec_from_file_location("export_script", REPO / "scripts" / "export.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main(argv)


def load_quietly(folder, base):
    """load_heads, returning the draft and the warnings it gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        draft = load_heads(folder, base_model=base)
    return draft, [str(w.message) for w in caught]


def assert_decodes_losslessly(draft, base, expected, **options):
    from specheads.inference.methods import MethodOptions

    decoder = build_decoder(method_for(draft), base, draft, MethodOptions(**options))
    with torch.inference_mode():
        assert decoder.generate_ids(PROMPT, NEW_TOKENS) == expected
    return decoder


def hidden_states(base, ids=PROMPT):
    with torch.inference_mode():
        return base(ids, output_hidden_states=True).hidden_states


# ---- by hand: what the published modules compute ---------------------------------------------------

def rms(x, weight, eps):
    x = x.float()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight.float()


def rotate_half(x):
    return torch.cat([-x[..., x.shape[-1] // 2:], x[..., : x.shape[-1] // 2]], dim=-1)


def llama_attention(x, t, prefix, layer_config, heads, kv_heads):
    """Causal Llama attention over x [T, in] with the tensors `{prefix}self_attn.*`, RoPE from the layer's config."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    n = x.shape[0]
    q = (x @ t[prefix + "self_attn.q_proj.weight"].float().T).view(n, heads, HEAD_DIM).transpose(0, 1)
    k = (x @ t[prefix + "self_attn.k_proj.weight"].float().T).view(n, kv_heads, HEAD_DIM).transpose(0, 1)
    v = (x @ t[prefix + "self_attn.v_proj.weight"].float().T).view(n, kv_heads, HEAD_DIM).transpose(0, 1)
    config = LlamaConfig(**{k_: v_ for k_, v_ in layer_config.items() if k_ != "architectures"})
    cos, sin = LlamaRotaryEmbedding(config)(x[None], torch.arange(n)[None])
    q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
    k, v = k.repeat_interleave(heads // kv_heads, 0), v.repeat_interleave(heads // kv_heads, 0)
    scores = q @ k.transpose(1, 2) / math.sqrt(HEAD_DIM)
    scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    out = (scores.softmax(-1) @ v).transpose(0, 1).reshape(n, heads * HEAD_DIM)
    return out @ t[prefix + "self_attn.o_proj.weight"].float().T


def llama_mlp(x, t, prefix):
    gate, up, down = (t[prefix + f"mlp.{p}_proj.weight"].float() for p in ("gate", "up", "down"))
    return (F.silu(x @ gate.T) * (x @ up.T)) @ down.T


def eagle1_by_hand(t, config, embeddings, features):
    """EAGLE-1 (cnets1.py): x = fc(cat(embedding, feature)) + b; one Llama layer with no input norm."""
    x = torch.cat([embeddings, features], -1) @ t["fc.weight"].float().T + t["fc.bias"].float()
    x = x + llama_attention(x, t, "layers.0.", config, config["num_attention_heads"], config["num_attention_heads"])
    return x + llama_mlp(rms(x, t["layers.0.post_attention_layernorm.weight"], config["rms_norm_eps"]), t, "layers.0.")


def eagle3_by_hand(t, prefix, config, embeddings, aux_states, norm_before_residual=False):
    """EAGLE-3 (cnets.py / speculators' first layer): h = fc(cat(aux)); attention over cat(input_layernorm(embedding),
    hidden_norm(h)); residual h (or hidden_norm(h)); logits = lm_head(norm(out)) over the draft vocabulary."""
    eps = config["rms_norm_eps"]
    h = torch.cat(aux_states, -1) @ t["fc.weight"].float().T
    normed = rms(h, t[prefix + "hidden_norm.weight"], eps)
    x = torch.cat([rms(embeddings, t[prefix + "input_layernorm.weight"], eps), normed], -1)
    out = (normed if norm_before_residual else h) + llama_attention(x, t, prefix, config, HEADS, KV_HEADS)
    out = out + llama_mlp(rms(out, t[prefix + "post_attention_layernorm.weight"], eps), t, prefix)
    return out, rms(out, t["norm.weight"], eps) @ t["lm_head.weight"].float().T


def causal_mask(n):
    return torch.zeros(n, n).masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), torch.finfo(torch.float32).min)


def draft_forward(draft: EagleDraft, base, features_from):
    """The loaded draft (in fp32) over the prompt: features from the base's hidden states, embeddings of the tokens."""
    draft = draft.float().eval()
    states = hidden_states(base)
    embeddings = base.get_input_embeddings()(PROMPT)
    with torch.no_grad():
        features = draft.fuse([states[i] for i in features_from])
        out = draft(features, embeddings, torch.arange(PROMPT.shape[1])[None], causal_mask(PROMPT.shape[1])[None, None])
    return out[0], states, embeddings[0]


def assert_exports_load_back(tmp_path, folder, draft, base, formats, model=None):
    """Each engine format, written straight from the published folder, loads back to the same tensors."""
    ours = {k: v.float() if v.is_floating_point() else v for k, v in draft.state_dict().items()
            if not k.startswith("rotary_emb.")}
    for fmt in formats:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the import's own warnings, tested where they are raised
            out = export(fmt, folder, tmp_path / fmt, model=model)
            back = load_heads(out, base_model=base)
        assert folder_kind(out) == fmt
        theirs = {k: v.float() if v.is_floating_point() else v for k, v in back.state_dict().items()
                  if not k.startswith("rotary_emb.")}
        assert theirs.keys() == ours.keys(), fmt
        for name in ours:
            torch.testing.assert_close(theirs[name], ours[name], rtol=0, atol=0, msg=f"{fmt}: {name}")


# ---- 1. FasterDecoding medusa-vicuna-7b-v1.3 --------------------------------------------------------------

def test_medusa_vicuna_loads_the_five_heads_its_file_holds(tmp_path, base, base_greedy):
    folder = tmp_path / "medusa-vicuna-7b-v1.3"
    state = write_medusa_vicuna(folder, base)
    assert json.loads((folder / "config.json").read_text())["medusa_num_heads"] == 2
    heads, caught = load_quietly(folder, base)
    assert isinstance(heads, MedusaHeads) and folder_kind(folder) == "faster-decoding"
    assert any("medusa_num_heads is 2, but medusa_lm_head.pt holds 5" in w for w in caught), caught
    config = heads.config
    assert (config.num_heads, config.num_layers, config.own_lm_head, config.vocab_size) == (5, 1, True, V)
    assert config.base_model_name_or_path == "lmsys/vicuna-7b-v1.3"

    h = torch.randn(3, H)
    expected = []
    for i in range(MEDUSA_VICUNA_HEADS):  # ResBlock: x + SiLU(W x + b), then the head's own projection
        w, b = state[f"{i}.0.linear.weight"].float(), state[f"{i}.0.linear.bias"].float()
        expected.append((h + F.silu(h @ w.T + b)) @ state[f"{i}.1.weight"].float().T)
    with torch.no_grad():
        torch.testing.assert_close(heads.float()(h), torch.stack(expected))

    # no tree in the folder: Medusa's default, cut to the heads (all 63 nodes fit 5 heads)
    with pytest.warns(UserWarning, match="carry no tree: using Medusa's default .* 5 heads, 63 nodes"):
        decoder = assert_decodes_losslessly(heads, base, base_greedy)
    assert decoder.candidates.buffers.num_nodes == 64  # the root and mc_sim_7b_63

    out = export("vllm-medusa", folder, tmp_path / "vllm-medusa")
    config = json.loads((out / "config.json").read_text())
    assert (config["num_heads"], config["original_lm_head"], config["truncated_vocab_size"]) == (5, False, V)
    back = load_heads(out, base_model=base)
    with torch.no_grad():
        torch.testing.assert_close(back.float()(h), heads(h), rtol=0, atol=0)


def test_default_medusa_tree_is_medusas_cut_to_the_heads():
    assert len(MEDUSA_DEFAULT_TREE) == 63 and max(map(len, MEDUSA_DEFAULT_TREE)) == 4
    assert default_medusa_tree(5) == default_medusa_tree(4) == MEDUSA_DEFAULT_TREE
    two = default_medusa_tree(2)
    assert two and all(len(p) <= 2 for p in two) and (0, 9) in two and (0, 0, 0) not in two
    small_vocab = default_medusa_tree(3, vocab_size=4)
    assert all(max(p) < 4 for p in small_vocab) and (3, 1) in small_vocab and (4,) not in small_vocab
    for tree in (two, small_vocab, default_medusa_tree(1)):  # closed under ancestors: every parent is there
        assert all(len(p) == 1 or p[:-1] in tree for p in tree)


def test_medusa_vicuna_pickle_rules_still_hold(tmp_path, base):
    """The .pt is read weights-only: a pickle that would run code is refused, and a pytorch_model.bin beside our
    own (specheads) folder is still never unpickled."""
    folder = tmp_path / "fd"
    write_medusa_vicuna(folder, base)

    class Payload:
        def __reduce__(self):
            return (print, ("code ran",))

    torch.save({"0.0.linear.weight": Payload()}, folder / "medusa_lm_head.pt")
    with pytest.raises(ValueError, match=r"refusing .*medusa_lm_head.pt: torch.load\(weights_only=True\) rejected"):
        load_heads(folder, base_model=base)


# ---- 2. EAGLE-1 for Vicuna ------------------------------------------------------------------------------

def test_eagle1_vicuna_loads_computes_as_published_and_decodes(tmp_path, base, base_greedy):
    folder = tmp_path / "EAGLE-Vicuna-7B-v1.3"
    state = write_eagle1_vicuna(folder, base)
    assert folder_kind(folder) == "eagle-repo"
    draft, caught = load_quietly(folder, base)
    assert isinstance(draft, EagleDraft) and draft.config.variant == "eagle1" and draft.fc.bias is not None
    assert draft.fc.weight.dtype == torch.float16  # the file's precision
    assert [w for w in caught if "embed_tokens.weight (96, 32) is not used" in w and "which it equals" in w], caught
    assert draft.extra_config == {"imported_from": "eagle-repo"}

    out, states, embeddings = draft_forward(draft, base, [-1])
    with torch.no_grad():
        expected = eagle1_by_hand(state, eagle1_vicuna_config(), embeddings, states[-1][0])
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)

    assert_decodes_losslessly(draft, base, base_greedy)
    # vLLM's EAGLE-1 fc has no bias and drops a shipped one silently: refused; SGLang's keeps it
    with pytest.raises(ValueError, match="fc.bias is not zero.*sglang-eagle"):
        export("vllm-eagle", folder, tmp_path / "vllm-eagle")
    assert_exports_load_back(tmp_path, folder, draft, base, ["sglang-eagle"])


def test_eagle1_vicuna_names_a_rotary_cache_and_refuses_a_missing_or_misshapen_tensor(tmp_path, base):
    folder = tmp_path / "eagle1"
    state = write_eagle1_vicuna(folder, base, rotary_cache=True)
    with pytest.warns(UserWarning, match=r"tensor layers.0.self_attn.rotary_emb.inv_freq \(4,\) is not used "
                                         r"\(the rotary frequencies are recomputed"):
        load_heads(folder, base_model=base)
    torch.save({k: v for k, v in state.items() if k != "fc.bias"}, folder / "pytorch_model.bin")
    with pytest.warns(UserWarning), pytest.raises(ValueError, match=r"pytorch_model.bin: missing tensors \['fc.bias'\]"):
        load_heads(folder, base_model=base)
    torch.save({**state, "fc.weight": state["fc.weight"][:, :H]}, folder / "pytorch_model.bin")
    with pytest.warns(UserWarning), pytest.raises(ValueError, match=r"tensor fc.weight has shape \(32, 32\), "
                                                                    r"expected \(32, 64\)"):
        load_heads(folder, base_model=base)
    other = tiny_base()
    with torch.no_grad():
        other.model.embed_tokens.weight.add_(1.0)
    torch.save(state, folder / "pytorch_model.bin")
    with pytest.warns(UserWarning, match="which it differs from .*is this the draft's base"):
        load_heads(folder, base_model=other)


def test_eagle_repo_pickles_are_read_weights_only_and_other_pickles_refused(tmp_path, base):
    folder = tmp_path / "eagle1"
    write_eagle1_vicuna(folder, base)
    marker = tmp_path / "code-ran"

    class Payload:
        def __reduce__(self):
            return (type(marker).touch, (marker,))

    torch.save({"fc.weight": Payload()}, folder / "pytorch_model.bin")
    with pytest.raises(ValueError, match=r"refusing .*pytorch_model.bin: torch.load\(weights_only=True\) rejected"):
        load_heads(folder, base_model=base)
    assert not marker.exists()
    (folder / "pytorch_model.bin").rename(folder / "weights.pt")
    with pytest.raises(UnsafeWeightsError, match="model.safetensors is missing and specheads will not unpickle weights.pt"):
        load_heads(folder, base_model=base)


# ---- 3. the EAGLE authors' EAGLE-3 ----------------------------------------------------------------------

def check_eagle3(draft, base, state, prefix, aux, norm_before_residual=False):
    assert draft.config.aux_layer_ids == aux
    out, states, embeddings = draft_forward(draft, base, aux)
    with torch.no_grad():
        expected, expected_logits = eagle3_by_hand(state, prefix, llama31_layer_config(), embeddings,
                                                   [states[i][0] for i in aux], norm_before_residual)
        logits = draft.logits(out)
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(logits, expected_logits, rtol=1e-4, atol=1e-4)
    vocab = draft_vocabulary(draft.config.draft_vocab_size) if draft.config.draft_vocab_size != V else torch.arange(V)
    assert torch.equal(draft.draft_to_target(torch.arange(draft.config.draft_vocab_size)), vocab)


def test_eagle3_official_taps_the_targets_default_layers(tmp_path, base, base_dir, base_greedy):
    folder = tmp_path / "EAGLE3-LLaMA3.1-Instruct-8B"
    state = write_eagle3_official(folder)
    assert folder_kind(folder) == "eagle3-repo"
    draft, caught = load_quietly(folder, base)
    assert not caught, caught  # nothing left out
    assert draft.config.variant == "eagle3" and draft.config.draft_vocab_size == DRAFT_VOCAB
    assert draft.config.aux_layer_ids == [2, LAYERS // 2, LAYERS - 3]  # entering layers 2, L//2, L-3 of the target
    assert draft.config.transformers_config().rope_parameters["rope_type"] == "llama3"
    check_eagle3(draft, base, state, "midlayer.", [2, 4, 5])
    assert_decodes_losslessly(draft, base, base_greedy)
    with pytest.raises(SystemExit, match="names no aux layers.*pass base_model \\(--model\\)"):
        load_script_export(["--format", "vllm-eagle3", "--heads", str(folder), "--out", str(tmp_path / "no-base")])
    assert_exports_load_back(tmp_path, folder, draft, base, ["vllm-eagle3", "sglang-eagle3"], model=base_dir)
    speculators = json.loads((tmp_path / "vllm-eagle3" / "config.json").read_text())
    assert speculators["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]
    assert speculators["speculators_config"]["verifier"]["name_or_path"] == base_dir

    with pytest.raises(ValueError, match="config.json: names no aux layers.*pass base_model"):
        load_heads(folder)  # the taps depend on the target's depth


def test_eagle3_official_vocab_mapping_and_refusals(tmp_path, base):
    folder = tmp_path / "eagle3"
    state = write_eagle3_official(folder)
    for left_out in ("t2d", "d2t"):  # either one gives the other
        torch.save({k: v for k, v in state.items() if k != left_out}, folder / "pytorch_model.bin")
        draft = load_heads(folder, base_model=base)
        assert torch.equal(draft.d2t, state["d2t"]) and torch.equal(draft.t2d, state["t2d"]), left_out
    torch.save({k: v for k, v in state.items() if k not in ("d2t", "t2d")}, folder / "pytorch_model.bin")
    with pytest.raises(ValueError, match="missing tensors 'd2t' and 't2d': the draft vocabulary \\(40 tokens\\) is "
                                         "smaller"):
        load_heads(folder, base_model=base)
    t2d = state["t2d"].clone()
    t2d[int((~t2d).nonzero()[0])] = True
    torch.save({**state, "t2d": t2d}, folder / "pytorch_model.bin")
    with pytest.raises(ValueError, match="d2t and t2d disagree"):
        load_heads(folder, base_model=base)
    torch.save({**state, "fc.bias": torch.zeros(H)}, folder / "pytorch_model.bin")
    with pytest.raises(ValueError, match=r"unexpected tensors \['fc.bias'\]"):
        load_heads(folder, base_model=base)
    torch.save({k: v for k, v in state.items() if k != "midlayer.hidden_norm.weight"}, folder / "pytorch_model.bin")
    with pytest.raises(ValueError, match=r"missing tensors \['midlayer.hidden_norm.weight'\]"):
        load_heads(folder, base_model=base)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "target_hidden_size": 2 * H}))
    with pytest.raises(ValueError, match="target_hidden_size 64 differs from the draft's hidden_size 32"):
        load_heads(folder, base_model=base)


def test_eagle3_with_the_full_vocabulary_needs_no_mapping(tmp_path, base, base_greedy):
    folder = tmp_path / "eagle3-full-vocab"
    state = write_eagle3_official(folder, draft_vocab=V)
    assert "d2t" not in state and "t2d" not in state  # dropped when V == Vd
    draft = load_heads(folder, base_model=base)
    assert draft.config.draft_vocab_size == V and bool(draft.t2d.all()) and not draft.d2t.any()
    assert_decodes_losslessly(draft, base, base_greedy)


# ---- 4. SpecForge ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("sglang_aux_ids, aux", [(None, [2, 4, 5]), ([0, 2, 5], [1, 3, 6])])
def test_specforge_output_loads_with_or_without_aux_ids(tmp_path, base, base_dir, base_greedy, sglang_aux_ids, aux):
    """SpecForge writes the EAGLE authors' keys (no embeddings) under LlamaForCausalLMEagle3; aux ids, where given,
    are SGLang's (it adds 1), else SGLang's default taps, which are EAGLE's."""
    folder = tmp_path / "epoch_0_step_10"
    state = write_specforge(folder, sglang_aux_ids=sglang_aux_ids)
    assert folder_kind(folder) == "sglang-eagle3"
    draft, caught = load_quietly(folder, base)
    assert not caught, caught
    assert draft.fc.weight.dtype == torch.bfloat16
    check_eagle3(draft, base, state, "midlayer.", aux)
    assert_decodes_losslessly(draft, base, base_greedy)
    assert_exports_load_back(tmp_path, folder, draft, base, ["vllm-eagle3", "sglang-eagle3"], model=base_dir)


def test_specforge_fc_norm_is_named_not_dropped(tmp_path, base):
    folder = tmp_path / "specforge"
    write_specforge(folder, fc_norm=True)
    with pytest.raises(ValueError, match=r"unexpected tensors \['fc_norm.0.weight', 'fc_norm.1.weight', "
                                         r"'fc_norm.2.weight'\]"):
        load_heads(folder, base_model=base)


# ---- 5. speculators -------------------------------------------------------------------------------------

@pytest.mark.parametrize("draft_vocab", [V, DRAFT_VOCAB])
def test_speculators_folder_loads_naming_its_embedding(tmp_path, base, base_dir, base_greedy, draft_vocab):
    folder = tmp_path / "speculators"
    state = write_speculators(folder, base, draft_vocab=draft_vocab)
    assert ("d2t" in state) is (draft_vocab != V)  # only when the draft vocabulary is smaller
    assert folder_kind(folder) == "vllm-eagle3"
    draft, caught = load_quietly(folder, base)
    embedding = [w for w in caught if "tensor embed_tokens.weight (96, 32) is not used" in w]
    assert embedding and "which it equals" in embedding[0] and len(caught) == 1, caught
    check_eagle3(draft, base, state, "layers.0.", [2, 4, 5])
    assert_decodes_losslessly(draft, base, base_greedy)
    assert_exports_load_back(tmp_path, folder, draft, base, ["vllm-eagle3", "sglang-eagle3"], model=base_dir)


def test_speculators_norm_before_residual_is_computed_and_kept(tmp_path, base, base_dir, base_greedy):
    """The speculators library trains with norm_before_residual true by default: the residual is hidden_norm(h)."""
    folder = tmp_path / "speculators"
    state = write_speculators(folder, base, draft_vocab=DRAFT_VOCAB, norm_before_residual=True)
    draft, _ = load_quietly(folder, base)
    assert draft.config.norm_before_residual
    check_eagle3(draft, base, state, "layers.0.", [2, 4, 5], norm_before_residual=True)
    assert_decodes_losslessly(draft, base, base_greedy)
    assert_exports_load_back(tmp_path, folder, draft, base, ["vllm-eagle3"], model=base_dir)
    assert json.loads((tmp_path / "vllm-eagle3" / "config.json").read_text())["norm_before_residual"] is True
    with pytest.warns(UserWarning), pytest.raises(ValueError, match="norm_before_residual.*export it as vllm-eagle3"):
        export("sglang-eagle3", folder, tmp_path / "sglang", model=base_dir)


def test_speculators_options_that_change_the_draft_are_refused(tmp_path, base):
    for option in ("norm_before_fc", "fc_norm", "norm_output"):
        folder = tmp_path / option
        write_speculators(folder, base, **{option: True})
        with pytest.raises(ValueError, match=f"config.json: {option} is True; specheads' EAGLE-3 draft"):
            load_heads(folder, base_model=base)
    folder = tmp_path / "explicit-aux"
    write_speculators(folder, base, aux_ids=[1, 3, 6])
    with pytest.warns(UserWarning, match="embed_tokens"):
        assert load_heads(folder, base_model=base).config.aux_layer_ids == [1, 3, 6]


# ---- 6. z-lab DFlash ------------------------------------------------------------------------------------

def test_zlab_dflash_loads_decodes_and_exports(tmp_path, base, base_greedy):
    folder = tmp_path / "Qwen3-8B-DFlash-b16"
    state = write_dflash_zlab(folder)
    assert folder_kind(folder) == "vllm-dflash"
    draft, caught = load_quietly(folder, base)
    assert not caught, caught
    assert isinstance(draft, DFlashDraft)
    config = draft.config
    assert (config.block_size, config.mask_token_id, config.target_layer_ids, config.num_layers) == (
        DFLASH_BLOCK, V - 1, DFLASH_TARGET_IDS, 2)
    assert config.feature_layers == [i + 1 for i in DFLASH_TARGET_IDS]  # id i reads hidden_states[i + 1]
    assert config.transformers_config().rope_parameters["rope_theta"] == 1000000
    assert "auto_map" not in config.layer_config
    loaded = {k: v for k, v in draft.state_dict().items() if not k.startswith("rotary_emb.")}
    assert loaded.keys() == state.keys()
    for name, tensor in state.items():
        assert torch.equal(loaded[name], tensor), name
    assert_decodes_losslessly(draft, base, base_greedy)
    assert_exports_load_back(tmp_path, folder, draft, base, ["vllm-dflash"])


def test_zlab_dflash_refusals(tmp_path, base):
    folder = tmp_path / "dflash"
    write_dflash_zlab(folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "num_target_layers": 36}))
    with pytest.raises(ValueError, match="num_target_layers is 36, but the base model has 8 layers"):
        load_heads(folder, base_model=base)
    (folder / "config.json").write_text(json.dumps({**config, "dflash_config": {**config["dflash_config"],
                                                                                "use_swa": True}}))
    with pytest.raises(ValueError, match="sliding-window attention"):
        load_heads(folder, base_model=base)
    block_inside = {k: v for k, v in config.items() if k != "block_size"}
    block_inside["dflash_config"] = {**config["dflash_config"], "block_size": 6}  # Qwen3.5+ drafters
    (folder / "config.json").write_text(json.dumps(block_inside))
    assert load_heads(folder, base_model=base).config.block_size == 6


# ---- the registry ---------------------------------------------------------------------------------------

def test_read_only_formats_are_not_export_choices():
    assert "eagle-repo" not in EXPORTS and "eagle3-repo" not in EXPORTS
    assert {"vllm-medusa", "vllm-eagle", "vllm-eagle3", "vllm-dflash", "specheads"} <= EXPORTS.keys()

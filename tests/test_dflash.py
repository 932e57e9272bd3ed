"""DFlash block drafter: its folder and vLLM export, block drafting as a candidate source (lossless), training."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from conftest import KILL_IN_NTH_SAVE, synthetic_sharegpt, write_jsonl
from test_decoder import VOCAB, hf_greedy, tiny_model

from specheads.heads import DFlashConfig, DFlashDraft, load_heads
from specheads.heads.export import export
from specheads.inference.decoder import TreeDecoder
from specheads.inference.dflash import DFlashCandidates
from specheads.inference.methods import MethodOptions, build_decoder, method_for

REPO = Path(__file__).resolve().parent.parent


def deep_tiny_model(arch: str = "llama"):
    model = tiny_model(arch)
    values = model.config.to_dict()
    values.pop("layer_types", None)
    torch.manual_seed(0)
    deeper = type(model)(type(model.config)(**{**values, "num_hidden_layers": 4})).to(model.dtype).eval()
    with torch.no_grad():
        deeper.lm_head.weight.mul_(8.0)
    return deeper


def new_draft(model, block_size=4, num_layers=2, seed=3, target_layer_ids=(0, 2), **kwargs):
    torch.manual_seed(seed)
    config = DFlashConfig.for_base(model.config, "tiny", block_size=block_size, num_layers=num_layers,
                                   target_layer_ids=list(target_layer_ids), **kwargs)
    draft = DFlashDraft(config).to(model.dtype)
    with torch.no_grad():  # norms away from 1, so a mix-up of norm weights shows
        for name, p in draft.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    return draft.eval()


def fitted_draft(model, block_size=4, steps=200, prompts=32, lr=3e-3, same_k_norm=False, **draft_options):
    """A drafter trained for a moment on the model's own greedy text with train/dflash.py's loss. same_k_norm: every
    layer's k_norm weight is layer 0's, frozen (vLLM 0.32's CPU rms_norm applies row 0 of the grouped k_norm weights
    it normalises the context keys with to every layer: tests/test_engine_vllm.py)."""
    from specheads.train.dflash import block_logits, choose_anchors, position_losses

    torch.manual_seed(7)
    prompts = torch.randint(3, VOCAB, (prompts, 6))
    with torch.no_grad():
        text = model.generate(prompts, max_new_tokens=30, do_sample=False, pad_token_id=0,
                              attention_mask=torch.ones_like(prompts))
        states = model.model(text, output_hidden_states=True).hidden_states
    draft = new_draft(model, block_size=block_size, **draft_options).train()
    if same_k_norm:
        for layer in draft.layers:
            layer.self_attn.k_norm.weight.data.copy_(draft.layers[0].self_attn.k_norm.weight.data)
            layer.self_attn.k_norm.weight.requires_grad_(False)
    inputs = torch.stack([states[i] for i in draft.config.feature_layers])
    batch = {"input_ids": text, "labels": text, "attention_mask": torch.ones_like(text)}
    optimizer = torch.optim.AdamW([p for p in draft.parameters() if p.requires_grad], lr=lr)
    generator = torch.Generator().manual_seed(0)
    for _ in range(steps):
        anchors = choose_anchors(batch["labels"], 12, generator)
        losses, _ = position_losses(*block_logits(draft, model, batch, inputs, anchors))
        optimizer.zero_grad()
        losses.sum().backward()
        optimizer.step()
    return draft.eval()


# ---- the folder and the vLLM export -------------------------------------------------------------

def test_save_load_round_trip_gives_the_same_drafter(tmp_path):
    model = deep_tiny_model()
    draft = new_draft(model)
    draft.save_pretrained(tmp_path / "d", extra={"tree": [[0], [1]]})
    again = load_heads(tmp_path / "d", base_model=model)
    assert isinstance(again, DFlashDraft) and again.config == draft.config
    assert again.extra_config["tree"] == [[0], [1]]
    for name, tensor in draft.state_dict().items():
        assert torch.equal(tensor, again.state_dict()[name].to(tensor.dtype)), name
    assert json.loads((tmp_path / "d" / "config.json").read_text())["model_type"] == "specheads-dflash"


def test_a_missing_misshapen_or_foreign_tensor_is_named(tmp_path):
    model = deep_tiny_model()
    draft = new_draft(model)
    draft.save_pretrained(tmp_path / "d")
    weights = tmp_path / "d" / "model.safetensors"
    state = load_file(str(weights))
    missing = {k: v for k, v in state.items() if k != "layers.1.self_attn.k_norm.weight"}
    save_file(missing, str(weights))
    with pytest.raises(ValueError, match=r"missing tensors \['layers.1.self_attn.k_norm.weight'\]"):
        DFlashDraft.from_pretrained(tmp_path / "d")
    save_file({**state, "hidden_norm.weight": torch.ones(7, dtype=state["hidden_norm.weight"].dtype)}, str(weights))
    with pytest.raises(ValueError, match=r"tensor hidden_norm.weight has shape \(7,\)"):
        DFlashDraft.from_pretrained(tmp_path / "d")
    save_file({**state, "lm_head.weight": torch.zeros(VOCAB, 32)}, str(weights))
    with pytest.raises(ValueError, match=r"unexpected tensors \['lm_head.weight'\]"):
        DFlashDraft.from_pretrained(tmp_path / "d")
    save_file(state, str(weights))
    other = tiny_model("llama")  # 2 layers: target layer 2 does not exist
    with pytest.raises(ValueError, match=r"target_layer_ids \[0, 2\] must lie in 0..0"):
        DFlashDraft.from_pretrained(tmp_path / "d", base_model=other)
    for ids, problem in (([0, 3], "must lie in 0..2"), ([1, 1], "name a layer twice")):
        with pytest.raises(ValueError, match=problem):
            DFlashConfig.for_base(model.config, "tiny", target_layer_ids=ids)


def test_vllm_dflash_export_is_what_vllms_loader_reads_and_loads_back(tmp_path):
    """Names and config as vLLM 0.32's qwen3_dflash.py / speculative.py read them (read from its code)."""
    model = deep_tiny_model()
    draft = new_draft(model, block_size=5, num_layers=2)
    draft.save_pretrained(tmp_path / "d")
    out = export("vllm-dflash", tmp_path / "d", tmp_path / "x")
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"] and config["model_type"] == "qwen3"
    assert config["dflash_config"] == {"mask_token_id": VOCAB - 1, "target_layer_ids": [0, 2], "causal": False}
    assert config["block_size"] == 5 and config["num_hidden_layers"] == 2 and config["head_dim"] == 8
    assert config["hidden_size"] == 32 and config["vocab_size"] == VOCAB and not config["attention_bias"]
    assert config["rope_parameters"]["rope_theta"] == model.config.rope_parameters["rope_theta"]
    tensors = load_file(str(out / "model.safetensors"))
    assert not any("embed_tokens" in k or "lm_head" in k or "mask_hidden" in k for k in tensors)  # shared with target
    assert tensors["fc.weight"].shape == (32, 64)
    for name in ("hidden_norm.weight", "norm.weight", "layers.1.self_attn.q_norm.weight",
                 "layers.1.self_attn.k_norm.weight", "layers.0.mlp.gate_proj.weight"):
        assert name in tensors, name
    assert tensors.keys() == {k for k in draft.state_dict() if not k.startswith("rotary_emb.")}  # a plain copy
    back = load_heads(out, base_model=model)
    assert isinstance(back, DFlashDraft) and back.config == draft.config
    for name, tensor in draft.state_dict().items():
        assert torch.equal(tensor, back.state_dict()[name]), name


# ---- drafting ------------------------------------------------------------------------------------

def test_context_committed_in_pieces_equals_one_forward_over_the_whole_context():
    """The source's cached context (appended commit by commit) drafts exactly what one forward over every
    position's features does, and the block attends to the whole block (not causal)."""
    model = deep_tiny_model()
    draft = new_draft(model)
    source = DFlashCandidates(draft, model)
    ids = torch.randint(3, VOCAB, (1, 12))
    with torch.no_grad():
        states = model.model(ids, output_hidden_states=True).hidden_states
    features = [states[i][0] for i in draft.config.feature_layers]
    source.commit(ids[0, 1:8].tolist(), [f[:7] for f in features])
    source.commit(ids[0, 8:12].tolist(), [f[7:11] for f in features])
    pieces = source.block_outputs(int(ids[0, 11]))
    with torch.no_grad():
        context = draft.context_kv(draft.fuse([f[None, :11] for f in features]), torch.arange(11)[None])
        block = torch.tensor([[int(ids[0, 11])] + [draft.config.mask_token_id] * 3])
        whole = draft(model.get_input_embeddings()(block), torch.arange(11, 15)[None], context,
                      draft.block_mask(torch.ones(1, 11, dtype=torch.bool)))[0, 1:]
        causal = draft(model.get_input_embeddings()(block), torch.arange(11, 15)[None], context,
                       torch.ones(1, 1, 4, 15, dtype=torch.bool).tril(11))[0, 1:]
    torch.testing.assert_close(pieces, whole, rtol=1e-10, atol=1e-10)
    assert not torch.allclose(whole[:2], causal[:2])  # earlier positions see later ones


@pytest.mark.parametrize("tree", [None, [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]])
def test_dflash_greedy_equals_hf_generate_fp64(tree):
    """Greedy block drafting (chain, or a per-position top-k tree) gives the base's own greedy tokens, and the
    drafts get accepted (τ > 1), so the test could fail."""
    model = deep_tiny_model()
    draft = fitted_draft(model)
    decoder = TreeDecoder(model, candidates=DFlashCandidates(draft, model, tree=tree))
    steps = tokens = 0
    for case in range(5):
        torch.manual_seed(300 + case)
        prompt = torch.randint(3, VOCAB, (1, 5 + 3 * case))
        assert decoder.generate_ids(prompt, 40, eos_token_ids=[2]) == hf_greedy(model, prompt, 40), case
        steps += len(decoder.stats.accepted_lengths)
        tokens += sum(decoder.stats.accepted_lengths)
    assert tokens > 1.3 * steps, f"τ {tokens / steps:.2f}: drafted tokens must get accepted for the test to mean anything"


def test_dflash_methods_are_registered_and_lossless():
    model = deep_tiny_model()
    draft = new_draft(model)
    assert method_for(draft) == "dflash" and method_for(draft, prompt_lookup=True) == "dflash_pld"
    prompt = torch.tensor([[1, 5, 7, 5, 7, 9, 5, 7]])
    expected = hf_greedy(model, prompt, 20)
    for name in ("dflash", "dflash_pld"):
        assert build_decoder(name, model, draft).generate_ids(prompt, 20, eos_token_ids=[2]) == expected, name
    with pytest.raises(ValueError, match="depth 4 but there are only 3 heads"):
        build_decoder("dflash", model, draft, MethodOptions(tree=[[0], [0, 0], [0, 0, 0], [0, 0, 0, 0]]))


# ---- training ------------------------------------------------------------------------------------

def dflash_config(tmp_path, model_dir, max_steps, save_every=2):
    data = tmp_path / "conversations.jsonl"
    if not data.exists():
        write_jsonl(data, synthetic_sharegpt(24))
    config = tmp_path / "dflash.yaml"
    config.write_text(json.dumps({
        "model": {"name": str(model_dir), "dtype": "fp32"},
        "data": {"dataset": str(data), "max_length": 64, "heldout_size": 4},
        "dflash": {"block_size": 4, "num_layers": 1, "target_layer_ids": [0], "anchors": 4,
                   "cache_dir": str(tmp_path / "cache")},
        "train": {"output_dir": str(tmp_path / "run"), "max_steps": max_steps, "batch_size": 4, "lr": 1e-2,
                  "mixed_precision": "no", "save_every": save_every, "log_every": 1},
    }))
    return config


def train(config, *extra, patch=None):
    args = ["--config", str(config), *map(str, extra)]
    code = (patch or "") + f"\nimport sys, specheads.train.dflash as m\nsys.exit(m.main({args!r}))\n"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


def test_train_dflash_checkpoints_and_resumes_exactly(tmp_path, tiny_llama_dir):
    """A run killed inside its 2nd checkpoint (update 4's) and resumed from update 2 ends with the same weights
    as the run that was never stopped; the entry point runs as a user starts it."""
    straight = tmp_path / "straight"
    straight.mkdir()
    config = dflash_config(straight, tiny_llama_dir, max_steps=6)
    result = subprocess.run([sys.executable, str(REPO / "train" / "dflash.py"), "--config", str(config)],
                            capture_output=True, text=True, cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "held-out accuracy" in result.stdout
    evaluation = json.loads((straight / "run" / "eval.json").read_text())
    assert len(evaluation["top1"]) == 3
    done = DFlashDraft.from_pretrained(straight / "run" / "heads")
    assert done.config.block_size == 4 and done.config.target_layer_ids == [0]

    resumed = tmp_path / "resumed"
    resumed.mkdir()
    config = dflash_config(resumed, tiny_llama_dir, max_steps=6)
    killed = train(config, patch=KILL_IN_NTH_SAVE.format(n=3))
    assert killed.returncode == -9, killed.stdout + killed.stderr
    result = train(config, "--resume")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "step 2" in result.stdout, result.stdout
    again = DFlashDraft.from_pretrained(resumed / "run" / "heads")
    for name, tensor in done.state_dict().items():
        assert torch.equal(tensor, again.state_dict()[name]), name


def test_block_acceptance_is_what_decoding_from_each_anchor_accepts():
    """train/dflash.block_acceptance (the evaluation's chain acceptance) against a step-by-step recount: for each
    anchor a, the base's own logits for x_{a+j} from a forward over x_≤a+j-1, the drafted block's argmax compared
    with the base's greedy token (T=0) and Σ min(p, q) (T=1), multiplied along the block."""
    from specheads.train.acceptance import acceptance_result
    from specheads.train.dflash import block_acceptance, block_logits, choose_anchors

    model = deep_tiny_model()
    draft = fitted_draft(model, block_size=4, steps=30, prompts=8, num_layers=1)
    torch.manual_seed(7)  # fitted_draft's own text: some blocks are right
    prompts = torch.randint(3, VOCAB, (8, 6))[:3]
    with torch.no_grad():
        text = model.generate(prompts, max_new_tokens=30, do_sample=False, pad_token_id=0,
                              attention_mask=torch.ones_like(prompts))
        out = model.model(text, output_hidden_states=True)
    inputs = torch.stack([out.hidden_states[i] for i in draft.config.feature_layers])
    labels = text.clone()
    labels[:, :6] = -100  # the prompt is not an answer
    batch = {"input_ids": text, "labels": labels, "attention_mask": torch.ones_like(text)}
    anchors = choose_anchors(labels, 5, None)
    result = acceptance_result(block_acceptance(draft, model, batch, inputs, out.last_hidden_state, anchors), 3)

    with torch.no_grad():
        logits, _, trained = block_logits(draft, model, batch, inputs, anchors)
    t0, t1, n = torch.zeros(3, dtype=torch.float64), torch.zeros(3, dtype=torch.float64), 0
    for row in range(text.shape[0]):
        for col, a in enumerate(anchors[row].tolist()):
            if a < 0 or not trained[row, col].all():
                continue
            n += 1
            still0, still1 = 1.0, 1.0
            for j in range(1, 4):
                with torch.no_grad():
                    base = model(text[row: row + 1, : a + j]).logits[0, -1].double()
                drafted = logits[row, col, j - 1].double()
                still0 *= float(drafted.argmax() == base.argmax())
                still1 *= float(torch.minimum(drafted.softmax(-1), base.softmax(-1)).sum())
                t0[j - 1] += still0
                t1[j - 1] += still1
    assert n >= 6 and result["accept_positions"] == n
    assert result["accept_t0"] == pytest.approx((t0 / n).tolist(), abs=1e-9)
    assert result["accept_t1"] == pytest.approx((t1 / n).tolist(), abs=1e-5)
    assert 0 < result["accept_t0"][0] < 1 and 0 < result["accept_t1"][0] < 1  # not a vacuous all-0 / all-1 case


def test_one_batch_overfits_to_near_perfect_block_acceptance_and_no_block_sees_its_future():
    """The published-DFlash sanity check (REFERENCE §4b): trained on one batch, the drafter must reach near-perfect
    block accuracy *as decoding measures it* (block_acceptance, tested above against a step-by-step recount), so
    the training targets are the tokens decoding checks (an off-by-one learns well and accepts little). And a
    block's logits must not move when anything at or after its anchor's successor changes, in the context ids or
    in the base's states there (a leak gives acceptance ~1 in training and nothing when decoding)."""
    from specheads.train.acceptance import acceptance_result
    from specheads.train.dflash import block_acceptance, block_logits, choose_anchors, position_losses

    model = deep_tiny_model()
    torch.manual_seed(11)
    prompts = torch.randint(3, VOCAB, (4, 6))
    with torch.no_grad():
        text = model.generate(prompts, max_new_tokens=26, do_sample=False, pad_token_id=0,
                              attention_mask=torch.ones_like(prompts))
        out = model.model(text, output_hidden_states=True)
    labels = text.clone()
    labels[:, :6] = -100
    batch = {"input_ids": text, "labels": labels, "attention_mask": torch.ones_like(text)}
    draft = new_draft(model, block_size=4, num_layers=1).train()
    inputs = torch.stack([out.hidden_states[i] for i in draft.config.feature_layers])
    anchors = choose_anchors(labels, 64, None)  # every anchor of the batch
    before = acceptance_result(block_acceptance(draft.eval(), model, batch, inputs, out.last_hidden_state, anchors), 3)
    optimizer = torch.optim.AdamW(draft.train().parameters(), lr=3e-3)
    for _ in range(300):
        losses, _ = position_losses(*block_logits(draft, model, batch, inputs, anchors))
        optimizer.zero_grad()
        losses.sum().backward()
        optimizer.step()
    draft.eval()
    after = acceptance_result(block_acceptance(draft, model, batch, inputs, out.last_hidden_state, anchors), 3)
    assert after["accept_positions"] >= 60
    assert min(after["accept_t0"]) >= 0.95, after["accept_t0"]  # every block position, chained
    assert max(before["accept_t0"]) < 0.5  # not already there by chance

    # no leak: change everything after the anchor of one block (ids after it, states from it on)
    row, col = 1, 5
    a = int(anchors[row, col])
    with torch.no_grad():
        logits, _, _ = block_logits(draft, model, batch, inputs, anchors)
        changed_ids = text.clone()
        changed_ids[row, a + 1:] = (changed_ids[row, a + 1:] + 7) % VOCAB
        changed_inputs = inputs.clone()
        changed_inputs[:, row, a:] = torch.randn_like(changed_inputs[:, row, a:])
        moved, _, _ = block_logits(draft, model, {**batch, "input_ids": changed_ids}, changed_inputs, anchors)
    assert torch.equal(logits[row, col], moved[row, col])
    assert not torch.equal(logits[row, col + 1:], moved[row, col + 1:])  # later blocks do see that context


def test_default_target_layers_follow_the_published_rule():
    """REFERENCE §4b and the published Qwen3-8B-DFlash-b16 config (36 layers, 5 draft layers: [1, 9, 17, 25, 33])."""
    from specheads.heads.dflash import default_target_layer_ids

    assert default_target_layer_ids(36, 5) == [1, 9, 17, 25, 33]
    assert default_target_layer_ids(30, 5) == [1, 8, 14, 20, 27]  # SmolLM2-135M
    assert default_target_layer_ids(28, 5) == [1, 7, 13, 19, 25]  # Qwen2.5-1.5B
    assert default_target_layer_ids(30, 3) == [1, 14, 27]
    assert default_target_layer_ids(30, 1) == [15]
    assert default_target_layer_ids(2, 1) == [0] and default_target_layer_ids(3, 3) == [0, 1]  # tiny bases


def test_a_mask_token_the_answers_contain_is_warned_about():
    from specheads.data.tokenization import TokenizedConversation
    from specheads.train.dflash import warn_if_mask_is_in_the_answers

    class Names:
        def convert_ids_to_tokens(self, i):
            return f"tok{i}"

    examples = [TokenizedConversation(input_ids=[5, 7, 9, 7], labels=[-100, 7, 9, 7]),
                TokenizedConversation(input_ids=[3, 7], labels=[-100, 7])]
    with pytest.warns(UserWarning, match=r"default dflash.mask_token_id \(the last id\) 7 \('tok7'\) occurs 3 times"):
        warn_if_mask_is_in_the_answers(7, Names(), examples, None)
    with pytest.warns(UserWarning, match=r"^dflash.mask_token_id 9 \('tok9'\) occurs 1 time in"):
        warn_if_mask_is_in_the_answers(9, Names(), examples, 9)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_if_mask_is_in_the_answers(11, Names(), examples, 11)  # never used: silent

"""EAGLE drafts: format round trips, the training-time-test mask, dynamic trees, lossless decoding, training."""

import copy
import json
import subprocess
import sys
import dataclasses
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from conftest import synthetic_sharegpt, write_jsonl
from test_decoder import (VOCAB, chi_square_p_value, exact_joint_of_two_tokens, hf_greedy, sample_two_tokens,
                          tiny_model)

from specheads.heads import EagleConfig, EagleDraft
from specheads.inference.decoder import SamplingConfig, TreeDecoder
from specheads.inference.eagle import EagleCandidates, select_tree_nodes
from specheads.train.losses import soft_cross_entropy, unrolled_step_mask

REPO = Path(__file__).resolve().parent.parent


def deep_tiny_model(arch: str, **kwargs):
    """tiny_model with 6 layers, so EAGLE-3 fuses three distinct layers."""
    model = tiny_model(arch, **kwargs)
    values = model.config.to_dict()
    values.pop("layer_types", None)
    config = type(model.config)(**{**values, "num_hidden_layers": 6})
    torch.manual_seed(0)
    deeper = type(model)(config).to(model.dtype).eval()
    with torch.no_grad():
        deeper.lm_head.weight.mul_(8.0)
    return deeper


def fitted_draft(model, variant: str, steps: int = 150, layer: str | None = None, num_layers: int = 1, **sampling):
    """A draft trained for a moment on the model's own text (same unrolled loss as train/eagle.py); layer: as
    EagleConfig.for_base takes it (default a new draft's); num_layers: EAGLE-3's decoder layers."""
    from specheads.train.eagle import base_targets, unrolled_draft

    torch.manual_seed(7)
    prompts = torch.randint(3, VOCAB, (32, 6))
    with torch.no_grad():
        text = model.generate(prompts, max_new_tokens=30, do_sample=bool(sampling), pad_token_id=0,
                              attention_mask=torch.ones_like(prompts), **sampling)
        states = model.model(text, output_hidden_states=True).hidden_states
    config = EagleConfig.for_base(model.config, "tiny", variant=variant, draft_vocab_size=VOCAB - 8, layer=layer)
    draft = EagleDraft(dataclasses.replace(config, num_layers=num_layers))
    if variant == "eagle3":
        draft.set_vocab_mapping(torch.arange(8, VOCAB))  # ids 0..7 never drafted: exercises d2t
    draft = draft.to(model.dtype)
    inputs = torch.stack([states[i] for i in draft.config.feature_layers]) if variant == "eagle3" else None
    batch = {"input_ids": text, "labels": text, "attention_mask": torch.ones_like(text)}
    optimizer = torch.optim.AdamW(draft.parameters(), lr=3e-3)
    for _ in range(steps):
        outputs, target_features, valid = unrolled_draft(draft, model, batch, inputs, states[-1], 2)
        probs, _ = base_targets(draft, model, target_features)
        loss = sum(soft_cross_entropy(draft.logits(outputs[i][valid[i]], model.lm_head), probs[valid[i]]).mean()
                   for i in range(2))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return draft.eval()


# ---- format --------------------------------------------------------------------------------

def test_eagle3_vocabulary_mapping_round_trip(tmp_path):
    model = deep_tiny_model("llama", dtype=torch.float32)
    draft = EagleDraft(EagleConfig.for_base(model.config, "tiny", variant="eagle3", draft_vocab_size=10))
    target_ids = torch.tensor([40, 3, 7, 11, 12, 30, 31, 45, 46, 2])
    draft.set_vocab_mapping(target_ids)
    assert draft.draft_to_target(torch.arange(10)).tolist() == sorted(target_ids.tolist())
    draft.save_pretrained(tmp_path / "d", extra={"note": 1})
    assert not [p.name for p in (tmp_path / "d").iterdir() if p.name not in ("config.json", "model.safetensors")]
    loaded = EagleDraft.from_pretrained(tmp_path / "d", base_model=model)
    assert torch.equal(loaded.d2t, draft.d2t) and torch.equal(loaded.t2d, draft.t2d)
    assert loaded.t2d.sum() == 10 and loaded.t2d[target_ids].all()
    assert loaded.extra_config == {"note": 1}
    x = torch.randn(1, 4, 32)
    positions = torch.arange(4)[None]
    assert torch.equal(loaded(x, x, positions), draft(x, x, positions))
    with pytest.raises(ValueError, match="distinct"):
        draft.set_vocab_mapping(torch.tensor([1] * 10))


def test_draft_layer_is_the_base_architecture_and_loading_checks(tmp_path):
    model = deep_tiny_model("qwen2", dtype=torch.float32)
    draft = EagleDraft(EagleConfig.for_base(model.config, "tiny", variant="eagle1"))
    assert type(draft.layers[0]).__name__ == "Qwen2DecoderLayer"
    assert "fc.weight" in draft.state_dict() and draft.fc.weight.shape == (32, 64)
    assert not any("input_layernorm" in k for k in draft.state_dict())  # EAGLE-1: no input norm
    draft.save_pretrained(tmp_path / "d")
    other = tiny_model("llama", dtype=torch.float32)
    other.config.hidden_size = 16
    with pytest.raises(ValueError, match="hidden_size"):
        EagleDraft.from_pretrained(tmp_path / "d", base_model=other)
    weights = tmp_path / "d" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(ValueError, match="model.safetensors"):
        EagleDraft.from_pretrained(tmp_path / "d")


def test_unrolled_step_mask_by_hand():
    allowed = unrolled_step_mask(4, 0) == 0
    assert torch.equal(allowed, torch.ones(4, 4).tril().bool())
    allowed = unrolled_step_mask(4, 2) == 0  # keys: step 0 (4), step 1 (4), step 2 (4)
    # query t=3 of step 2 started at s=1: step-0 keys 0..1, step-1 key at 2, step-2 key at 3
    assert allowed[3].nonzero().flatten().tolist() == [0, 1, 4 + 2, 8 + 3]
    # t=0 < step: nothing real to see, only itself (no fully masked rows)
    assert allowed[0].nonzero().flatten().tolist() == [8]


# ---- dynamic trees -------------------------------------------------------------------------

def test_tree_selection_keeps_ancestors_and_refuses_orphans():
    parents = [-1, 0, 0, 1, 1, 3]
    depths = [0, 1, 1, 2, 2, 3]
    scores = [0.0, -0.1, -0.5, -0.2, -0.9, -0.3]
    assert select_tree_nodes(scores, depths, parents, 3) == [0, 1, 3, 5]
    assert select_tree_nodes(scores, depths, parents, 4) == [0, 1, 2, 3, 5]
    tie = [0.0, 0.0, -1.0, 0.0, -2.0, 0.0]  # a child may tie its parent (p = 1): shallower first
    assert select_tree_nodes(tie, depths, parents, 2) == [0, 1, 3]
    with pytest.raises(AssertionError, match="ancestor"):
        select_tree_nodes([0.0, -0.9, -0.5, -0.2, -0.9, -0.3], depths, parents, 2)
    assert select_tree_nodes(scores, depths, parents, 4, min_score=-0.25) == [0, 1, 3]  # below min_score: out
    assert select_tree_nodes(scores, depths, parents, 4, min_score=-0.05) == [0]


def test_min_prob_leaves_out_unlikely_nodes_and_stays_lossless():
    """A high min_prob gives smaller trees from fewer draft forwards, and the same greedy tokens."""
    model = deep_tiny_model("llama")
    draft = fitted_draft(model, "eagle3", steps=40)
    runs = {}
    for min_prob in (0.0, 0.03):
        source = EagleCandidates(draft, model, top_k=3, depth=4, total_tokens=14, min_prob=min_prob)
        sizes, forwards = [], [0]
        propose, forward = source.propose, draft.forward

        def recording(*args):
            tokens, buffers = propose(*args)
            sizes.append(buffers.num_nodes)
            return tokens, buffers

        def counting(*args, **kwargs):
            forwards[0] += 1
            return forward(*args, **kwargs)

        source.propose, draft.forward = recording, counting
        decoder = TreeDecoder(model, candidates=source)
        for case in range(3):
            torch.manual_seed(500 + case)
            prompt = torch.randint(3, VOCAB, (1, 6 + 2 * case))
            assert decoder.generate_ids(prompt, 30, eos_token_ids=[2]) == hf_greedy(model, prompt, 30), (min_prob, case)
        del draft.forward  # back to the class's forward
        runs[min_prob] = (sizes, forwards[0] / len(sizes))
    full, pruned = runs[0.0], runs[0.03]
    assert set(full[0]) == {14}
    assert max(pruned[0]) > 1 and sum(pruned[0]) < 0.8 * sum(full[0]), pruned[0]
    assert pruned[1] < full[1], "unlikely frontiers must not be expanded (fewer draft forwards per step)"


@pytest.mark.parametrize("variant", ["eagle1", "eagle3"])
def test_dynamic_tree_contains_the_ancestors_of_every_node(variant):
    model = deep_tiny_model("llama")
    source = EagleCandidates(fitted_draft(model, variant, steps=20), model, top_k=3, depth=4, total_tokens=14)
    decoder = TreeDecoder(model, candidates=source)
    seen = []
    original = source.propose

    def recording(*args):
        tokens, buffers = original(*args)
        seen.append(buffers)
        return tokens, buffers

    source.propose = recording
    decoder.generate_ids(torch.randint(3, VOCAB, (1, 7)), 20)
    assert seen and all(b.num_nodes == 14 for b in seen)
    for buffers in seen:
        parent = buffers.parent.tolist()
        for node in range(1, buffers.num_nodes):
            chain, p = {node}, parent[node]
            while p != -1:
                assert 0 <= p < node
                chain.add(p)
                p = parent[p]
            assert 0 in chain
            # the verify mask lets a node see exactly itself and its ancestors
            assert set(buffers.attention_mask[node].nonzero().flatten().tolist()) == chain
        assert int(buffers.depths.max()) <= 4


def reference_eagle2_tree(source, root: int):
    """A slow oracle of EagleCandidates.propose: the draft is run on each node's path alone (a copy of the committed
    cache, one token at a time, a plain causal mask), then expanded and pruned by the EAGLE-2 rule."""
    committed_cache = copy.deepcopy(source.cache)

    def draft_output(path: list[int]) -> torch.Tensor:
        cache, feature = copy.deepcopy(committed_cache), source.last_output
        for j, token in enumerate(path):
            visible = torch.ones(1, source.committed + j + 1, dtype=torch.bool)
            feature = source.draft(feature[None, None], source.embed(torch.tensor([[token]])),
                                   torch.tensor([[source.committed + j]]), source._mask(visible), cache)[0, -1]
        return feature

    tokens, parents, scores, depths = [root], [-1], [0.0], [0]

    def add_children(node: int, output: torch.Tensor) -> list[int]:
        logp, ids = source._top_children(output[None])
        first = len(tokens)
        for lp, token in zip(logp[0].tolist(), ids[0].tolist()):
            tokens.append(token), parents.append(node), scores.append(scores[node] + lp)
            depths.append(depths[node] + 1)
        return list(range(first, len(tokens)))

    def path_of(node: int) -> list[int]:
        return [] if node == 0 else path_of(parents[node]) + [tokens[node]]

    frontier = [n for n in add_children(0, source.last_output) if scores[n] >= source.min_score]
    for _ in range(1, source.depth):
        children = [c for node in frontier for c in add_children(node, draft_output(path_of(node)))]
        best = sorted(children, key=lambda c: (-scores[c], c))[: source.top_k]
        frontier = [c for c in best if scores[c] >= source.min_score]
    chosen = select_tree_nodes(scores, depths, parents, source.total_tokens - 1, source.min_score)
    return [tokens[n] for n in chosen], [-1] + [chosen.index(parents[n]) for n in chosen[1:]]


def check_trees_against_reference(source) -> list[int]:
    """Make every tree `source` proposes be checked against reference_eagle2_tree; -> each checked tree's depth."""
    original, depths = source.propose, []

    def checked(root, hidden, context):
        source._drop_tree_entries()
        expected = reference_eagle2_tree(source, root)
        tokens, buffers = original(root, hidden, context)
        assert (tokens.tolist(), buffers.parent.tolist()) == expected
        depths.append(int(buffers.depths.max()))
        return tokens, buffers

    source.propose = checked
    return depths


@pytest.mark.parametrize("variant", ["eagle1", "eagle3"])
def test_dynamic_tree_equals_drafting_each_path_alone(variant):
    """The draft's tree pass (one forward per level, each node seeing the committed entries and its own ancestors at
    its own position) must draft exactly what the draft says for each node's path run on its own."""
    model = deep_tiny_model("llama")
    draft = fitted_draft(model, variant, steps=20)
    # 2 x 4 keeps every node (1 + 2 + 3 x 4 = 15), so the deepest level is compared; 3 x 4 into 10 prunes.
    for top_k, total_tokens, min_prob in [(2, 15, 0.0), (3, 10, 0.001)]:
        source = EagleCandidates(draft, model, top_k=top_k, depth=4, total_tokens=total_tokens, min_prob=min_prob)
        depths = check_trees_against_reference(source)
        torch.manual_seed(5)
        TreeDecoder(model, candidates=source).generate_ids(torch.randint(3, VOCAB, (1, 9)), 12)
        assert depths and min(depths) >= 2, depths
        if total_tokens == 15:
            assert set(depths) == {4}, depths


def test_decoding_runs_the_draft_with_sdpa_and_the_same_outputs_as_eager():
    """EagleCandidates switches the draft to SDPA (faster on CPUs); a draft as built or loaded (training) stays eager.
    Under a tree mask both kernels give the same draft outputs (fp64, to eager's fp32 softmax)."""
    from transformers import DynamicCache

    from specheads.inference.tree import additive_mask

    model = deep_tiny_model("llama")
    draft = fitted_draft(model, "eagle3", steps=2)
    attention = draft.layers[0].self_attn.config
    assert attention._attn_implementation == "eager"
    torch.manual_seed(3)
    features, embeddings = torch.randn(1, 7, 32, dtype=model.dtype), torch.randn(1, 7, 32, dtype=model.dtype)
    visible = torch.ones(7, 7, dtype=torch.bool).tril()
    visible[5, 4] = visible[6, 5] = False  # two tree branches at the end
    positions = torch.tensor([[0, 1, 2, 3, 4, 5, 5]])
    outputs = {}
    for implementation in ["eager", "sdpa"]:
        draft.set_attention(implementation)
        with torch.no_grad():
            outputs[implementation] = draft(features, embeddings, positions,
                                            additive_mask(visible, model.dtype)[None, None], DynamicCache())
    # eager takes its softmax in fp32 (~3e-8 apart here); a mask read wrongly would differ by O(1)
    torch.testing.assert_close(outputs["sdpa"], outputs["eager"], rtol=1e-6, atol=1e-6)
    draft.set_attention("eager")
    EagleCandidates(draft, model, top_k=2, depth=3, total_tokens=6)
    assert attention._attn_implementation == "sdpa"


# ---- lossless decoding -----------------------------------------------------------------------

@pytest.mark.parametrize("arch,variant", [("llama", "eagle1"), ("qwen2", "eagle1"), ("llama", "eagle3"),
                                          ("qwen2", "eagle3")])
def test_eagle_greedy_equals_hf_generate_fp64(arch, variant):
    model = deep_tiny_model(arch)
    decoder = TreeDecoder(model, candidates=EagleCandidates(fitted_draft(model, variant), model,
                                                             top_k=4, depth=4, total_tokens=16))
    steps, tokens = greedy_equals_hf(decoder, model, cases=5, new_tokens=40)
    assert tokens > 1.5 * steps, "drafted tokens must get accepted for the test to mean anything"


def greedy_equals_hf(decoder, model, cases: int, new_tokens: int) -> tuple[int, int]:
    """Decode `cases` seeded prompts, each asserted equal to HF greedy; -> (decoding steps, tokens accepted)."""
    steps = tokens = 0
    for case in range(cases):
        torch.manual_seed(300 + case)
        prompt = torch.randint(3, VOCAB, (1, 5 + 3 * case))
        assert decoder.generate_ids(prompt, new_tokens, eos_token_ids=[2]) == hf_greedy(model, prompt, new_tokens), case
        steps += len(decoder.stats.accepted_lengths)
        tokens += sum(decoder.stats.accepted_lengths)
    return steps, tokens


def test_eagle_sampling_matches_base_distribution():
    """First two sampled tokens with an EAGLE-2 tree vs the exact joint distribution of the base."""
    model = deep_tiny_model("llama")
    with torch.no_grad():
        model.lm_head.weight.mul_(3.0 / 8.0 * 3.0)
    draft = fitted_draft(model, "eagle1", temperature=0.8, top_p=0.9)
    decoder = TreeDecoder(model, candidates=EagleCandidates(draft, model, top_k=4, depth=2, total_tokens=10))
    prompt = torch.tensor([[5, 9, 11, 3]])
    sampling = SamplingConfig(temperature=0.8, top_p=0.9, seed=0)
    joint = exact_joint_of_two_tokens(model, prompt, sampling)
    n = 1200
    counts, drafted = sample_two_tokens(decoder, prompt, sampling, n)
    assert drafted > 0.2 * n, "the draft must get accepted for the test to mean anything"
    expected = joint.flatten().double()
    assert (expected * n >= 5).sum() >= 8, "the distribution must have enough outcomes to test"
    assert chi_square_p_value(counts, expected, n) > 1e-3


def test_sampled_eagle_tree_matches_base_distribution_and_is_greedy_at_t0():
    """eagle*_sampled: children drawn from the draft at T > 0 and verified by rejection sampling without
    replacement keep the base's joint of the first two tokens; at T = 0 the tree is the draft's top-k and the
    output is the base's greedy tokens."""
    from specheads.inference.eagle import SampledEagleCandidates

    model = deep_tiny_model("llama")
    with torch.no_grad():
        model.lm_head.weight.mul_(3.0 / 8.0 * 3.0)
    draft = fitted_draft(model, "eagle1", temperature=0.8, top_p=0.9)
    source = SampledEagleCandidates(draft, model, top_k=3, width=2, depth=2)
    decoder = TreeDecoder(model, candidates=source)
    prompt = torch.tensor([[5, 9, 11, 3]])
    sampling = SamplingConfig(temperature=0.8, top_p=0.9, seed=0)
    joint = exact_joint_of_two_tokens(model, prompt, sampling)
    n = 1200
    counts, drafted = sample_two_tokens(decoder, prompt, sampling, n)
    assert drafted > 0.2 * n, "the draft must get accepted for the test to mean anything"
    assert source.proposals, "the children must have been sampled (their q kept for the acceptance rule)"
    expected = joint.flatten().double()
    assert (expected * n >= 5).sum() >= 8, "the distribution must have enough outcomes to test"
    assert chi_square_p_value(counts, expected, n) > 1e-3

    steps = tokens = 0
    for case in range(3):
        torch.manual_seed(500 + case)
        prompt = torch.randint(3, VOCAB, (1, 6 + 2 * case))
        assert decoder.generate_ids(prompt, 30, eos_token_ids=[2]) == hf_greedy(model, prompt, 30), case
        steps += len(decoder.stats.accepted_lengths)
        tokens += sum(decoder.stats.accepted_lengths)
    assert tokens > 1.3 * steps, "drafted tokens must get accepted for the test to mean anything"


# ---- training ------------------------------------------------------------------------------

@pytest.mark.parametrize("variant", ["eagle1", "eagle3"])
def test_train_eagle_end_to_end_with_feature_cache(tmp_path, tiny_llama_dir, variant):
    data = tmp_path / "conversations.jsonl"
    write_jsonl(data, synthetic_sharegpt(24))
    config = tmp_path / "eagle.yaml"
    config.write_text(json.dumps({
        "model": {"name": str(tiny_llama_dir), "dtype": "fp32"},
        "data": {"dataset": str(data), "max_length": 64, "heldout_size": 4},
        "eagle": {"variant": variant, "draft_vocab_size": 500, "aux_layer_ids": [0, 1, 1], "ttt_steps": 2,
                  "eval_steps": 3, "cache_dir": str(tmp_path / "cache"),
                  **({"feature_loss_weight": 1.0, "token_loss_weight": 0.1, "input_noise": 0.1}
                     if variant == "eagle1" else {"greedy_target_weight": 0.5})},
        "train": {"output_dir": str(tmp_path / "run"), "epochs": 2, "batch_size": 4, "lr": 1e-2,
                  "mixed_precision": "no", "save_every": 3},
    }))
    result = subprocess.run([sys.executable, str(REPO / "train" / "eagle.py"), "--config", str(config)],
                            capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "held-out accuracy" in result.stdout
    evaluation = json.loads((tmp_path / "run" / "eval.json").read_text())
    assert len(evaluation["top1"]) == 3
    draft = EagleDraft.from_pretrained(tmp_path / "run" / "heads")
    assert draft.config.variant == variant
    caches = {p.name.split("-")[0]: len(list(p.glob("*.safetensors"))) for p in (tmp_path / "cache").iterdir()}
    assert caches == {"train": 20, "heldout": 4}  # one file per example, computed once, reused in epoch 2


def test_cached_features_equal_online_features(tmp_path, tiny_llama_dir):
    from specheads.data.models import load_base_model, load_tokenizer
    from specheads.data.tokenization import pad_batch, tokenize_conversation
    from specheads.data.sharegpt import normalise
    from specheads.train.config import load_config
    from specheads.train.eagle import EagleTrainConfig
    from specheads.train.features import FeatureSource

    config = tmp_path / "c.yaml"
    config.write_text(f"model: {{name: {tiny_llama_dir}, dtype: fp32}}\neagle: {{cache_dir: {tmp_path / 'cache'}}}\n")
    cfg = load_config(EagleTrainConfig, config)
    base = load_base_model(cfg.model.name, "fp32")
    tokenizer = load_tokenizer(cfg.model.name)
    examples = [tokenize_conversation(tokenizer, normalise(r, i).messages, 64) for i, r in enumerate(synthetic_sharegpt(3))]
    batch = pad_batch(examples, tokenizer.pad_token_id)
    def source(cfg):
        return FeatureSource(base, cfg.model.name, asdict(cfg.data), [0, 1], "train", cfg.eagle.cache_dir)

    cached = source(cfg)
    first = cached(batch, [0, 1, 2])  # computes and writes
    again = cached(batch, [0, 1, 2])  # reads back (bf16 on disk)
    lengths = batch["attention_mask"].sum(1)
    for row, n in enumerate(lengths.tolist()):
        torch.testing.assert_close(again[1][row, :n], first[1][row, :n], atol=2e-2, rtol=2e-2)
        torch.testing.assert_close(again[0][:, row, :n], first[0][:, row, :n], atol=2e-2, rtol=2e-2)
    cfg.data.max_length = 99  # other data settings -> another cache folder, never the stale one
    assert source(cfg).directory != cached.directory
    # a data file regenerated at the same path (e.g. a new self-distillation run) -> another cache folder
    data = tmp_path / "answers.jsonl"
    data.write_text('{"conversations": []}\n')
    cfg.data.dataset = str(data)
    before = source(cfg).directory
    data.write_text('{"conversations": [], "id": "regenerated"}\n')
    assert source(cfg).directory != before
    # Medusa reads only the last state (no layer stack); a different layer list is a different cache
    medusa = FeatureSource(base, cfg.model.name, asdict(cfg.data), [], "train", cfg.eagle.cache_dir)
    assert medusa.directory != cached.directory
    medusa_last, online_last = medusa(batch, [0, 1, 2])[1], cached._compute(batch)[1]
    for row, n in enumerate(lengths.tolist()):  # padding is zeros in the cache
        torch.testing.assert_close(medusa_last[row, :n], online_last[row, :n], atol=2e-2, rtol=2e-2)
    # ... but with the same model, data and split, Medusa reads the last states of the EAGLE cache: no forward
    same_data = load_config(EagleTrainConfig, config)
    reader = FeatureSource(base, same_data.model.name, asdict(same_data.data), [], "train", same_data.eagle.cache_dir)
    assert reader.other_directories == [cached.directory]
    reader._compute = None  # calling the base would fail
    inputs, last = reader(batch, [0, 1, 2])
    assert inputs.shape[0] == 0 and not list(reader.directory.glob("*.safetensors"))
    torch.testing.assert_close(last, again[1])


@pytest.mark.parametrize("combine", ["merged", "lookup_first", "by_match"])
def test_eagle_with_prompt_lookup_is_lossless(combine):
    from specheads.inference.candidates import (FallbackCandidates, MergedCandidates, PromptLookupCandidates,
                                                lookup_with_heads)

    model = deep_tiny_model("llama")
    eagle = EagleCandidates(fitted_draft(model, "eagle3", steps=40), model, top_k=3, depth=3, total_tokens=8)
    lookup = PromptLookupCandidates(3, 5)
    source = {"merged": lambda: MergedCandidates(eagle, lookup),
              "lookup_first": lambda: FallbackCandidates(lookup, eagle),
              "by_match": lambda: lookup_with_heads(eagle, trusted_tokens=5, short_match_tokens=3)}[combine]()
    decoder = TreeDecoder(model, candidates=source)
    for case in range(3):
        torch.manual_seed(400 + case)
        prompt = torch.randint(3, VOCAB, (1, 6 + 2 * case))
        assert decoder.generate_ids(prompt, 40, eos_token_ids=[2]) == hf_greedy(model, prompt, 40), case
        # the draft read every accepted position, also on the steps where lookup's chain was verified instead
        committed = prompt.shape[1] + sum(decoder.stats.accepted_lengths)  # prefill, then every step's tokens
        assert eagle.committed == committed == eagle.cache.get_seq_length(), case
    if combine != "merged":
        assert min(source.steps_by_source) > 0


def test_train_eagle_from_a_saved_draft(tmp_path, tiny_llama_dir):
    """eagle.init_draft starts from the saved weights and vocabulary mapping; a draft of another shape is refused."""
    data = tmp_path / "conversations.jsonl"
    write_jsonl(data, synthetic_sharegpt(12))

    def train(name, lr, **eagle):
        config = tmp_path / f"{name}.yaml"
        config.write_text(json.dumps({
            "model": {"name": str(tiny_llama_dir), "dtype": "fp32"},
            "data": {"dataset": str(data), "max_length": 48, "heldout_size": 2},
            "eagle": {"variant": "eagle3", "draft_vocab_size": 500, "aux_layer_ids": [0, 1, 1], "ttt_steps": 2,
                      "eval_steps": 2, "cache_dir": str(tmp_path / "cache"), **eagle},
            "train": {"output_dir": str(tmp_path / name), "epochs": 1, "batch_size": 4, "lr": lr,
                      "mixed_precision": "no"},
        }))
        return subprocess.run([sys.executable, str(REPO / "train" / "eagle.py"), "--config", str(config)],
                              capture_output=True, text=True, cwd=REPO)

    first = train("first", 1e-2)
    assert first.returncode == 0, first.stdout + first.stderr
    saved = tmp_path / "first" / "heads"
    again = train("again", 1e-30, init_draft=str(saved))  # an lr too small to move any weight: they come back unchanged
    assert again.returncode == 0, again.stdout + again.stderr
    before = EagleDraft.from_pretrained(saved).state_dict()
    after = EagleDraft.from_pretrained(tmp_path / "again" / "heads").state_dict()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)

    refused = train("refused", 1e-2, init_draft=str(saved), draft_vocab_size=400)
    assert refused.returncode != 0
    assert "eagle.init_draft" in refused.stderr and "draft_vocab_size=500" in refused.stderr

    # eagle.head_from_base: a new draft's lm_head is the base's lm_head rows of its draft vocabulary
    headed = train("headed", 1e-30, head_from_base=True)
    assert headed.returncode == 0, headed.stdout + headed.stderr
    base = AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32)
    draft = EagleDraft.from_pretrained(tmp_path / "headed" / "heads")
    rows = draft.draft_to_target(torch.arange(500))
    torch.testing.assert_close(draft.lm_head.weight.float(), base.lm_head.weight[rows], rtol=0, atol=0)
    fresh = EagleDraft.from_pretrained(saved)
    assert not torch.equal(fresh.lm_head.weight.float(), base.lm_head.weight[fresh.draft_to_target(torch.arange(500))])
    both = train("both", 1e-2, init_draft=str(saved), head_from_base=True)
    assert both.returncode != 0 and "eagle.head_from_base" in both.stderr


def test_head_from_base_reads_out_through_the_base_lm_head():
    """A draft started with head_from_base scores its draft vocabulary with the base's own lm_head rows, in the
    d2t order (ids 0..7 left out), its output norm left at ones; EAGLE-1 drafts are refused."""
    model = deep_tiny_model("qwen2")
    config = EagleConfig.for_base(model.config, "tiny", variant="eagle3", draft_vocab_size=VOCAB - 8)
    draft = EagleDraft(config).to(model.dtype)
    draft.set_vocab_mapping(torch.arange(8, VOCAB))
    draft.head_from_base(model)
    hidden = torch.randn(5, model.config.hidden_size, dtype=model.dtype)
    scale = hidden.float().pow(2).mean(-1, keepdim=True).add(draft.norm.variance_epsilon).rsqrt()
    expected = model.lm_head((hidden.float() * scale).to(model.dtype))[:, 8:]
    torch.testing.assert_close(draft.logits(hidden), expected)
    eagle1 = EagleDraft(EagleConfig.for_base(model.config, "tiny", variant="eagle1"))
    with pytest.raises(ValueError, match="EAGLE-3"):
        eagle1.head_from_base(model)


def test_a_two_layer_eagle3_draft_decodes_losslessly_and_is_refused_by_engine_formats(tmp_path):
    """eagle.num_layers=2 (the ablation's lever): the second layer is a plain decoder layer with its own slot in the
    draft's KV cache. Its tree pass must draft exactly what each path drafts alone (a second layer reading the
    first layer's cache slot, or none, would not), greedy decoding stays the base's, the layer count survives
    save/load, and engine formats (one layer) refuse it by name."""
    from specheads.heads.formats import FORMATS

    model = deep_tiny_model("llama")
    draft = fitted_draft(model, "eagle3", num_layers=2)
    assert len(draft.layers) == 2 and draft.layers[1].self_attn.layer_idx == 1
    assert draft.layers[1].self_attn.q_proj.in_features == 32  # the later layer reads H, not [emb, feature]
    source = EagleCandidates(draft, model, top_k=2, depth=4, total_tokens=15)
    checked_trees = check_trees_against_reference(source)
    steps, tokens = greedy_equals_hf(TreeDecoder(model, candidates=source), model, cases=3, new_tokens=30)
    assert checked_trees and tokens > 1.5 * steps, "drafted tokens must get accepted for the test to mean anything"
    draft.save_pretrained(tmp_path / "two")
    loaded = EagleDraft.from_pretrained(tmp_path / "two")
    assert loaded.config.num_layers == 2
    torch.testing.assert_close(loaded.state_dict()["layers.1.mlp.up_proj.weight"].to(model.dtype),
                               draft.state_dict()["layers.1.mlp.up_proj.weight"])
    with pytest.raises(ValueError, match=r"2 decoder layers \(eagle.num_layers\).*holds one"):
        FORMATS["vllm-eagle3"].export(tmp_path / "two", tmp_path / "out")
    assert not (tmp_path / "out").exists()
    with pytest.raises(ValueError, match="num_layers"):
        EagleConfig(variant="eagle1", hidden_size=32, vocab_size=VOCAB, num_layers=2, layer_config={"model_type": "llama"})

"""Batched decoding: every row equals HF's batched greedy `generate` (fp64, three architectures)."""

import pytest
import torch

from test_decoder import TREE, VOCAB, fitted_heads, tiny_model

from specheads.inference.batched import BatchedTreeDecoder
from specheads.inference.candidates import PromptLookupCandidates


def hf_batched_greedy(model, prompts, max_new_tokens, eos=2):
    """HF `generate` on the left-padded batch; each row's new tokens up to and including its first EOS."""
    width = max(len(p) for p in prompts)
    ids = torch.zeros((len(prompts), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt):] = torch.tensor(prompt)
        mask[row, width - len(prompt):] = 1
    out = model.generate(ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=eos,
                         pad_token_id=0)[:, width:].tolist()
    return [row[: row.index(eos) + 1] if eos in row else row for row in out]


def prompts_of(lengths, seed):
    torch.manual_seed(seed)
    return [torch.randint(3, VOCAB, (n,)).tolist() for n in lengths]


@pytest.mark.parametrize("arch", ["llama", "qwen2", "mistral"])
def test_batched_medusa_equals_hf_batched_greedy_fp64(arch):
    model = tiny_model(arch)
    decoder = BatchedTreeDecoder(model, fitted_heads(model), TREE)
    for case in range(3):
        prompts = prompts_of([5, 11, 7, 16, 3][: 2 + case], 200 + case)
        assert decoder.generate(prompts, 40, eos_token_ids=[2]) == hf_batched_greedy(model, prompts, 40), case
    new = sum(len(r) for r in decoder.generate(prompts, 40, eos_token_ids=[2]))
    assert new > 1.3 * decoder.base_forwards, "drafted tokens must be accepted, not only bonus tokens"


def test_batched_plain_and_prompt_lookup_rows_leave_early():
    model = tiny_model("llama")
    prompts = prompts_of([4, 9, 6, 12], 300)
    prompts[1] = prompts[1] + prompts[1]  # something to look up
    expected = hf_batched_greedy(model, prompts, 30)
    assert BatchedTreeDecoder(model).generate(prompts, 30, eos_token_ids=[2]) == expected
    lookup = BatchedTreeDecoder(model, candidates=PromptLookupCandidates(3, 6))
    assert lookup.generate(prompts, 30, eos_token_ids=[2]) == expected
    # a budget that ends inside accepted blocks, and a row that stops at EOS before the others
    assert lookup.generate(prompts, 7, eos_token_ids=[2]) == hf_batched_greedy(model, prompts, 7)
    # a row that stops at EOS while the others go on: call a token row 0 says early "EOS"
    eos = expected[0][5]
    stopped = hf_batched_greedy(model, prompts, 30, eos=eos)
    assert len({len(row) for row in stopped}) > 1 and min(len(row) for row in stopped) <= 6
    assert lookup.generate(prompts, 30, eos_token_ids=[eos]) == stopped


def assert_rows_decode_as_alone(decoder, alone, prompts, max_new_tokens, eos=2):
    """Rows equal HF batched greedy, and each row takes as many base forwards as decoded alone: the tokens alone
    cannot show that a row's draft followed its own prompt and accepted tokens (verification makes them right
    whatever the draft proposes). -> the rows."""
    rows = decoder.generate(prompts, max_new_tokens, eos_token_ids=[eos])
    assert rows == hf_batched_greedy(decoder.model, prompts, max_new_tokens, eos=eos)
    single_forwards = []
    for prompt, row in zip(prompts, rows):
        assert alone.generate_ids(torch.tensor([prompt]), max_new_tokens, eos_token_ids=[eos]) == row
        single_forwards.append(alone.stats.base_forwards)
    assert decoder.forwards_by_row == single_forwards
    assert decoder.row_forwards == sum(single_forwards)
    return rows


def test_batched_medusa_with_prompt_lookup_decodes_each_row_as_alone_fp64():
    from specheads.inference.candidates import MedusaCandidates, lookup_with_heads
    from specheads.inference.decoder import TreeDecoder

    model = tiny_model("llama")
    medusa = MedusaCandidates(fitted_heads(model), TREE, model.get_output_embeddings())
    combined = lookup_with_heads(medusa, max_ngram=2)
    decoder = BatchedTreeDecoder(model, candidates=combined)
    alone = TreeDecoder(model, candidates=lookup_with_heads(medusa, max_ngram=2))
    prompts = prompts_of([5, 11, 7, 9], 500)
    prompts[2] = prompts[2] * 3  # something to look up
    assert_rows_decode_as_alone(decoder, alone, prompts, 40)
    trusted_lookups, heads_trees = combined.steps_by_source  # the rows' copies count into the source handed in
    assert trusted_lookups > 0 and heads_trees > 0, "both the lookup chain and the heads' tree must be verified"
    assert combined.steps_by_source == alone.candidates.steps_by_source


@pytest.mark.parametrize("arch,variant,lookup", [("llama", "eagle3", False), ("qwen2", "eagle1", False),
                                                 ("llama", "eagle3", True)])
def test_batched_eagle_equals_hf_batched_greedy_fp64(arch, variant, lookup):
    """Each row's draft must follow its own prompt and accepted tokens exactly as a single-row decode does, alone
    and inside prompt lookup (lookup_with_heads: the draft is committed whichever source proposed the tokens)."""
    from test_eagle import deep_tiny_model, fitted_draft

    from specheads.inference.candidates import lookup_with_heads
    from specheads.inference.decoder import TreeDecoder
    from specheads.inference.eagle import EagleCandidates

    model = deep_tiny_model(arch)
    draft = fitted_draft(model, variant)

    def source_of(eagle):
        return lookup_with_heads(eagle, max_ngram=2) if lookup else eagle

    eagle = EagleCandidates(draft, model, top_k=4, depth=4, total_tokens=12)
    decoder = BatchedTreeDecoder(model, candidates=source_of(eagle))
    alone = TreeDecoder(model, candidates=source_of(EagleCandidates(draft, model, top_k=4, depth=4, total_tokens=12)))
    new = forwards = 0
    for case in range(4):
        prompts = prompts_of([5, 11, 7, 16][: 2 + min(case, 2)], 400 + case)
        if lookup:
            prompts[1] = prompts[1] * 2  # something to look up
        eos = 2
        if case == 3:  # call "EOS" a token that ends one row early while another row goes on
            full = hf_batched_greedy(model, prompts, 40)
            eos = next(t for t in full[1][:5] if any(t not in row[:10] for row in full))
        rows = assert_rows_decode_as_alone(decoder, alone, prompts, 40, eos)
        if case == 3:
            assert min(len(row) for row in rows) <= 5 and max(len(row) for row in rows) > 10
        new, forwards = new + sum(len(r) for r in rows), forwards + decoder.row_forwards
    assert new > 1.5 * forwards, "drafted tokens must be accepted, not only bonus tokens"
    # the source handed in stays unused: every row decoded with a copy of its own
    assert eagle.committed == 0 and eagle.last_output is None
    if lookup:  # both the trusted lookup chain and the draft's tree (alone or merged) were verified
        assert min(decoder.candidates.steps_by_source) > 0
        assert decoder.candidates.steps_by_source == alone.candidates.steps_by_source


def test_batched_refuses_sources_it_cannot_copy_per_row():
    from specheads.inference.candidates import MergedCandidates, PromptLookupCandidates
    from specheads.inference.lookahead import LookaheadCandidates

    class CountingLookup(PromptLookupCandidates):
        """Keeps per-generation state, with no way to copy it per row."""

        stateful, copyable = True, False  # what such a source declares (inference/source.py)

        def begin(self, *unused):
            self.calls = 0

    model = tiny_model("llama")
    with pytest.raises(ValueError, match="a copy of its own"):
        BatchedTreeDecoder(model, candidates=LookaheadCandidates(window=3, ngram=2, pool=2))
    with pytest.raises(ValueError, match="CountingLookup .*a copy of its own"):  # inside a combination
        BatchedTreeDecoder(model, candidates=MergedCandidates(CountingLookup(), PromptLookupCandidates()))


def test_bench_batch_mode_matches_hf_batched_generate(tmp_path, tiny_llama_dir):

    from conftest import write_jsonl
    from specheads.data.models import load_base_model
    from specheads.heads import MedusaConfig, MedusaHeads

    from specheads.inference import bench

    base = load_base_model(str(tiny_llama_dir), "fp32")
    torch.manual_seed(0)
    heads = MedusaHeads(MedusaConfig.for_base(base.config, str(tiny_llama_dir), num_heads=2))
    heads.save_pretrained(tmp_path / "heads", extra={"tree": [[0], [1], [0, 0]]})
    questions = tmp_path / "q.jsonl"
    write_jsonl(questions, [{"question_id": f"q{i}", "category": "qa", "turns": [f"Say {w} {w} {w} again."]}
                            for i, w in enumerate(["alpha", "beta", "gamma", "delta", "omega"])])
    results = bench.main(["--model", str(tiny_llama_dir), "--heads", str(tmp_path / "heads"), "--questions",
                          str(questions), "--methods", "baseline,plain,medusa,medusa_pld,pld", "--batch-size", "2",
                          "--max-new-tokens", "12", "--dtype", "fp32", "--out", str(tmp_path / "bench")])
    assert results["batch_size"] == 2 and results["questions"] == 5
    for method in ("plain", "medusa", "medusa_pld", "pld"):
        assert results["methods"][method]["overall"]["greedy_match"] == 1.0, method
    assert results["methods"]["plain"]["overall"]["tau"] == pytest.approx(1.0)


def test_keep_accepted_paths_moves_each_rows_nodes_to_the_front_of_the_block():
    from transformers import DynamicCache

    from specheads.inference.kv_cache import keep_accepted_paths

    cache = DynamicCache()
    prefix, width = 3, 5
    slot = torch.arange(prefix + width, dtype=torch.float64)  # slot i holds the value i in every row
    keys = slot[None, None, :, None].repeat(2, 1, 1, 4)
    cache.update(keys.clone(), -keys.clone(), 0)
    keep_accepted_paths(cache, width, [torch.tensor([0, 2, 4]), torch.tensor([0, 1])])
    layer = cache.layers[0]
    assert layer.keys.shape[-2] == prefix + 3, "the block is cut to the longest accepted path"
    assert layer.keys[0, 0, :, 0].tolist() == [0, 1, 2, 3, 5, 7]
    assert layer.keys[1, 0, :prefix + 2, 0].tolist() == [0, 1, 2, 3, 4]
    assert torch.equal(layer.values, -layer.keys)

"""The seed methods as decoders: draft-model speculative sampling, lookahead and prompt lookup.

Greedy output must equal HF greedy `generate` token for token (fp64 tiny random models); sampling
must keep the base distribution (chi-square, and the test must catch a wrong rule); edge cases stop
exactly where plain decoding stops.
"""

import copy
import json

import pytest
import torch
from test_decoder import VOCAB, chi_square_p_value, tiny_model

from specheads.inference.acceptance import speculative_accept
from specheads.inference.candidates import PromptLookupCandidates
from specheads.inference.decoder import SamplingConfig, TreeDecoder
from specheads.inference.lookahead import LookaheadCandidates
from specheads.inference.speculative import DraftModelCandidates, best_gamma, expected_tokens_per_step, self_draft
from specheads.inference.tree import build_tree_buffers, buffers_from_parents


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models gain nothing from threads, and on a busy machine two threads wait on each other."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def hf_greedy(model, prompt, max_new_tokens, eos=2):
    out = model.generate(prompt, max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=eos,
                         pad_token_id=0, attention_mask=torch.ones_like(prompt))
    return out[0, prompt.shape[1]:].tolist()


SOURCES = {
    "sps": lambda model: DraftModelCandidates(self_draft(model, 1), gamma=3),
    "sps_auto": lambda model: DraftModelCandidates(self_draft(model, 1), gamma="auto", max_gamma=6),
    "sps_other_draft": lambda model: DraftModelCandidates(tiny_model("llama", seed=5), gamma=2),
    "lookahead": lambda model: LookaheadCandidates(window=5, ngram=4, pool=5),
    "lookahead_small": lambda model: LookaheadCandidates(window=3, ngram=2, pool=2),
    "pld": lambda model: PromptLookupCandidates(max_ngram=3, num_tokens=5),
}
# every method on llama; the main ones on the other architectures too
GREEDY_CASES = [("llama", m) for m in SOURCES] + [(a, m) for a in ("qwen2", "mistral") for m in ("sps", "lookahead", "pld")]


# ---- greedy: lossless against HF generate -------------------------------------------------------

@pytest.mark.parametrize("arch,method", GREEDY_CASES)
def test_greedy_equals_hf_generate_fp64(arch, method):
    model = tiny_model(arch)
    decoder = TreeDecoder(model, candidates=SOURCES[method](model))
    steps = tokens = 0
    for case in range(4):
        torch.manual_seed(400 + case)
        prompt = torch.randint(3, VOCAB, (1, 5 + 3 * case))
        assert decoder.generate_ids(prompt, 40, eos_token_ids=[2]) == hf_greedy(model, prompt, 40), case
        steps += len(decoder.stats.accepted_lengths)
        tokens += sum(decoder.stats.accepted_lengths)
    if method != "sps_other_draft":  # an unrelated random draft rarely agrees; the others must
        assert tokens > 1.3 * steps, "drafted tokens must get accepted for the test to mean anything"


# ---- speculative sampling: the rule and the distribution -----------------------------------------

def test_speculative_accept_by_hand():
    p = torch.tensor([[0.5, 0.5, 0.0], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0]], dtype=torch.float64)
    generator = torch.Generator().manual_seed(0)
    # q == p: every draft kept, bonus from p after the last one
    assert speculative_accept(torch.tensor([1, 2]), p[:2], p, generator) == (2, 0)
    # the draft's token has p = 0: always rejected, bonus from norm(max(0, p - q)) = token 2
    q = torch.tensor([[0.0, 0.0, 1.0]], dtype=torch.float64)
    for _ in range(20):
        assert speculative_accept(torch.tensor([2]), q, p[1:], generator) == (1, 0)
        assert speculative_accept(torch.tensor([2]), q, p[:2], generator)[0] == 0
    # p(x) / q(x) = 0.5: accepted half the time; on rejection only token 0 has p > q
    q = torch.tensor([[0.0, 1.0, 0.0]], dtype=torch.float64)
    outcomes = [speculative_accept(torch.tensor([1]), q, p[:2], generator) for _ in range(2000)]
    assert set(outcomes) == {(1, 2), (0, 0)}
    assert abs(sum(o[0] for o in outcomes) / 2000 - 0.5) < 0.05


def wrong_rule(draft_tokens, draft_probs, target_probs, generator=None):
    """Leviathan's rule with one mistake: on rejection, resample from p instead of the residual."""
    for i, token in enumerate(draft_tokens.tolist()):
        p, q = target_probs[i].double(), draft_probs[i].double()
        if torch.rand((), generator=generator, dtype=torch.float64) * q[token] >= p[token]:
            return i, int(torch.multinomial(p, 1, generator=generator))
    return len(draft_tokens), int(torch.multinomial(target_probs[-1].double(), 1, generator=generator))


@pytest.mark.parametrize("rule", [speculative_accept, wrong_rule])
def test_speculative_rule_keeps_the_target_distribution(rule):
    torch.manual_seed(0)
    p = torch.softmax(torch.randn(2, 6) * 1.5, dim=-1).double()
    q = torch.softmax(torch.randn(1, 6) * 1.5, dim=-1).double()
    generator = torch.Generator().manual_seed(1)
    n = 20000
    counts = torch.zeros(6)
    for _ in range(n):
        draft = torch.multinomial(q[0], 1, generator=generator)
        accepted, bonus = rule(draft, q, p, generator)
        counts[int(draft) if accepted else bonus] += 1
    p_value = chi_square_p_value(counts, p[0], n)
    assert (p_value > 1e-3) if rule is speculative_accept else (p_value < 1e-6)


def exact_first_tokens(model, prompt, warpers, length):
    """Exact probability of every sequence of `length` first tokens (a dict), by enumeration."""
    sequences = {(): 1.0}
    with torch.no_grad():
        for _ in range(length):
            grown = {}
            for seq, prob in sequences.items():
                ids = torch.cat([prompt, torch.tensor([list(seq)], dtype=torch.long)], dim=1)
                dist = torch.softmax(warpers(None, model(ids).logits[0, -1:].float()), -1)[0].double()
                for token in torch.nonzero(dist * prob > 1e-6).flatten().tolist():
                    grown[seq + (token,)] = prob * float(dist[token])
            sequences = grown
    return sequences


def sampled_counts(decoder, prompt, sampling, n, length):
    counts = {}
    for i in range(n):
        sampling.seed = i
        ids = tuple(decoder.generate_ids(prompt, length, sampling))
        counts[ids] = counts.get(ids, 0) + 1
    return counts


def p_value_of(counts, exact, n):
    outcomes = list(exact)
    observed = torch.tensor([counts.get(o, 0) for o in outcomes] + [n - sum(counts.get(o, 0) for o in outcomes)],
                            dtype=torch.float64)
    expected = torch.tensor(list(exact.values()) + [max(1.0 - sum(exact.values()), 0.0)], dtype=torch.float64)
    return chi_square_p_value(observed, expected, n)


@pytest.fixture(scope="module")
def sampling_setup():
    """A peaked target and a draft that is the same model made twice as sharp: q over-proposes the
    likeliest tokens, so α ≈ 0.65 and the residual max(0, p − q) differs clearly from p."""
    target = tiny_model("llama")
    with torch.no_grad():
        target.lm_head.weight.mul_(2.0)
    draft = copy.deepcopy(target)
    with torch.no_grad():
        draft.lm_head.weight.mul_(2.0)
    return target, draft, torch.tensor([[5, 9, 11, 3]])


SAMPLES = 1000


@pytest.mark.parametrize("rule", [speculative_accept, wrong_rule])
@pytest.mark.parametrize("top_p", [1.0, 0.8])
def test_sps_sampling_matches_base_distribution(sampling_setup, monkeypatch, top_p, rule):
    """First two sampled tokens of SpS (the second passes the acceptance rule) vs the exact joint;
    with the wrong rule plugged in, the same test must fail."""
    target, draft, prompt = sampling_setup
    monkeypatch.setattr("specheads.inference.speculative.speculative_accept", rule)
    source = DraftModelCandidates(draft, gamma=2)
    decoder = TreeDecoder(target, candidates=source)
    sampling = SamplingConfig(temperature=1.0, top_p=top_p)
    exact = exact_first_tokens(target, prompt, sampling.warpers(), 2)
    counts = sampled_counts(decoder, prompt, sampling, SAMPLES, 2)
    assert 0.3 < source.alpha < 0.9, "both acceptances and rejections must be exercised"
    assert sum(1 for v in exact.values() if v * SAMPLES >= 5) >= 20, "enough outcomes to test"
    p_value = p_value_of(counts, exact, SAMPLES)
    assert (p_value > 1e-3) if rule is speculative_accept else (p_value < 1e-4)


# ---- γ from α and c ---------------------------------------------------------------------------

def test_expected_tokens_and_best_gamma():
    assert expected_tokens_per_step(0.0, 5) == 1.0
    assert expected_tokens_per_step(1.0, 5) == 6.0
    assert expected_tokens_per_step(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)
    assert best_gamma(0.05, 0.5, 8) == 1  # a bad draft: draft as little as allowed
    assert best_gamma(0.95, 0.01, 8) == 8  # a free, good draft: as far as allowed
    # Leviathan et al. Fig. 3: α = 0.8, c = 0.1 peaks around γ = 5-6
    speedups = {g: expected_tokens_per_step(0.8, g) / (0.1 * g + 1) for g in range(1, 12)}
    assert best_gamma(0.8, 0.1, 11) == max(speedups, key=speedups.get)
    assert best_gamma(0.8, 0.1, 11) in (5, 6)


def test_auto_gamma_follows_the_measured_acceptance():
    model = tiny_model("llama")
    source = DraftModelCandidates(self_draft(model, 1), gamma="auto", max_gamma=6)
    decoder = TreeDecoder(model, candidates=source)
    decoder.generate_ids(torch.randint(3, VOCAB, (1, 8)), 30)
    assert source.alpha_count > 0 and 0 < source.cost_ratio
    assert source.gamma == best_gamma(source.alpha, source.cost_ratio, 6)


# ---- the self-speculative draft -------------------------------------------------------------------

def test_self_draft_shares_weights_and_is_not_counted_as_a_base_forward():
    model = tiny_model("qwen2")
    draft = self_draft(model, 1)
    assert draft.model.layers[0] is model.model.layers[0] and draft.lm_head is model.lm_head
    assert len(draft.model.layers) == 1 and len(model.model.layers) == 2
    assert model.config.num_hidden_layers == 2  # the base is untouched
    calls = []
    model.register_forward_hook(lambda *args: calls.append(1))
    ids = torch.randint(3, VOCAB, (1, 6))
    with torch.no_grad():
        got = draft(ids).logits
        inner = model.model
        hidden = inner.embed_tokens(ids)
        positions = torch.arange(6)[None]
        rope = inner.rotary_emb(hidden, positions)
        mask = torch.full((6, 6), float("-inf"), dtype=hidden.dtype).triu(1)[None, None]
        hidden = inner.layers[0](hidden, attention_mask=mask, position_ids=positions, position_embeddings=rope)
        hidden = hidden[0] if isinstance(hidden, tuple) else hidden
        expected = model.lm_head(inner.norm(hidden))
    assert calls == []
    torch.testing.assert_close(got, expected)
    with pytest.raises(ValueError, match="num_layers"):
        self_draft(model, 3)


# ---- edge cases -----------------------------------------------------------------------------------

EDGE_SOURCES = ["sps", "lookahead", "pld"]


def decode_unstopped(method, seed):
    """A tiny llama, a decoder with the method's source, a prompt and its 30 greedy tokens without EOS."""
    model = tiny_model("llama")
    decoder = TreeDecoder(model, candidates=SOURCES[method](model))
    torch.manual_seed(seed)
    prompt = torch.randint(3, VOCAB, (1, 8))
    return model, decoder, prompt, decoder.generate_ids(prompt, 30)


@pytest.mark.parametrize("method", EDGE_SOURCES)
def test_eos_inside_a_drafted_block_stops_like_hf(method):
    model, decoder, prompt, full = decode_unstopped(method, 401)
    assert max(decoder.stats.accepted_lengths) > 1
    for stop_at in range(1, 12):  # every position, so some EOS land inside accepted drafts
        eos = full[stop_at]
        got = decoder.generate_ids(prompt, 30, eos_token_ids=[eos])
        assert got == hf_greedy(model, prompt, 30, eos=eos) == full[: full.index(eos) + 1]


@pytest.mark.parametrize("method", EDGE_SOURCES)
def test_max_new_tokens_inside_an_accepted_block(method):
    _, decoder, prompt, full = decode_unstopped(method, 402)
    for n in (1, 2, 3, 5, 8, 13):
        assert decoder.generate_ids(prompt, n) == full[:n]


@pytest.mark.parametrize("method", EDGE_SOURCES)
def test_prompt_at_the_context_limit(method):
    model = tiny_model("llama")  # max_position_embeddings = 256
    decoder = TreeDecoder(model, candidates=SOURCES[method](model))
    limit = model.config.max_position_embeddings
    torch.manual_seed(403)
    for length in (limit - 5, limit):  # room for limit - length + 1 tokens: the last one is never fed
        prompt = torch.randint(3, VOCAB, (1, length))
        got = decoder.generate_ids(prompt, 20, eos_token_ids=[2])
        assert got == hf_greedy(model, prompt, limit - length + 1)
    with pytest.raises(ValueError, match="more than the model's 256 positions"):
        decoder.generate_ids(torch.randint(3, VOCAB, (1, limit + 1)), 5)


# ---- trees from parent pointers, lookahead's window ------------------------------------------------

def test_buffers_from_parents_equal_the_rank_path_builder():
    static = build_tree_buffers([(0,), (1,), (0, 0), (0, 1), (1, 0)], num_heads=2, top_k=2)
    built = buffers_from_parents(static.parent.tolist())
    assert built.paths == static.paths and built.num_nodes == static.num_nodes
    for name in ("attention_mask", "depths", "parent", "retrieve_indices"):
        assert torch.equal(getattr(built, name), getattr(static, name)), name


def test_lookahead_tree_layout():
    source = LookaheadCandidates(window=3, ngram=3, pool=2)
    source.pool = {7: [(8, 9), (8, 10)]}
    source.levels = [[0, 11, 12], [21, 22, 23]]
    tokens, buffers = source.propose(7, None, [1, 2, 3])
    # root, trie 8 -> {9, 10}, level 0 chain 11 -> 12, level 1 hanging below level 0's columns
    assert tokens.tolist() == [7, 8, 9, 10, 11, 12, 21, 22, 23]
    assert buffers.parent.tolist() == [-1, 0, 1, 1, 0, 4, 0, 4, 5]
    assert buffers.depths.tolist() == [0, 1, 2, 2, 1, 2, 1, 2, 3]  # (level j, column i) at depth i + j
    logits = torch.zeros(9, 40)
    logits[[6, 7, 8], [31, 32, 33]] = 1.0  # this Jacobi iteration's outputs at the last level
    source.observe(logits, torch.tensor([0]))
    assert source.levels == [[21, 22, 23], [31, 32, 33]]
    assert source.pool[7][-1] == (21, 31) and source.pool[11] == [(22, 32)] and source.pool[12] == [(23, 33)]


def test_bench_runs_the_seed_methods(tmp_path, tiny_llama_dir):

    from specheads.inference import bench

    questions = tmp_path / "q.jsonl"
    questions.write_text(json.dumps({"question_id": "a", "category": "qa", "turns": ["Hello", "And then?"]}) + "\n")
    methods = ["hf_prompt_lookup", "hf_assisted", "pld", "sps", "lookahead"]
    results = bench.main(["--model", str(tiny_llama_dir), "--questions", str(questions), "--methods", ",".join(methods),
                          "--max-new-tokens", "12", "--dtype", "fp64", "--draft-layers", "1", "--gamma", "auto",
                          "--out", str(tmp_path / "bench")])
    for method in methods:
        assert results["methods"][method]["overall"]["greedy_match"] == 1.0, method
        assert results["methods"][method]["overall"]["tau"] >= 1.0

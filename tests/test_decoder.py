"""Tree decoding is lossless: greedy output equals HF greedy `generate`; sampling keeps the distribution."""


import pytest
import torch

from specheads.heads import MedusaConfig, MedusaHeads
from specheads.inference.acceptance import (children_lists, greedy_accept, lazy_greedy_accept, lossless_accept,
                                           typical_accept)
from specheads.inference.decoder import SamplingConfig, TreeDecoder
from specheads.inference.tree import build_tree_buffers, tree_from_accuracies

VOCAB = 48


def tiny_model(arch: str, dtype=torch.float64, seed=0):
    import transformers

    torch.manual_seed(seed)
    common = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  bos_token_id=1, eos_token_id=2, pad_token_id=0)
    config_cls, model_cls = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
        "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
    }[arch]
    model = model_cls(config_cls(**common)).to(dtype).eval()
    # Sharper logits make the tiny model's next token predictable, so speculation gets accepted.
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    return model


def random_heads(model, num_heads=3, scale=0.05, seed=1):
    torch.manual_seed(seed)
    heads = MedusaHeads(MedusaConfig.for_base(model.config, "tiny", num_heads=num_heads))
    with torch.no_grad():
        for p in heads.parameters():
            p.normal_(0, scale)
    return heads.to(model.dtype)


def fitted_heads(model, num_heads=3, steps=400, **sampling):
    """Heads trained for a moment on the model's own text, so their drafts often get accepted."""
    from specheads.train.losses import medusa_loss, shifted_targets

    torch.manual_seed(7)
    prompts = torch.randint(3, VOCAB, (64 if sampling else 16, 6))
    with torch.no_grad():
        text = model.generate(prompts, max_new_tokens=40, do_sample=bool(sampling), pad_token_id=0,
                              attention_mask=torch.ones_like(prompts), **sampling)
        hidden = model(text, output_hidden_states=True).hidden_states[-1]
    targets = shifted_targets(text, num_heads)
    heads = MedusaHeads(MedusaConfig.for_base(model.config, "tiny", num_heads=num_heads)).to(model.dtype)
    optimizer = torch.optim.AdamW(heads.parameters(), lr=1e-2)
    for _ in range(steps):
        loss, _ = medusa_loss(heads(hidden, model.lm_head), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return heads.eval()


TREE = tree_from_accuracies([[0.5, 0.2, 0.1, 0.05]] * 3, num_nodes=20)


def hf_greedy(model, prompt, max_new_tokens):
    out = model.generate(prompt, max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=2,
                         pad_token_id=0, attention_mask=torch.ones_like(prompt))
    return out[0, prompt.shape[1]:].tolist()


@pytest.mark.parametrize("arch", ["llama", "qwen2", "mistral"])
def test_greedy_equals_hf_generate_fp64(arch):
    model = tiny_model(arch)
    decoder = TreeDecoder(model, fitted_heads(model), TREE)
    assert decoder._lazy_lm_head is not None  # greedy steps project one path (lazy_greedy_accept), tested here
    total_steps = total_tokens = 0
    for case in range(6):
        torch.manual_seed(100 + case)
        prompt = torch.randint(3, VOCAB, (1, 5 + 3 * case))
        expected = hf_greedy(model, prompt, 40)
        got = decoder.generate_ids(prompt, 40, eos_token_ids=[2])
        assert got == expected, f"{arch} case {case}"
        total_steps += len(decoder.stats.accepted_lengths)
        total_tokens += sum(decoder.stats.accepted_lengths)
    # the test must exercise acceptance of drafted tokens, not only bonus tokens
    assert total_tokens > 1.3 * total_steps


def test_heads_with_a_draft_vocabulary_greedy_equal_hf_fp64():
    """Heads that can only propose 36 of the 48 tokens: the output is still the base's own."""
    model = tiny_model("qwen2")
    fitted = fitted_heads(model)
    config = MedusaConfig.for_base(model.config, "tiny", num_heads=3, draft_vocab_size=36)
    heads = MedusaHeads(config).to(model.dtype)
    heads.blocks.load_state_dict(fitted.blocks.state_dict())
    heads.set_draft_vocabulary(torch.randperm(VOCAB, generator=torch.Generator().manual_seed(3))[:36])
    decoder = TreeDecoder(model, heads, TREE)
    steps = tokens = 0
    for case in range(4):
        torch.manual_seed(300 + case)
        prompt = torch.randint(3, VOCAB, (1, 6 + 2 * case))
        assert decoder.generate_ids(prompt, 40, eos_token_ids=[2]) == hf_greedy(model, prompt, 40), f"case {case}"
        steps += len(decoder.stats.accepted_lengths)
        tokens += sum(decoder.stats.accepted_lengths)
    assert tokens > 1.2 * steps  # drafts from the reduced vocabulary were accepted
    # proposals are token ids of the draft vocabulary: head 1's best among them comes first
    from specheads.inference.candidates import MedusaCandidates

    hidden = torch.randn(1, model.config.hidden_size, dtype=model.dtype)
    proposed, _ = MedusaCandidates(heads, TREE, model.lm_head).propose(5, hidden, [])
    assert set(proposed[1:].tolist()) <= set(heads.draft_ids.tolist())
    full_logits = fitted(hidden, model.lm_head)[0, 0]
    assert proposed[1] == heads.draft_ids[full_logits[heads.draft_ids].argmax()]


def test_plain_decoding_without_heads_equals_hf():
    model = tiny_model("llama")
    prompt = torch.randint(3, VOCAB, (1, 7))
    decoder = TreeDecoder(model)
    assert decoder.generate_ids(prompt, 30, eos_token_ids=[2]) == hf_greedy(model, prompt, 30)
    assert decoder.stats.tau == pytest.approx(1.0)


def test_max_new_tokens_inside_an_accepted_block_and_eos():
    model = tiny_model("llama")
    decoder = TreeDecoder(model, random_heads(model), TREE)
    prompt = torch.randint(3, VOCAB, (1, 9))
    full = decoder.generate_ids(prompt, 40)
    for n in (1, 2, 3, 7, 13):
        assert decoder.generate_ids(prompt, n) == full[:n]
    stop_token = full[5]
    cut = decoder.generate_ids(prompt, 40, eos_token_ids=[stop_token])
    assert cut == full[: full.index(stop_token) + 1]


# ---- acceptance rules on hand-made logits --------------------------------------------------

def small_tree():
    # root -> (0,) -> (0,0);  root -> (1,)
    return build_tree_buffers([(0,), (1,), (0, 0)], num_heads=2, top_k=2)


def test_greedy_accept_by_hand():
    buffers = small_tree()  # nodes: 0 root, 1 (0,), 2 (1,), 3 (0,0)
    tokens = torch.tensor([5, 7, 8, 9])
    logits = torch.zeros(4, 10)
    logits[0, 7] = 1  # after root the base wants 7: node 1 accepted
    logits[1, 9] = 1  # after node 1 it wants 9: node 3 accepted
    logits[3, 4] = 1  # bonus after node 3
    accepted, bonus = greedy_accept(tokens, logits, buffers)
    assert accepted.tolist() == [0, 1, 3] and bonus == 4
    logits[0] = 0
    logits[0, 8] = 1  # now the base wants 8: node 2 path
    logits[2, 6] = 1
    accepted, bonus = greedy_accept(tokens, logits, buffers)
    assert accepted.tolist() == [0, 2] and bonus == 6


def random_greedy_case(seed: int, nodes: int = 12, vocab: int = 40, hidden_size: int = 8):
    """A random tree whose nodes often carry the argmax of their parent's logits (so paths get accepted);
    siblings never share a token."""
    from specheads.inference.tree import buffers_from_parents

    generator = torch.Generator().manual_seed(seed)
    lm_head = torch.nn.Linear(hidden_size, vocab, bias=seed % 2 == 0).double()
    hidden = torch.randn(nodes, hidden_size, generator=generator, dtype=torch.float64)
    wanted = lm_head(hidden).argmax(-1).tolist()
    parents, tokens = [-1], [0]
    for node in range(1, nodes):
        parent = int(torch.randint(0, node, (1,), generator=generator))
        siblings = {tokens[i] for i in range(node) if parents[i] == parent}
        token = wanted[parent] if torch.rand(1, generator=generator) < 0.6 else int(torch.randint(vocab, (1,), generator=generator))
        while token in siblings:
            token = (token + 1) % vocab
        parents.append(parent), tokens.append(token)
    buffers = buffers_from_parents(parents)
    return torch.tensor(tokens), hidden, lm_head, buffers


def test_lazy_greedy_accept_equals_greedy_accept():
    accepted_lengths = set()
    with torch.no_grad():
        for seed in range(200):
            tokens, hidden, lm_head, buffers = random_greedy_case(seed)
            expected, expected_bonus = greedy_accept(tokens, lm_head(hidden), buffers)
            accepted, bonus = lazy_greedy_accept(tokens, hidden, lm_head, buffers, children_lists(buffers))
            assert accepted.tolist() == expected.tolist() and bonus == expected_bonus, seed
            accepted_lengths.add(len(accepted))
    assert len(accepted_lengths) >= 3  # roots alone, and paths of several nodes, were both tested


def test_lazy_greedy_accept_falls_back_on_a_tie_between_children():
    """Two children whose tokens score the same: the path followed may not be the argmax's (the lowest id
    wins a tie), so every node's logits are computed and greedy_accept decides."""
    buffers = small_tree()  # nodes: 0 root, 1 (0,), 2 (1,), 3 (0,0)
    tokens = torch.tensor([5, 8, 7, 9])
    lm_head = torch.nn.Linear(4, 10, bias=False).double()
    with torch.no_grad():
        lm_head.weight.zero_()
        lm_head.weight[7] = lm_head.weight[8] = torch.tensor([1.0, 0, 0, 0], dtype=torch.float64)
        lm_head.weight[6] = torch.tensor([0, 1.0, 0, 0], dtype=torch.float64)
        hidden = torch.tensor([[1.0, 0, 0, 0], [0, 0, 1, 0], [0, 1, 0, 0], [0, 0, 0, 1]], dtype=torch.float64)
        accepted, bonus = lazy_greedy_accept(tokens, hidden, lm_head, buffers, children_lists(buffers))
        expected, expected_bonus = greedy_accept(tokens, lm_head(hidden), buffers)
    assert accepted.tolist() == expected.tolist() == [0, 2] and bonus == expected_bonus == 6


def test_typical_accept_by_hand():
    buffers = small_tree()
    tokens = torch.tensor([0, 1, 2, 3])
    probs = torch.full((4, 4), 0.01)
    # after root: token 1 p=.5, token 2 p=.47 (both pass); after node 1, token 3 has p=.02 (fails)
    probs[0] = torch.tensor([0.01, 0.5, 0.47, 0.02])
    probs[1] = torch.tensor([0.49, 0.49, 0.0, 0.02])
    accepted = typical_accept(tokens, probs, buffers, epsilon=0.09, delta=0.3)
    # both length-1 paths tie; the likelier token (1, p=.5) wins
    assert accepted.tolist() == [0, 1]
    probs[1] = torch.tensor([0.0, 0.0, 0.0, 1.0])  # entropy 0: threshold = min(.09, .3) -> token 3 passes
    assert typical_accept(tokens, probs, buffers).tolist() == [0, 1, 3]
    # a flat distribution lowers the threshold: δ·exp(−H) = .3/4 < ε, so p = .25 > .075 passes
    probs[0] = torch.full((4,), 0.25)
    assert typical_accept(tokens, probs, buffers).tolist() == [0, 1, 3]


def test_sampling_config_defaults():
    assert SamplingConfig().rule == "greedy"
    assert SamplingConfig(temperature=0.7).rule == "lossless"
    config = SamplingConfig(temperature=0.7, acceptance="typical")
    assert config.rule == "typical" and config.typical_epsilon == 0.09 and config.typical_delta == 0.3
    with pytest.raises(ValueError, match="acceptance"):
        SamplingConfig(acceptance="maybe")


def chi_square_p_value(observed, expected_probs, n):
    from scipy.stats import chisquare

    keep = expected_probs * n >= 5
    obs = observed[keep].tolist() + [observed[~keep].sum().item()]
    exp = (expected_probs[keep] * n).tolist() + [(expected_probs[~keep] * n).sum().item()]
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    scale = sum(obs) / sum(exp)  # float rounding only
    return chisquare(obs, [e * scale for e in exp]).pvalue


def test_lossless_accept_reproduces_the_distribution_on_hand_made_tree():
    buffers = build_tree_buffers([(0,), (1,), (0, 0)], num_heads=2, top_k=2)
    children = children_lists(buffers)
    tokens = torch.tensor([0, 1, 2, 3])
    torch.manual_seed(0)
    probs = torch.softmax(torch.randn(4, 5) * 1.5, dim=-1).double()
    generator = torch.Generator().manual_seed(0)
    n = 20000
    counts = torch.zeros(5)
    for _ in range(n):
        accepted, bonus = lossless_accept(tokens, probs, children, generator)
        first = int(tokens[accepted[1]]) if len(accepted) > 1 else bonus
        counts[first] += 1
    assert chi_square_p_value(counts, probs[0], n) > 1e-3


def test_lossless_accept_with_sampled_children_reproduces_the_distribution():
    """Children drawn from a draft q without replacement (Gumbel-top-k, fresh every trial) and verified by
    recursive rejection sampling: the first two tokens (the second from the base after the step when the step
    made one) follow the target's joint exactly, with q unlike p and missing some of p's support."""
    vocab = 6
    torch.manual_seed(1)
    p_root = torch.softmax(torch.randn(vocab) * 1.2, -1).double()
    p_after = torch.softmax(torch.randn(vocab, vocab) * 1.2, -1).double()  # p(second | first)
    q_root = torch.softmax(torch.randn(vocab) * 2.0, -1).double()
    q_root[5] = 0.0  # the draft never proposes token 5: only the residual can produce it
    q_root /= q_root.sum()
    q_after = torch.softmax(torch.randn(vocab, vocab) * 2.0, -1).double()
    generator = torch.Generator().manual_seed(0)

    def draw(q, k):
        keys = q.log() - torch.log(-torch.log(torch.rand(vocab, generator=generator, dtype=torch.float64)))
        return keys.topk(k).indices.tolist()

    # root -> 3 sampled children; the first -> 2 sampled grandchildren (node order: 0, 1..3, 4..5)
    parents = [-1, 0, 0, 0, 1, 1]
    children = [[1, 2, 3], [4, 5], [], [], [], []]
    n = 20000
    counts = torch.zeros(vocab * vocab)
    accepted_children = 0
    for _ in range(n):
        first = draw(q_root, 3)
        second = draw(q_after[first[0]], 2)
        tokens = torch.tensor([0] + first + second)
        probs = torch.stack([p_root, p_after[first[0]], p_after[first[1]], p_after[first[2]],
                             torch.full((vocab,), 1.0 / vocab, dtype=torch.float64),
                             torch.full((vocab,), 1.0 / vocab, dtype=torch.float64)])
        accepted, bonus = lossless_accept(tokens, probs, children, generator,
                                          proposals={0: q_root, 1: q_after[first[0]]})
        assert all(parents[int(b)] == int(a) for a, b in zip(accepted[:-1], accepted[1:]))
        out = tokens[accepted[1:]].tolist() + [bonus]
        accepted_children += len(out) > 1
        if len(out) == 1:
            out.append(int(torch.multinomial(p_after[out[0]], 1, generator=generator)))
        counts[out[0] * vocab + out[1]] += 1
    assert accepted_children > 0.3 * n, "drafts must get accepted for the test to mean anything"
    joint = (p_root[:, None] * p_after).flatten()
    assert chi_square_p_value(counts, joint, n) > 1e-3
    # the rule must depend on q: treating the sampled children as point masses is exact too, so check the
    # acceptance differs (sampled children from q = p are always accepted, point masses only with p(x))
    always = lossless_accept(torch.tensor([0, 2]), torch.stack([p_root, p_root]), [[1], []], generator,
                             proposals={0: p_root})
    assert always[0].tolist() == [0, 1]


def exact_joint_of_two_tokens(model, prompt, sampling) -> torch.Tensor:
    """P(x0, x1 | prompt) of the base under the sampling warpers, [VOCAB, VOCAB]."""
    warpers = sampling.warpers()
    with torch.no_grad():
        first = torch.softmax(warpers(None, model(prompt).logits[0, -1:].float()), -1)[0]
        joint = torch.zeros(VOCAB, VOCAB)
        for a in torch.nonzero(first > 0).flatten().tolist():
            seq = torch.cat([prompt, torch.tensor([[a]])], dim=1)
            joint[a] = first[a] * torch.softmax(warpers(None, model(seq).logits[0, -1:].float()), -1)[0]
    return joint


def sample_two_tokens(decoder, prompt, sampling, n: int):
    """Counts of (x0, x1) over n seeded generations, and how many first steps accepted a drafted token."""
    counts = torch.zeros(VOCAB * VOCAB)
    drafted = 0
    for i in range(n):
        sampling.seed = i
        ids = decoder.generate_ids(prompt, 2, sampling)
        counts[ids[0] * VOCAB + ids[1]] += 1
        drafted += decoder.stats.accepted_lengths[0] > 1 if decoder.stats.accepted_lengths else 0
    return counts, drafted


def test_sampling_decoder_matches_base_distribution():
    """First two sampled tokens of the tree decoder vs the exact joint distribution of the base."""
    model = tiny_model("llama", dtype=torch.float64)
    with torch.no_grad():
        model.lm_head.weight.mul_(3.0)  # peaked, but several tokens still carry probability
    heads = fitted_heads(model, num_heads=2, temperature=0.8, top_p=0.9)
    tree = [(0,), (1,), (2,), (3,), (4,), (5,), (0, 0), (0, 1), (1, 0)]
    decoder = TreeDecoder(model, heads, tree)
    prompt = torch.tensor([[5, 9, 11, 3]])
    sampling = SamplingConfig(temperature=0.8, top_p=0.9, seed=1234)
    joint = exact_joint_of_two_tokens(model, prompt, sampling)
    n = 3000
    counts, drafted = sample_two_tokens(decoder, prompt, sampling, n)
    # Heads at T > 0 guess x1 without knowing the sampled x0, so most drafts are rightly rejected;
    # enough must be accepted for the test to check the acceptance path too.
    assert drafted > 0.1 * n, "the heads' drafts must get accepted for the test to mean anything"
    expected = joint.flatten().double()
    assert (expected * n >= 5).sum() >= 10, "the distribution must have enough outcomes to test"
    assert chi_square_p_value(counts, expected, n) > 1e-3


# ---- prompt lookup as a candidate source -----------------------------------------------------

def test_prompt_lookup_finds_latest_longest_match():
    from specheads.inference.candidates import PromptLookupCandidates

    source = PromptLookupCandidates(max_ngram=3, num_tokens=3)
    #          0  1  2  3  4  5  6  7  8  9
    context = [1, 2, 3, 9, 9, 1, 2, 3, 7, 8, 1, 2, 3]
    assert source.lookup(context) == [7, 8, 1]  # latest earlier "1 2 3" is at 5
    assert source.lookup([4, 5, 6]) == []
    assert source.lookup([5, 6, 5]) == [6, 5]  # falls back to a 1-gram
    tokens, buffers = source.propose(3, None, [1, 2, 3, 4, 1, 2])
    assert tokens.tolist() == [3, 4, 1, 2] and buffers.num_nodes == 4


def test_prompt_lookup_min_ngram_ignores_shorter_matches():
    from specheads.inference.candidates import PromptLookupCandidates

    assert PromptLookupCandidates(max_ngram=3, num_tokens=3, min_ngram=2).lookup([5, 6, 5]) == []
    assert PromptLookupCandidates(max_ngram=3, num_tokens=3, min_ngram=2).lookup([5, 6, 7, 5, 6]) == [7, 5, 6]
    with pytest.raises(ValueError, match="min_ngram"):
        PromptLookupCandidates(max_ngram=2, min_ngram=3)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_prompt_lookup_greedy_equals_hf_generate_fp64(arch):
    from specheads.inference.candidates import PromptLookupCandidates

    model = tiny_model(arch)
    decoder = TreeDecoder(model, candidates=PromptLookupCandidates(max_ngram=3, num_tokens=5))
    drafted = 0
    for case in range(5):
        torch.manual_seed(200 + case)
        prompt = torch.randint(3, VOCAB, (1, 6 + 2 * case))
        assert decoder.generate_ids(prompt, 40, eos_token_ids=[2]) == hf_greedy(model, prompt, 40), case
        drafted += sum(a - 1 for a in decoder.stats.accepted_lengths)
    assert drafted > 20  # tiny models loop, so lookups get accepted


def test_merged_tree_unites_token_paths():
    from specheads.inference.candidates import merge_token_trees

    medusa = build_tree_buffers([(0,), (1,), (0, 0)], num_heads=2, top_k=2)  # root, a, b, a->c
    lookup = build_tree_buffers([(0,), (0, 0), (0, 0, 0)], num_heads=3, top_k=1)  # root, a, a->d, d->e
    tokens, buffers = merge_token_trees([(torch.tensor([9, 1, 2, 3]), medusa), (torch.tensor([9, 1, 4, 5]), lookup)])
    paths = {}
    for node in range(buffers.num_nodes):
        path, n = [], node
        while n > 0:
            path.append(int(tokens[n]))
            n = int(buffers.parent[n])
        paths[tuple(reversed(path))] = node
    assert set(paths) == {(), (1,), (2,), (1, 3), (1, 4), (1, 4, 5)}
    assert int(tokens[0]) == 9


def test_medusa_plus_prompt_lookup_greedy_equals_hf_fp64():
    from specheads.inference.candidates import MedusaCandidates, MergedCandidates, PromptLookupCandidates

    model = tiny_model("llama")
    heads = fitted_heads(model)
    source = MergedCandidates(MedusaCandidates(heads, TREE, model.lm_head),
                              PromptLookupCandidates(max_ngram=3, num_tokens=5))
    decoder = TreeDecoder(model, candidates=source)
    for case in range(4):
        torch.manual_seed(300 + case)
        prompt = torch.randint(3, VOCAB, (1, 6 + 2 * case))
        assert decoder.generate_ids(prompt, 40, eos_token_ids=[2]) == hf_greedy(model, prompt, 40), case


def test_typical_acceptance_decodes_and_accepts_drafts():
    model = tiny_model("llama")
    decoder = TreeDecoder(model, fitted_heads(model), TREE)
    prompt = torch.randint(3, VOCAB, (1, 8))
    ids = decoder.generate_ids(prompt, 30, SamplingConfig(temperature=0.5, acceptance="typical", seed=0))
    assert len(ids) == 30 and all(0 <= t < VOCAB for t in ids)
    assert decoder.stats.tau > 1.0  # typical acceptance takes drafted tokens, not only bonus tokens


def test_prompt_lookup_first_then_medusa_greedy_equals_hf_fp64():
    from specheads.inference.candidates import FallbackCandidates, MedusaCandidates, PromptLookupCandidates

    model = tiny_model("llama")
    source = FallbackCandidates(PromptLookupCandidates(max_ngram=3, num_tokens=5),
                                MedusaCandidates(fitted_heads(model), TREE, model.lm_head))
    decoder = TreeDecoder(model, candidates=source)
    for case in range(4):
        torch.manual_seed(300 + case)
        prompt = torch.randint(3, VOCAB, (1, 6 + 2 * case))
        assert decoder.generate_ids(prompt, 40, eos_token_ids=[2]) == hf_greedy(model, prompt, 40), case
    assert min(source.steps_by_source) > 0  # both sources' trees were verified


def test_combined_sources_refuse_sources_with_their_own_acceptance():
    from specheads.inference.candidates import FallbackCandidates, MergedCandidates, PromptLookupCandidates
    from specheads.inference.speculative import DraftModelCandidates

    model = tiny_model("llama")
    sps = DraftModelCandidates(model, gamma=2)
    for combine in (MergedCandidates, FallbackCandidates):
        with pytest.raises(ValueError, match="own acceptance"):
            combine(PromptLookupCandidates(), sps)
        with pytest.raises(ValueError, match="at least two"):
            combine(PromptLookupCandidates())


def test_lookup_match_plus_few_head_nodes_else_the_heads_tree_greedy_equals_hf_fp64():
    from specheads.inference.candidates import (FallbackCandidates, MedusaCandidates, MergedCandidates,
                                                PromptLookupCandidates)

    model = tiny_model("llama")
    heads = fitted_heads(model)
    on_match = MergedCandidates(PromptLookupCandidates(max_ngram=3, num_tokens=5),
                                MedusaCandidates(heads, [(0,), (0, 0)], model.lm_head), require_first=True)
    source = FallbackCandidates(on_match, MedusaCandidates(heads, TREE, model.lm_head))
    decoder = TreeDecoder(model, candidates=source)
    for case in range(4):
        torch.manual_seed(300 + case)
        prompt = torch.randint(3, VOCAB, (1, 6 + 2 * case))
        assert decoder.generate_ids(prompt, 40, eos_token_ids=[2]) == hf_greedy(model, prompt, 40), case
    assert min(source.steps_by_source) > 0  # matched and unmatched steps both happened
    root_only = on_match.propose(5, torch.zeros(model.config.hidden_size, dtype=model.dtype), [1, 2, 3])
    assert root_only[1].num_nodes == 1  # no lookup match: the heads are not asked, the fallback takes over


def test_lookup_with_heads_trusts_long_matches_and_merges_short_ones():
    from specheads.inference.candidates import MedusaCandidates, lookup_with_heads

    model = tiny_model("llama")
    heads = MedusaCandidates(random_heads(model), TREE, model.lm_head)
    source = lookup_with_heads(heads, trusted_ngram=2, trusted_tokens=4, short_match_tokens=2)
    hidden = torch.zeros(model.config.hidden_size, dtype=model.dtype)
    tokens, buffers = source.propose(6, hidden, [4, 5, 6, 7, 8, 9, 10, 5])  # "5 6" matched: the chain alone
    assert tokens.tolist() == [6, 7, 8, 9, 10] and buffers.num_nodes == 5
    tokens, buffers = source.propose(6, hidden, [6, 7, 8, 9])  # only "6" matched: chain merged with the heads' tree
    assert buffers.num_nodes > heads.buffers.num_nodes
    chain_node = [n for n in range(buffers.num_nodes) if int(buffers.parent[n]) == 0 and int(tokens[n]) == 7]
    assert any(int(buffers.parent[n]) == chain_node[0] and int(tokens[n]) == 8 for n in range(buffers.num_nodes))
    tokens, buffers = source.propose(6, hidden, [11, 12])  # no match: the heads' static tree, buffers as built
    assert buffers is heads.buffers
    with pytest.raises(ValueError, match="trusted_ngram"):
        lookup_with_heads(heads, trusted_ngram=1)


@pytest.mark.parametrize("arch", ["llama", "mistral"])
def test_lookup_with_heads_greedy_equals_hf_fp64(arch):
    from specheads.inference.candidates import MedusaCandidates, lookup_with_heads

    model = tiny_model(arch)
    source = lookup_with_heads(MedusaCandidates(fitted_heads(model), TREE, model.lm_head),
                               trusted_ngram=2, trusted_tokens=6, short_match_tokens=3)
    decoder = TreeDecoder(model, candidates=source)
    for case in range(4):
        torch.manual_seed(300 + case)
        prompt = torch.randint(3, VOCAB, (1, 6 + 2 * case))
        assert decoder.generate_ids(prompt, 40, eos_token_ids=[2]) == hf_greedy(model, prompt, 40), case
    assert min(source.steps_by_source) > 0  # trusted matches and the merged/heads trees were both verified

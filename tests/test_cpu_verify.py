"""CPU verify tuning: packed linears (fp32 through MKL, bf16 through oneDNN) compute what F.linear computes and
follow later weight changes, SDPA sharing KV heads gives the same numbers, and decoding stays lossless on the
tuned model."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from specheads.inference.decoder import TreeDecoder
from specheads.inference.cpu_verify import (PackedLinear, mkl_packing_available, onednn_bf16_packing_available,
                                           pack_linears, packed_count, prepare_cpu_verify, stock_linears)

from test_decoder import TREE, fitted_heads, hf_greedy, tiny_model

needs_mkl = pytest.mark.skipif(not mkl_packing_available(), reason="this PyTorch has no MKL packed-linear ops")
needs_onednn_bf16 = pytest.mark.skipif(not onednn_bf16_packing_available(),
                                       reason="no oneDNN bf16 packed linears in this PyTorch or on this CPU")


def packed_pair(in_features=48, out_features=80, bias=True, dtype=torch.float32):
    torch.manual_seed(0)
    plain = nn.Linear(in_features, out_features, bias=bias).to(dtype)
    holder = nn.Sequential(plain)
    assert pack_linears(holder) == 1
    return plain, holder[0]


@needs_mkl
@pytest.mark.parametrize("bias", [True, False])
def test_packed_linear_matches_f_linear_for_any_number_of_rows(bias):
    plain, packed = packed_pair(bias=bias)
    assert isinstance(packed, PackedLinear) and packed.weight is plain.weight
    with torch.inference_mode():
        for rows in [1, 2, 3, 4, 7, 8, 13, 16, 33, 300]:
            x = torch.randn(rows, 48)
            torch.testing.assert_close(packed(x), F.linear(x, plain.weight, plain.bias), rtol=1e-5, atol=1e-5)
        x = torch.randn(2, 5, 48)  # [batch, sequence, features] as a model passes it
        torch.testing.assert_close(packed(x), F.linear(x, plain.weight, plain.bias), rtol=1e-5, atol=1e-5)
        assert packed(torch.randn(0, 48)).shape == (0, 80)
        one_row = torch.randn(1, 1, 48)  # plain decoding's shape keeps F.linear exactly
        assert torch.equal(packed(one_row), F.linear(one_row, plain.weight, plain.bias))


@needs_mkl
def test_packed_linear_follows_weights_changed_after_packing():
    _, packed = packed_pair()
    x = torch.randn(4, 48)
    with torch.no_grad():
        packed(x)
        packed.weight.mul_(-2.0)  # in place: the packed copy is stale now
        torch.testing.assert_close(packed(x), F.linear(x, packed.weight, packed.bias), rtol=1e-5, atol=1e-5)
        packed.weight = nn.Parameter(torch.randn(80, 48))  # replaced
        torch.testing.assert_close(packed(x), F.linear(x, packed.weight, packed.bias), rtol=1e-5, atol=1e-5)


@needs_onednn_bf16
@pytest.mark.parametrize("bias", [True, False])
def test_bf16_packed_linear_matches_f_linear(bias):
    """One row (plain decoding's shape) gives exactly F.linear's numbers; more rows agree to bf16 rounding (bit
    for bit on the AMD EPYC measured, but an AMX Xeon's oneDNN rounds some multi-row products differently).
    Weights edited or replaced after packing are followed."""
    plain, packed = packed_pair(bias=bias, dtype=torch.bfloat16)
    with torch.inference_mode():
        for shape in [(1, 48), (1, 1, 48)]:
            x = torch.randn(shape).to(torch.bfloat16)
            assert torch.equal(packed(x), F.linear(x, plain.weight, plain.bias)), shape
        for shape in [(2, 48), (7, 48), (10, 48), (33, 48), (300, 48), (2, 5, 48)]:
            x = torch.randn(shape).to(torch.bfloat16)
            torch.testing.assert_close(packed(x), F.linear(x, plain.weight, plain.bias), msg=str(shape))
    x = torch.randn(4, 48).to(torch.bfloat16)
    with torch.no_grad():
        packed.weight.mul_(-2.0)
        torch.testing.assert_close(packed(x), F.linear(x, packed.weight, packed.bias))
        packed.weight = nn.Parameter(torch.randn(80, 48).to(torch.bfloat16))
        torch.testing.assert_close(packed(x), F.linear(x, packed.weight, packed.bias))


@needs_onednn_bf16
def test_bf16_model_gives_the_same_logits_packed():
    """Token by token (plain decoding) the packed model's logits are the unpacked model's exactly; a whole
    prompt at once agrees to bf16 rounding."""
    model = tiny_model("llama", dtype=torch.bfloat16)
    prompt = torch.arange(3, 20)[None]
    with torch.no_grad():
        def token_by_token():
            cache, logits = None, []
            for position in range(prompt.shape[1]):
                out = model(prompt[:, position:position + 1], past_key_values=cache, use_cache=True)
                cache = out.past_key_values
                logits.append(out.logits)
            return torch.cat(logits, dim=1)

        stepwise, whole = token_by_token(), model(prompt).logits
        assert pack_linears(model) == sum(type(m) is nn.Linear for m in tiny_model("llama").modules())
        assert torch.equal(token_by_token(), stepwise)
        torch.testing.assert_close(model(prompt).logits, whole, rtol=0.02, atol=0.02)


@needs_mkl
def test_packed_linear_trains_through_f_linear():
    _, packed = packed_pair()
    packed(torch.randn(3, 48)).sum().backward()
    assert packed.weight.grad is not None and packed.weight.grad.abs().sum() > 0


@needs_mkl
def test_stock_linears_bypasses_the_packed_weight_until_the_block_ends(monkeypatch):
    plain, packed = packed_pair()
    x = torch.randn(4, 48)
    calls = []
    monkeypatch.setattr(PackedLinear, "_packed_linear", lambda self, kind, x, bias: calls.append(kind) or F.linear(x, self.weight, bias))
    with torch.inference_mode():
        with stock_linears(), stock_linears():  # nests
            torch.testing.assert_close(packed(x), F.linear(x, plain.weight, plain.bias), rtol=0, atol=0)
        assert calls == []
        packed(x)
    assert calls == ["mkl"]


@needs_mkl
def test_pack_linears_keeps_state_dict_ties_and_skips_other_dtypes():
    model = tiny_model("llama", dtype=torch.float32)
    model.config.tie_word_embeddings = True
    model.tie_weights()
    keys = list(model.state_dict())
    linears = sum(type(m) is nn.Linear for m in model.modules())
    assert pack_linears(model) == linears == packed_count(model)
    assert list(model.state_dict()) == keys
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    assert pack_linears(model) == 0  # already packed
    assert pack_linears(tiny_model("llama")) == 0  # fp64: nothing to pack
    assert pack_linears(tiny_model("llama", dtype=torch.float32), enabled=False) == 0


@needs_mkl
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_greedy_on_tuned_model_equals_hf_greedy_on_it(arch, monkeypatch):
    """The decoder's multi-row verify and HF's one-row steps both run tuned (packed, SDPA GQA); in fp32 they agree."""
    unset_gqa_flag_for_this_test(monkeypatch)
    model = tiny_model(arch, dtype=torch.float32)
    heads = fitted_heads(model)
    unpacked_logits = model(torch.arange(3, 20)[None]).logits
    assert prepare_cpu_verify(model, heads)["sdpa_force_gqa"]
    with torch.no_grad():
        torch.testing.assert_close(model(torch.arange(3, 20)[None]).logits, unpacked_logits, rtol=1e-4, atol=1e-4)
    decoder = TreeDecoder(model, heads, TREE)
    steps = tokens = 0
    for case in range(4):
        torch.manual_seed(200 + case)
        prompt = torch.randint(3, 48, (1, 5 + 3 * case))
        assert decoder.generate_ids(prompt, 40, eos_token_ids=[2]) == hf_greedy(model, prompt, 40), f"case {case}"
        steps += len(decoder.stats.accepted_lengths)
        tokens += sum(decoder.stats.accepted_lengths)
    assert tokens > 1.3 * steps  # drafted tokens were accepted, not only bonus tokens


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_sdpa_sharing_kv_heads_gives_the_same_tree_logits(arch, monkeypatch):
    """TRANSFORMERS_SDPA_FORCE_GQA only changes how SDPA reads the grouped KV heads, not the numbers."""
    from transformers import DynamicCache

    model = tiny_model(arch, dtype=torch.float32)
    assert model.config.num_key_value_heads < model.config.num_attention_heads
    prompt, tree_tokens = torch.randint(3, 48, (1, 9)), torch.randint(3, 48, (1, 5))
    visible = torch.ones(5, 14, dtype=torch.bool)
    visible[:, 9:] = torch.tensor([[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 0, 1, 0, 0], [1, 1, 0, 1, 0], [1, 0, 1, 0, 1]])
    mask = torch.zeros(1, 1, 5, 14).masked_fill(~visible, float("-inf"))
    logits = {}
    for flag in ["0", "1"]:
        monkeypatch.setenv("TRANSFORMERS_SDPA_FORCE_GQA", flag)
        cache = DynamicCache(config=model.config)
        with torch.no_grad():
            model(prompt, past_key_values=cache, use_cache=True)
            positions = torch.tensor([[9, 10, 10, 11, 11]])
            logits[flag] = model(tree_tokens, position_ids=positions, attention_mask=mask, past_key_values=cache,
                                 use_cache=True).logits
    torch.testing.assert_close(logits["1"], logits["0"], rtol=0, atol=0)


def unset_gqa_flag_for_this_test(monkeypatch):
    """Unset the variable; whatever prepare_cpu_verify sets is undone after the test."""
    monkeypatch.setenv("TRANSFORMERS_SDPA_FORCE_GQA", "0")  # records the original state for the undo
    monkeypatch.delenv("TRANSFORMERS_SDPA_FORCE_GQA")


def test_prepare_cpu_verify_reports_what_it_did(monkeypatch):
    unset_gqa_flag_for_this_test(monkeypatch)
    model = tiny_model("llama", dtype=torch.float32)
    assert prepare_cpu_verify(model, enabled=False) == {"packed_linears": 0, "sdpa_force_gqa": False}
    done = prepare_cpu_verify(model)
    assert done["sdpa_force_gqa"] is True
    assert done["packed_linears"] == (sum(type(m) is nn.Linear for m in tiny_model("llama").modules())
                                      if mkl_packing_available() else 0)
    monkeypatch.setenv("TRANSFORMERS_SDPA_FORCE_GQA", "0")  # the user's choice stands
    assert prepare_cpu_verify(tiny_model("llama", dtype=torch.float32))["sdpa_force_gqa"] is False

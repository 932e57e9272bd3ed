"""The 1.5B target (Qwen2.5-Coder-1.5B-Instruct, joined from 22 wheels) decodes losslessly in fp32 (slow)."""

import pytest
import torch

from specheads.inference.batched import BatchedTreeDecoder
from specheads.inference.candidates import PromptLookupCandidates
from specheads.inference.decoder import TreeDecoder
from specheads.inference.generate import chat_input_ids, eos_token_ids
from specheads.inference.speculative import DraftModelCandidates, self_draft

pytestmark = pytest.mark.slow

PROMPTS = ["Write a Python function that checks whether a string is a palindrome.",
           "Explain what a Python list comprehension is, with an example.",
           "Fix this code: def add(a, b): return a - b"]


def test_qwen_builtin_loads_and_speculation_is_lossless_fp32():
    from specheads.data.models import load_base_model, load_tokenizer

    model = load_base_model("qwen2.5-coder-1.5b-instruct", "fp32")
    tokenizer = load_tokenizer("qwen2.5-coder-1.5b-instruct")
    assert model.config.model_type == "qwen2" and model.config.num_hidden_layers == 28
    eos = eos_token_ids(model, tokenizer)
    decoders = {"pld": TreeDecoder(model, candidates=PromptLookupCandidates(3, 8)),
                "sps": TreeDecoder(model, candidates=DraftModelCandidates(self_draft(model, 7), 3))}
    prompts, expected = [], []
    for text in PROMPTS:
        prompt = chat_input_ids(tokenizer, text)
        out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=40, do_sample=False,
                             eos_token_id=eos, pad_token_id=tokenizer.pad_token_id)
        prompts.append(prompt[0].tolist())
        expected.append(out[0, prompt.shape[1]:].tolist())
        for name, decoder in decoders.items():
            assert decoder.generate_ids(prompt, 40, eos_token_ids=eos) == expected[-1], name
    # batched: equal to HF's batched greedy on the same left-padded batch

    from specheads.inference.bench import hf_generate_batch

    batched = BatchedTreeDecoder(model, candidates=PromptLookupCandidates(3, 8))
    assert (batched.generate(prompts, 40, eos, pad_token_id=tokenizer.pad_token_id)
            == hf_generate_batch(model, tokenizer, prompts, 40, eos))

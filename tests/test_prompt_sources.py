"""Prompts beyond chat (data/prompt_sources.py): made offline, the same every time, never a benchmark question."""

import json
import sys
from pathlib import Path

import pytest

from specheads.data import prompt_sources

REPO = Path(__file__).resolve().parents[1]
COMMITTED = REPO / "data" / "prompts" / "offline-mix.jsonl"


def test_code_prompts_quote_real_standard_library_functions():
    prompts = {p["id"]: p["text"] for p in prompt_sources.code_prompts()}
    text = prompts["write/shlex.quote"]
    assert text.startswith("Write a Python function `quote(s)`") and "Return a shell-escaped version" in text
    explain = prompts["explain/shlex.quote"]
    assert "```python\ndef quote(s):" in explain and explain.rstrip().endswith("```")
    assert not any(".test." in i or i.split("/")[1].startswith("test.") for i in prompts)  # no test suites


def test_math_prompts_are_seeded_distinct_and_solvable():
    first, again = prompt_sources.math_prompts(20, seed=3), prompt_sources.math_prompts(20, seed=3)
    assert first == again and len(first) == 20 * len(prompt_sources.MATH_TEMPLATES)
    assert len({p["text"] for p in first}) == len(first)
    assert first != prompt_sources.math_prompts(20, seed=4)
    linear = next(p["text"] for p in first if p["id"] == "math/linear/1")
    a, rest = linear.removeprefix("Solve for x: ").split("x + ")
    b, c = rest.split(". ")[0].split(" = ")
    assert (int(c) - int(b)) % int(a) == 0  # an integer answer


def test_the_mix_classifies_outside_chat_and_shares_nothing_with_the_benchmark_questions():
    records = prompt_sources.offline_mix(300, 40, 10, seed=0)
    counts = prompt_sources.category_counts(records)
    assert counts["coding"] + counts["math"] + counts["extraction"] == len(records)
    texts = {" ".join(r["conversations"][0]["value"].lower().split()) for r in records}
    for name in ("sharegpt-test.jsonl", "sharegpt-tune.jsonl", "sharegpt-dev.jsonl"):
        for line in (REPO / "data" / "questions" / name).read_text().splitlines():
            for turn in json.loads(line)["turns"]:
                assert " ".join(turn.lower().split()) not in texts


@pytest.mark.skipif(sys.version_info[:2] != (3, 11), reason="the committed file was made from Python 3.11's library")
def test_the_committed_prompt_file_is_what_the_command_writes(tmp_path):
    prompt_sources.main(["--out", str(tmp_path / "mix.jsonl")])
    assert (tmp_path / "mix.jsonl").read_text() == COMMITTED.read_text()


def test_self_distill_answers_a_prompt_file(tmp_path):
    """A prompts-only file is what self_distill reads: every prompt is selected (none needs an answer)."""
    from specheads.data.distill import work_list
    from specheads.data.models import load_tokenizer
    from specheads.data.sharegpt import load_conversations

    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in prompt_sources.offline_mix(5, 2, 1)))
    conversations = load_conversations(str(path), require_answer=False)
    todo = work_list(conversations, load_tokenizer("smollm2-135m-instruct"), 1, 2048, None)
    assert [item[1] for item in todo] == [json.loads(line)["id"] for line in path.read_text().splitlines()]

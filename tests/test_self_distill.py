"""Self-distillation (specheads.data.distill, CLI scripts/self_distill.py): ShareGPT output, multi-turn order, resume after SIGKILL without loss or duplicates."""

import json
import subprocess
import sys
from pathlib import Path

from conftest import write_jsonl

REPO = Path(__file__).resolve().parent.parent


def conversations(n):
    return [{"id": f"c{i}", "conversations": [
        {"from": "human", "value": f"Question {i}?"}, {"from": "gpt", "value": "original answer"},
        {"from": "human", "value": "And more?"}, {"from": "gpt", "value": "original second answer"}]}
        for i in range(n)]


def run(args, kill_on_batch=None):
    code = "import specheads.data.distill as self_distill\n"
    if kill_on_batch is not None:
        code += f"""
import os, signal
original, calls = self_distill.answer_batch, [0]
def dying(*a, **k):
    calls[0] += 1
    if calls[0] == {kill_on_batch}:
        os.kill(os.getpid(), signal.SIGKILL)
    return original(*a, **k)
self_distill.answer_batch = dying
"""
    code += f"self_distill.main({args!r})\n"
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)


def test_self_distill_resumes_after_sigkill(tmp_path, tiny_llama_dir):
    data = tmp_path / "in.jsonl"
    write_jsonl(data, conversations(7))
    out = tmp_path / "out.jsonl"
    args = ["--model", str(tiny_llama_dir), "--dataset", str(data), "--out", str(out), "--batch-size", "2",
            "--max-turns", "2", "--max-new-tokens", "6", "--dtype", "fp32", "--temperature", "1.0"]
    # Two turns per batch: answer_batch call 5 is the first turn of the third batch.
    killed = run(args, kill_on_batch=5)
    assert killed.returncode == -9
    assert len(out.read_text().splitlines()) == 4
    with open(out, "a") as f:
        f.write('{"id": "torn", "conver')  # a half-written line, as a crash mid-write leaves
    resumed = run(args)
    assert resumed.returncode == 0, resumed.stderr
    assert "4 already written, 3 to go" in resumed.stdout
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in records] == [f"c{i}" for i in range(7)]
    for record in records:
        roles = [turn["from"] for turn in record["conversations"]]
        assert roles == ["human", "gpt", "human", "gpt"]
        assert "original" not in json.dumps(record)
    # the output is a dataset the trainer reads
    from specheads.data.sharegpt import load_conversations

    assert len(load_conversations(str(out))) == 7


def test_a_damaged_line_inside_the_output_stops_the_run_and_changes_nothing(tmp_path):
    """Only a torn last line (no newline) may be dropped on resume. A line without "id" in the middle used to cut
    the file back to the lines before it, without a word, exit 0 (issue 33, item 1)."""
    out = tmp_path / "answers.jsonl"
    out.write_text('{"id": "a", "conversations": []}\n{"conversations": []}\n{"id": "c", "conversations": []}\n')
    before = out.read_bytes()
    result = run(["--out", str(out), "--dataset", str(tmp_path / "never-read.jsonl")])
    assert result.returncode != 0
    assert f"self_distill.py: {out}, line 2: not a record with an \"id\"" in result.stderr
    assert out.read_bytes() == before
    out.write_bytes(b'{"id": "a"}\n\xff\xfe\n')
    result = run(["--out", str(out), "--dataset", str(tmp_path / "never-read.jsonl")])
    assert result.returncode != 0 and "line 2: not a record" in result.stderr and out.read_bytes() == b'{"id": "a"}\n\xff\xfe\n'


def test_numeric_flags_are_checked_when_parsed(capsys):
    """A value out of range stops the command before anything is read, with argparse's line naming the flag."""
    import pytest

    from specheads.data.distill import parse_args

    for flag, value, message in [("--batch-size", "0", "must be an integer >= 1, got 0"),
                                 ("--limit", "-5", "must be an integer >= 1, got -5"),
                                 ("--max-new-tokens", "x", "must be an integer, got 'x'"),
                                 ("--temperature", "-1", "must be a number >= 0, got -1"),
                                 ("--top-p", "1.5", "must be a number in (0, 1], got 1.5")]:
        with pytest.raises(SystemExit) as exit_info:
            parse_args(["--out", "never-written.jsonl", flag, value])
        assert exit_info.value.code == 2
        assert f"argument {flag}: {message}" in capsys.readouterr().err
    args = parse_args(["--out", "o.jsonl", "--batch-size", "3", "--temperature", "0.7", "--top-p", "0.9"])
    assert (args.batch_size, args.temperature, args.top_p, args.limit) == (3, 0.7, 0.9, None)


def test_skip_answers_the_same_slice_as_a_resumed_longer_run(tmp_path, tiny_llama_dir):
    """--skip 3 --limit 2 gives, line for line, what --limit 5 adds to a --limit 3 run's file: the committed
    data/distilled/*-3000-4800.jsonl style slices each have one command."""
    data = tmp_path / "in.jsonl"
    write_jsonl(data, conversations(6))
    common = ["--model", str(tiny_llama_dir), "--dataset", str(data), "--batch-size", "2", "--max-new-tokens", "5",
              "--dtype", "fp32"]
    chained = tmp_path / "chained.jsonl"
    for limit in ("3", "5"):
        assert run([*common, "--out", str(chained), "--limit", limit]).returncode == 0
    sliced = tmp_path / "sliced.jsonl"
    result = run([*common, "--out", str(sliced), "--skip", "3", "--limit", "2"])
    assert result.returncode == 0, result.stderr
    assert sliced.read_text().splitlines() == chained.read_text().splitlines()[3:]
    assert [json.loads(line)["id"] for line in sliced.read_text().splitlines()] == ["c3", "c4"]


def test_the_benchmark_test_and_tune_questions_are_never_distilled():
    """Distillation further along the train side (--skip past the committed files) would reach the conversations the
    test and tune questions come from: they are left out of every work list."""
    from specheads.data.distill import benchmark_conversations, work_list
    from specheads.data.sharegpt import Conversation

    class Tokenizer:
        def apply_chat_template(self, messages, **kwargs):
            return [0] * 3

    excluded = benchmark_conversations()
    assert len(excluded) >= 170  # 120 test + 58 tune questions, one original conversation each
    some = sorted(excluded)[0]
    conversations = [Conversation(id=f"{some}_0", messages=[{"role": "user", "content": "q"}]),
                     Conversation(id=f"{some}_3", messages=[{"role": "user", "content": "q"}]),
                     Conversation(id="kept_0", messages=[{"role": "user", "content": "q"}])]
    assert [item[1] for item in work_list(conversations, Tokenizer(), 1, 512, None, excluded)] == ["kept_0"]


def test_train_and_heldout_split_the_answered_conversations_as_training_does(tmp_path):
    """--split train / heldout: a prompt-only record in the data does not move the split (it did, and a T=1
    distillation of ShareGPT's train side took 22 held-out conversations); --split all keeps it."""
    from specheads.data.distill import source_conversations
    from specheads.data.sharegpt import load_conversations, split_heldout

    records = [{"id": f"a{i}", "conversations": [{"from": "human", "value": f"question {i}"},
                                                 {"from": "gpt", "value": f"answer {i}"}]} for i in range(30)]
    for i in (3, 11, 20):
        records.insert(i, {"id": f"p{i}", "conversations": [{"from": "human", "value": f"prompt only {i}"}]})
    data = tmp_path / "data.jsonl"
    write_jsonl(data, records)
    train, heldout = split_heldout(load_conversations(str(data)), 8, 0)
    for split, expected in (("train", train), ("heldout", heldout)):
        assert [c.id for c in source_conversations(str(data), split, 8, 0)] == [c.id for c in expected]
    assert {c.id for c in source_conversations(str(data), "all", 8, 0)} == {r["id"] for r in records}

"""Issue 33, bad input files: bench questions and training data stop with one line naming the file, line and field.

Each bad file is fed to the real entry point as a user would run it (a subprocess from the repository root) and
must end with a non-zero exit, one line on stderr that names the culprit, no traceback, and every file that was
there before left byte for byte as it was. Questions are checked before any model loads (the tests pass a model
path that does not exist: reaching it would be a different error).
"""

import json
from pathlib import Path

import pytest

from specheads.data import sharegpt
from specheads.data.sharegpt import load_conversations

from conftest import Started, snapshot, synthetic_sharegpt, write_jsonl

REPO = Path(__file__).resolve().parent.parent


def assert_one_line_error(result, *names):
    """Non-zero exit, no traceback, a single stderr line naming every one of `names`."""
    assert result.returncode != 0, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for name in names:
        assert str(name) in lines[0], (name, lines[0])
    return lines[0]


def raised(call, *args) -> BaseException:
    """The exception call(*args) raises (pytest.fail when it returns)."""
    try:
        call(*args)
    except Exception as err:  # noqa: BLE001 - the type is what the test checks
        return err
    pytest.fail(f"{call.__name__}{args} raised nothing")


def assert_data_error(err, prefix, *words):
    """A DataFileError whose single-line message starts with `prefix` (file:line:) and holds `words`."""
    assert isinstance(err, sharegpt.DataFileError), f"{type(err).__name__}: {err}"
    message = str(err)
    assert message.startswith(prefix) and "\n" not in message, message
    for word in words:
        assert word in message, (word, message)


def load_bench():
    from specheads.inference import bench

    return bench


GOOD_QUESTION = {"question_id": "q0", "category": "qa", "turns": ["Hello", "And then?"]}

# (what is wrong, the bad line, the words the error must hold besides file and line)
BAD_QUESTIONS = {
    "string turns": ({"question_id": "q1", "category": "qa", "turns": "Hello"}, ["'turns'", "list"]),
    "empty turns": ({"question_id": "q1", "category": "qa", "turns": []}, ["'turns'", "empty"]),
    "broken line": ('{"question_id": "q1", "category": "qa", "turns": ["Hel', ["JSON"]),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every subprocess of this module, started at once (each one mostly imports; together they take the time of
    about two): {case: (the run, its folder, the bad file, the folder's hashes before)}."""
    started = {}
    for case, (line, _) in BAD_QUESTIONS.items():
        folder = tmp_path_factory.mktemp("questions")
        questions = folder / "q.jsonl"
        questions.write_text(json.dumps(GOOD_QUESTION) + "\n" + (line if isinstance(line, str) else json.dumps(line))
                             + "\n")
        before = snapshot(folder)
        run = Started("scripts/bench.py", "--model", folder / "no-such-model", "--methods", "baseline,plain",
                      "--questions", questions, "--out", folder / "out")
        started[case] = (run, folder, questions, before)
    folder = tmp_path_factory.mktemp("data")
    data = folder / "d.jsonl"
    write_jsonl(data, synthetic_sharegpt(2))
    with open(data, "a") as f:
        f.write("42\n")
    write_jsonl(folder / "out.jsonl", synthetic_sharegpt(1))  # a previous run's output: must stay as it is
    before = snapshot(folder)
    run = Started("scripts/self_distill.py", "--model", folder / "no-such-model", "--dataset", data,
                  "--out", folder / "out.jsonl")
    started["data"] = (run, folder, data, before)
    yield started
    for run, *_ in started.values():
        run.process.kill()
        run.process.communicate()


@pytest.mark.parametrize("case", list(BAD_QUESTIONS))
def test_bench_questions_are_checked_before_the_model_loads(runs, case):
    run, folder, questions, before = runs[case]
    assert_one_line_error(run.result(), f"{questions}:2:", *BAD_QUESTIONS[case][1])
    assert snapshot(folder) == before  # nothing written, nothing changed


@pytest.mark.parametrize("line, words", [
    ('[1, 2]', ["not a JSON object"]),
    ({"category": "qa", "turns": ["hi"]}, ["'question_id'"]),
    ({"question_id": ["x"], "category": "qa", "turns": ["hi"]}, ["'question_id'"]),
    ({"question_id": "q", "turns": ["hi"]}, ["'category'"]),
    ({"question_id": "q", "category": 3, "turns": ["hi"]}, ["'category'"]),
    ({"question_id": "q", "category": "qa", "turns": ["hi", 3]}, ["'turns'", "turn 2"]),
    ({"question_id": "q", "category": "qa", "turns": ["hi", "  "]}, ["'turns'", "turn 2", "empty"]),
    ({"question_id": "q", "category": "qa", "turns": None}, ["'turns'"]),
])
def test_bench_questions_name_line_and_field(tmp_path, line, words):
    bench = load_bench()
    questions = tmp_path / "q.jsonl"
    questions.write_text(json.dumps(GOOD_QUESTION) + "\n\n" + (line if isinstance(line, str) else json.dumps(line)) + "\n")
    with pytest.raises(ValueError) as err:
        bench.load_questions(questions)
    message = str(err.value)
    assert message.startswith(f"{questions}:3: ") and "\n" not in message
    for word in words:
        assert word in message, (word, message)


def test_bench_questions_file_not_utf8_or_missing(tmp_path):
    bench = load_bench()
    questions = tmp_path / "q.jsonl"
    questions.write_bytes(json.dumps(GOOD_QUESTION).encode() + b"\n" + b'{"question_id": "\xff"}\n')
    with pytest.raises(ValueError, match=f"^{questions}:2: not UTF-8"):
        bench.load_questions(questions)
    with pytest.raises(ValueError, match=f"^{tmp_path / 'gone.jsonl'}: no such file"):
        bench.load_questions(tmp_path / "gone.jsonl")
    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps(GOOD_QUESTION) + "\n" + json.dumps({**GOOD_QUESTION, "question_id": 7}) + "\n")
    assert [q["question_id"] for q in bench.load_questions(good)] == ["q0", 7]


def test_committed_questions_pass_the_checks():
    bench = load_bench()
    assert len(bench.load_questions(REPO / "data" / "questions" / "sharegpt-dev.jsonl")) == 40


# ---- training data (data/sharegpt.py) ----

def test_data_line_that_is_not_an_object(tmp_path):
    path = tmp_path / "d.jsonl"
    write_jsonl(path, synthetic_sharegpt(2))
    with open(path, "a") as f:
        f.write('["not", "a", "record"]\n')
    assert_data_error(raised(load_conversations, str(path)), f"{path}:3: ", "not a JSON object")
    array = tmp_path / "d.json"
    array.write_text("[\n" + json.dumps(synthetic_sharegpt(1)[0]) + ",\n  42\n]\n")
    assert_data_error(raised(load_conversations, str(array)), f"{array}:3: ", "not a JSON object")


def test_data_not_utf8(tmp_path):
    path = tmp_path / "d.jsonl"
    write_jsonl(path, synthetic_sharegpt(2))
    with open(path, "ab") as f:
        f.write(b'{"id": "x", "conversations": [{"from": "human", "value": "caf\xe9"}]}\n')
    assert_data_error(raised(load_conversations, str(path)), f"{path}:3: ", "not UTF-8")
    array = tmp_path / "d.json"
    array.write_bytes(b'[\n{"id": "x", "conversations": [{"from": "human", "value": "caf\xe9"}]}\n]\n')
    assert_data_error(raised(load_conversations, str(array)), f"{array}:2: ", "not UTF-8")


@pytest.mark.parametrize("name", ["gone.jsonl", "gone.json", "gone.JSONL"])
def test_data_missing_file(tmp_path, name):
    err = raised(load_conversations, str(tmp_path / name))
    assert_data_error(err, f"{tmp_path / name}: ", "no such file")
    assert isinstance(err, FileNotFoundError)  # still what callers catching FileNotFoundError expect


@pytest.mark.parametrize("name", ["X.JSONL", "X.Json"])
def test_data_suffix_in_any_case(tmp_path, name):
    records = synthetic_sharegpt(3)
    if name.lower().endswith(".jsonl"):
        write_jsonl(tmp_path / name, records)
    else:
        (tmp_path / name).write_text(json.dumps(records))
    assert [c.id for c in load_conversations(str(tmp_path / name))] == ["c0", "c1", "c2"]


def test_data_error_through_an_entry_point(runs):
    """self_distill.py reads the data before its model: a bad line is one line on stderr, the output untouched."""
    run, folder, data, before = runs["data"]
    assert_one_line_error(run.result(), f"{data}:3:", "not a JSON object")
    assert snapshot(folder) == before


def test_torch_floor_loads_weights_only():
    """torch.load reads only tensors by default from torch 2.6 on (weights_only=True); the package must not allow
    an older torch, where one call without the argument would run whatever a pickle holds."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    from packaging.requirements import Requirement

    dependencies = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    torch_req = next(Requirement(d) for d in dependencies if Requirement(d).name == "torch")
    assert not torch_req.specifier.contains("2.5.1") and torch_req.specifier.contains("2.6.0"), torch_req


# ---- issue 45: self-distillation's output file ----------------------------------------------------------------


def test_distill_keeps_a_complete_last_record_without_newline(tmp_path, tiny_llama_dir):
    """A hand-edited --out whose complete last record has no final newline: the record is kept (its newline
    added) and not answered again; only a tail that does not parse (a torn write) is dropped, and stderr says so.
    The last record used to be taken for a torn write and deleted without a word."""
    records = synthetic_sharegpt(3)
    write_jsonl(tmp_path / "d.jsonl", records)
    hand_edited, torn = tmp_path / "edited.jsonl", tmp_path / "torn.jsonl"
    hand_edited.write_text(json.dumps(records[0]) + "\n" + json.dumps(records[1]))  # no final newline
    torn.write_text(json.dumps(records[0]) + "\n" + json.dumps(records[1])[:25])  # killed mid-write
    runs = {out: Started("scripts/self_distill.py", "--model", tiny_llama_dir, "--dataset", tmp_path / "d.jsonl",
                         "--out", out, "--max-new-tokens", "2", "--dtype", "fp32") for out in (hand_edited, torn)}
    results = {out: run.result() for out, run in runs.items()}
    for out, result in results.items():
        assert result.returncode == 0, result.stderr[-3000:]
        lines = out.read_text().splitlines(keepends=True)
        ids = [json.loads(line)["id"] for line in lines]
        assert ids[0] == "c0" and sorted(ids) == ["c0", "c1", "c2"] and all(line.endswith("\n") for line in lines)
    edited = hand_edited.read_text().splitlines()
    assert json.loads(edited[1]) == records[1]  # the hand-written record kept in place, not a regenerated one
    assert "1 to go" in results[hand_edited].stdout and "dropped" not in results[hand_edited].stderr
    assert "2 to go" in results[torn].stdout
    assert f"{torn}: dropped a torn last line" in results[torn].stderr


def test_distill_out_that_is_the_dataset_or_cannot_be_written(tmp_path):
    """--out on the --dataset file itself (it would be read as already answered and appended to), or where no file
    can be written: one line naming both, before any model loads, nothing changed."""
    data = tmp_path / "d.jsonl"
    write_jsonl(data, synthetic_sharegpt(2))
    (tmp_path / "a-file").write_text("x")
    before = snapshot(tmp_path)
    runs = [Started("scripts/self_distill.py", "--model", tmp_path / "no-such-model", "--dataset", data, "--out", out)
            for out in (data, tmp_path / "a-file" / "out.jsonl")]
    assert_one_line_error(runs[0].result(), "self_distill.py", f"output file {data}", f"--dataset itself ({data})")
    assert_one_line_error(runs[1].result(), "self_distill.py", str(tmp_path / "a-file"), "cannot be written")
    assert snapshot(tmp_path) == before

"""Issue 33, decoding command lines: bad numbers and trees are one-line errors naming the flag; Ctrl-C is quiet.

chat.py and bench.py are run as a user runs them (subprocesses from the repository root) where the outcome is the
point (exit status, stderr, files); the full table of bad values goes through each script's own argument parser.
"""

import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from specheads.inference import chat

from conftest import Started, snapshot

REPO = Path(__file__).resolve().parent.parent


def assert_flag_error(result, *names) -> str:
    """Non-zero exit, no traceback; stderr's last line (argparse prints its usage above it) names `names`."""
    assert result.returncode != 0, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    for name in names:
        assert name in last, (name, result.stderr)
    return last


def error_lines(result) -> list[str]:
    """stderr without progress bars (transformers draws one while it loads weights)."""
    return [line for line in result.stderr.strip().splitlines() if not re.search(r"\|\s*\d+/\d+ \[", line)]


def load_bench():
    from specheads.inference import bench

    return bench


@pytest.fixture(scope="module")
def bench():
    return load_bench()


@pytest.fixture(scope="module")
def heads_dir(tmp_path_factory, tiny_llama_dir):
    from transformers import AutoConfig

    from specheads.heads import MedusaConfig, MedusaHeads

    torch.manual_seed(0)
    heads = MedusaHeads(MedusaConfig.for_base(AutoConfig.from_pretrained(tiny_llama_dir), str(tiny_llama_dir),
                                              num_heads=2))
    path = tmp_path_factory.mktemp("heads")
    heads.save_pretrained(path, extra={"tree": [[0], [1], [0, 0]]})
    return path


def parse_error(parse, argv, capsys) -> str:
    """The one error line a script's parser prints for argv (it must exit with status 2)."""
    with pytest.raises(SystemExit) as exit_info:
        parse(argv)
    assert exit_info.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


# ---- numeric flags ----

CHAT_BAD = [("--max-new-tokens", "-5"), ("--max-new-tokens", "0"), ("--top-p", "1.5"), ("--top-p", "0"),
            ("--top-p", "nan"), ("--temperature", "-1"), ("--temperature", "inf"), ("--top-k", "-1"),
            ("--tree-top-k", "0"), ("--tree-depth", "0"), ("--tree-tokens", "1"), ("--tree-min-prob", "1.5"),
            ("--tree-min-prob", "-0.1")]
BENCH_BAD = [("--max-new-tokens", "-5"), ("--top-p", "1.5"), ("--temperature", "-0.5"), ("--pld-tokens", "0"),
             ("--pld-trusted-ngram", "0"), ("--pld-trusted-tokens", "-1"), ("--draft-layers", "0"), ("--gamma", "0"),
             ("--gamma", "four"), ("--lookahead-window", "0"), ("--lookahead-ngram", "1"), ("--lookahead-pool", "0"),
             ("--max-questions", "0"), ("--skip-questions", "-1"), ("--batch-size", "0"), ("--eagle-top-k", "0"),
             ("--eagle-depth", "-2"), ("--eagle-tokens", "1"), ("--eagle-min-prob", "1")]


@pytest.mark.parametrize("flag, value", CHAT_BAD)
def test_chat_rejects_bad_numbers(flag, value, capsys):
    line = parse_error(chat.parse_args, [flag, value], capsys)
    assert f"argument {flag}:" in line and value in line


@pytest.mark.parametrize("flag, value", BENCH_BAD)
def test_bench_rejects_bad_numbers(bench, flag, value, capsys):
    line = parse_error(bench.parse_args, [flag, value], capsys)
    assert f"argument {flag}:" in line and value in line


def test_good_numbers_still_parse(bench):
    args = chat.parse_args(["--max-new-tokens", "1", "--top-p", "1", "--temperature", "0", "--top-k", "0",
                            "--tree-min-prob", "0", "--tree-tokens", "2"])
    assert (args.max_new_tokens, args.top_p, args.temperature, args.top_k, args.eagle_min_prob) == (1, 1.0, 0.0, 0, 0.0)
    args = bench.parse_args(["--gamma", "3", "--skip-questions", "0", "--top-p", "0.9", "--eagle-min-prob", "0.5"])
    assert (args.gamma, args.skip_questions, args.top_p, args.eagle_min_prob) == ("3", 0, 0.9, 0.5)
    assert bench.parse_args([]).gamma == "auto"


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_llama_dir, heads_dir):
    """The end-to-end runs of this module's tests, started at once (each mostly imports and loads the tiny model;
    together they take the time of about two): {name: (the run, its scratch folder)}, and "before": the hashes of
    every file the runs may read."""
    folder = tmp_path_factory.mktemp("runs")
    questions = folder / "q.jsonl"
    questions.write_text(json.dumps({"question_id": "a", "category": "qa", "turns": ["Hello"]}) + "\n")
    chat_py, bench_py, model, heads = "inference/chat.py", "scripts/bench.py", tiny_llama_dir, heads_dir
    before = snapshot(folder, tiny_llama_dir, heads_dir)
    started = {
        "chat --max-new-tokens": Started(chat_py, "--model", model, "--no-heads", "--prompt", "Hi", "--max-new-tokens", "-5"),
        "bench --top-p": Started(bench_py, "--model", folder / "no-such-model", "--methods", "baseline", "--top-p", "1.5",
                                 "--questions", questions, "--out", folder / "out-top-p"),
        "chat --tree object": Started(chat_py, "--model", model, "--heads", heads, "--prompt", "Hi", "--tree", '{"a":1}'),
        "chat --tree rank": Started(chat_py, "--model", model, "--heads", heads, "--prompt", "Hi", "--max-new-tokens", "4",
                                    "--tree", "[[100000]]"),
        "bench --tree rank": Started(bench_py, "--model", model, "--heads", heads, "--methods", "medusa",
                                     "--questions", questions, "--max-new-tokens", "4", "--tree", "[[0], [100000]]",
                                     "--out", folder / "out-tree"),
        "bench --draft-layers": Started(bench_py, "--model", model, "--methods", "baseline,sps", "--draft-layers", "99",
                                        "--questions", questions, "--max-new-tokens", "4", "--out", folder / "out-sps"),
    }
    yield started, before, (folder, tiny_llama_dir, heads_dir)
    for run in started.values():
        run.process.kill()
        run.process.communicate()


def finished(runs, name) -> subprocess.CompletedProcess:
    """The run's outcome, every file it could have touched checked unchanged."""
    started, before, roots = runs
    result = started[name].result()
    assert snapshot(*roots) == before, name
    return result


def test_chat_negative_max_new_tokens_end_to_end(runs):
    result = finished(runs, "chat --max-new-tokens")
    assert_flag_error(result, "--max-new-tokens", "-5")
    assert result.stdout == ""


def test_bench_top_p_end_to_end(runs):
    assert_flag_error(finished(runs, "bench --top-p"), "--top-p", "1.5")


# ---- --tree ----

TREE_BAD = [("[[100000]]", None),  # rank too large: only the heads know, see below
            ('{"a":1}', "a JSON list of rank paths"), ("[[0], [1", "not valid JSON"), ("[0, 1]", "path 0 must be a list"),
            ("[[-1]]", "non-negative"), ("[[true]]", "non-negative integers"), ("[[0.5]]", "non-negative integers"),
            ("[[0], [0]]", "duplicate"), ("[[0, 0]]", "orphan"), ("[[]]", "empty path")]


@pytest.mark.parametrize("text, words", [t for t in TREE_BAD if t[1]])
def test_tree_option_is_checked_when_parsed(bench, text, words, capsys):
    for parse, flag in ((chat.parse_args, "--tree"), (bench.parse_args, "--tree"), (bench.parse_args, "--pld-heads-tree")):
        line = parse_error(parse, [flag, text], capsys)
        assert f"argument {flag}:" in line and words in line, line


def test_tree_object_end_to_end(runs):
    assert_flag_error(finished(runs, "chat --tree object"), "--tree", "JSON list")


def test_tree_rank_beyond_the_heads_vocabulary_chat(runs, heads_dir):
    vocab = json.loads((heads_dir / "config.json").read_text())["vocab_size"]
    result = finished(runs, "chat --tree rank")
    assert_flag_error(result, "--tree", "100000", str(vocab))
    assert len(error_lines(result)) == 1 and result.stdout == "", result.stderr


def test_tree_deeper_than_the_heads_chat(tiny_llama_dir, heads_dir):
    """Checked in-process: the same code path as above, with the 2-head limit."""
    args = chat.parse_args(["--model", str(tiny_llama_dir), "--heads", str(heads_dir), "--tree", "[[0], [0, 0], [0, 0, 0]]"])
    with pytest.raises(SystemExit) as err:
        chat.load_generator(args)
    assert str(err.value).startswith("--tree: ") and "2 heads" in str(err.value)


@pytest.mark.parametrize("flags, words", [(["--tree", "[[0]]"], "a static tree (--tree) is for Medusa heads"),
                                          (["--tree-top-k", "100000"], "top_k 100000 exceeds the")])
def test_eagle_draft_tree_flags_are_checked(tmp_path, tiny_llama_dir, flags, words):
    """--tree with an EAGLE draft was ignored without a word; a --tree-top-k beyond the draft's vocabulary ended in
    'selected index k out of range' mid-decoding. Both stop before decoding with one line."""
    from transformers import AutoConfig

    from specheads.heads import EagleConfig, EagleDraft

    config = AutoConfig.from_pretrained(tiny_llama_dir)
    EagleDraft(EagleConfig.for_base(config, str(tiny_llama_dir), variant="eagle3")).save_pretrained(tmp_path / "d")
    args = chat.parse_args(["--model", str(tiny_llama_dir), "--heads", str(tmp_path / "d"), *flags])
    with pytest.raises(SystemExit) as err:
        chat.load_generator(args)
    assert words in str(err.value)


def test_bench_draft_layers_beyond_the_model(runs):
    result = finished(runs, "bench --draft-layers")
    assert_flag_error(result, "--draft-layers", "99")


def test_tree_rank_beyond_the_heads_vocabulary_bench(runs):
    result = finished(runs, "bench --tree rank")
    assert_flag_error(result, "--tree", "100000")
    assert len(error_lines(result)) == 1, result.stderr


# ---- Ctrl-C ----

def test_ctrl_c_while_answering_a_prompt(tiny_llama_dir, tmp_path):
    """SIGINT while chat.py --prompt is writing its answer: exit 130, no traceback, what was shown stays shown."""
    # The tiny model's 512 positions end an answer within a second or two: on a busy machine the answer could be
    # over before the signal arrives. A copy with room for 100,000 tokens answers for minutes.
    model = tmp_path / "long-tiny"
    shutil.copytree(tiny_llama_dir, model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 1 << 17}))
    before = snapshot(model)
    process = subprocess.Popen([sys.executable, "inference/chat.py", "--model", str(model), "--no-heads",
                                "--prompt", "Tell me a long story.", "--max-new-tokens", "100000", "--dtype", "fp32"],
                               cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               # as from a terminal: a shell's background job (`make test &`) ignores SIGINT, and
                               # its children would inherit that and never see the Ctrl-C
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        shown = b""
        deadline = time.monotonic() + 120
        while len(shown) < 20 and time.monotonic() < deadline:  # the answer is streaming
            ready, _, _ = select.select([process.stdout], [], [], 1.0)
            if ready:
                chunk = os.read(process.stdout.fileno(), 4096)
                assert chunk, "chat.py ended before the interrupt: " + process.stderr.read().decode()
                shown += chunk
        assert len(shown) >= 20, "no answer within 120 s"
        process.send_signal(signal.SIGINT)
        rest, err = process.communicate(timeout=60)
    finally:
        process.kill()
    err = err.decode()
    assert process.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    out = shown + rest
    assert out.startswith(shown) and len(out) >= 20  # nothing already written is taken back
    assert snapshot(model) == before


# ---- issue 45: the bench's folders and --out, long prompts, build_tree on drafts it does not tune ----

@pytest.fixture(scope="module")
def drafts_dirs(tmp_path_factory, tiny_llama_dir):
    """An EAGLE-3 draft and a DFlash drafter for the tiny Llama: {"eagle3": folder, "dflash": folder}."""
    from transformers import AutoConfig

    from specheads.heads import DFlashConfig, DFlashDraft, EagleConfig, EagleDraft

    config = AutoConfig.from_pretrained(tiny_llama_dir)
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("drafts")
    EagleDraft(EagleConfig.for_base(config, str(tiny_llama_dir), variant="eagle3")).save_pretrained(folder / "eagle3")
    DFlashDraft(DFlashConfig.for_base(config, str(tiny_llama_dir))).save_pretrained(folder / "dflash")
    return {"eagle3": folder / "eagle3", "dflash": folder / "dflash"}


@pytest.fixture(scope="module")
def runs45(tmp_path_factory, tiny_llama_dir, heads_dir, drafts_dirs):
    """This section's end-to-end runs, started at once: {name: run}, then the scratch folder and the hashes of
    every file the runs may read (each refused run must leave them as they were)."""
    folder = tmp_path_factory.mktemp("runs45")
    questions = folder / "q.jsonl"
    questions.write_text(json.dumps({"question_id": "a", "category": "qa", "turns": ["Hello"]}) + "\n")
    long_questions = folder / "long.jsonl"
    long_questions.write_text(json.dumps({"question_id": "a", "category": "qa", "turns": ["Hello"]}) + "\n" +
                              json.dumps({"question_id": "long-one", "category": "qa", "turns": ["hello " * 700]}) + "\n")
    (folder / "a-file").write_text("not a folder\n")
    bench_py, missing_model, model = "scripts/bench.py", folder / "no-such-model", tiny_llama_dir
    before = snapshot(folder, tiny_llama_dir, heads_dir, *drafts_dirs.values())
    started = {
        # checked before the model loads: the model named does not exist
        "missing --drafts": Started(bench_py, "--model", missing_model, "--methods", "eagle3", "--drafts",
                                    folder / "no-such-draft", "--questions", questions, "--out", folder / "o1"),
        "wrong --heads": Started(bench_py, "--model", missing_model, "--methods", "medusa", "--heads", tiny_llama_dir,
                                 "--questions", questions, "--out", folder / "o2"),
        "unwritable --out": Started(bench_py, "--model", missing_model, "--methods", "baseline", "--questions",
                                    questions, "--out", folder / "a-file" / "bench"),
        "long prompt bench": Started(bench_py, "--model", model, "--methods", "baseline,plain", "--questions",
                                     long_questions, "--max-new-tokens", "2", "--out", folder / "o3"),
        "long prompt chat": Started("inference/chat.py", "--model", model, "--no-heads", "--prompt", "hello " * 700,
                                    "--max-new-tokens", "2"),
        "build_tree eagle": Started("scripts/build_tree.py", "--heads", drafts_dirs["eagle3"], "--model", model),
        "build_tree dflash": Started("scripts/build_tree.py", "--heads", drafts_dirs["dflash"], "--model", model),
    }
    yield started, folder, before
    for run in started.values():
        run.process.kill()
        run.process.communicate()


def refused45(runs45, name, *words) -> str:
    started, folder, before = runs45
    result = started[name].result()
    last = assert_flag_error(result, *words)
    assert len(error_lines(result)) == 1, result.stderr
    assert snapshot(*before.keys()) == before, name
    return last


def test_bench_missing_drafts_folder_is_one_line_before_the_model_loads(runs45):
    refused45(runs45, "missing --drafts", "--drafts", "no-such-draft", "config.json is missing")


def test_bench_heads_that_are_not_heads_is_one_line_before_the_model_loads(runs45, tiny_llama_dir):
    refused45(runs45, "wrong --heads", "--heads", f"{tiny_llama_dir / 'config.json'}", "not a heads folder")


def test_bench_out_that_cannot_be_written_is_found_before_the_run(runs45):
    """It was found after the whole benchmark had run, its results lost; now before any model loads."""
    _, folder, _ = runs45
    refused45(runs45, "unwritable --out", "--out", str(folder / "a-file" / "bench"), "cannot be written")


def test_prompt_longer_than_the_context_bench_and_chat(runs45):
    """The message existed (inference/verify.py) but ended a traceback; the bench names the question and turn, and
    stops before timing any question."""
    _, folder, _ = runs45
    refused45(runs45, "long prompt bench", "--questions", str(folder / "long.jsonl"), "'long-one', turn 1",
              "more than the model's 512 positions")
    refused45(runs45, "long prompt chat", "chat.py: --prompt", "more than the model's 512 positions")
    assert not (folder / "o3").joinpath("results.json").exists()


def test_build_tree_on_an_eagle_or_dflash_folder_says_what_to_use(runs45, drafts_dirs):
    refused45(runs45, "build_tree eagle", "--heads", str(drafts_dirs["eagle3"]), "EAGLE draft", "tune_eagle_tree.py")
    refused45(runs45, "build_tree dflash", "--heads", str(drafts_dirs["dflash"]), "DFlash drafter",
              f"\"tree\" in {drafts_dirs['dflash'] / 'config.json'}", "--tree")


def test_bench_mixes_medusa_with_tree_and_an_eagle_draft(tmp_path, tiny_llama_dir, heads_dir, drafts_dirs):
    """--tree is the Medusa (and DFlash) methods' static tree: an EAGLE method in the same run leaves it aside (it
    grows its own tree) instead of refusing the whole run, as it did since the methods registry."""
    questions = tmp_path / "q.jsonl"
    questions.write_text(json.dumps({"question_id": "a", "category": "qa", "turns": ["Hello"]}) + "\n")
    result = Started("scripts/bench.py", "--model", tiny_llama_dir, "--methods", "medusa,eagle3", "--heads", heads_dir,
                     "--drafts", drafts_dirs["eagle3"], "--tree", "[[0], [1]]", "--questions", questions,
                     "--max-new-tokens", "4", "--out", tmp_path / "out").result()
    assert result.returncode == 0, result.stderr[-3000:]
    methods = json.loads((tmp_path / "out" / "results.json").read_text())["methods"]
    assert {"baseline", "medusa", "eagle3"} <= set(methods)
    from specheads.inference.bench.runner import scoped_options
    from specheads.inference.methods import MethodOptions

    options = MethodOptions(tree=[[0], [1]])
    assert scoped_options("eagle3", options).tree is None and scoped_options("medusa", options).tree == [[0], [1]]
    assert scoped_options("dflash", options).tree == [[0], [1]] and scoped_options("medusa:a", options) is options

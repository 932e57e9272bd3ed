"""Every command in the README and docs/, as pasted, parses: a `python X.py ...` line (also behind `accelerate
launch`) is run with its own arguments up to where it would start work (argparse, and for the trainers the config
with its overrides), and a `make` line names a target the Makefiles have. `[...]` marks optional parts and is left
out; `vllm` lines are the engine's own command line and are checked for the settings a CPU needs."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "heads" / "trained" / "README.md"]

# One fresh interpreter runs every command's argument parsing (and a trainer's config loading) as the script would,
# then stops it before any model loads: exit 0 where it parsed, argparse's or the config's exit code (2) and
# one-line message where it did not. Commands come as JSON [[script, args], ...]; results go out as JSON.
SHIM = r"""
import argparse, contextlib, io, json, runpy, sys
import specheads.train.trainer as trainer

class Parsed(SystemExit):
    pass

def configured(self, *args, **kwargs):
    raise Parsed(0)

trainer.Trainer.__init__ = configured
original = argparse.ArgumentParser.parse_args

def parse_args(self, args=None, namespace=None):
    namespace = original(self, args, namespace)
    if not sys.argv[0].startswith("train/"):  # a trainer goes on to load its config
        raise Parsed(0)
    return namespace

argparse.ArgumentParser.parse_args = parse_args
results = []
for script, arguments in json.loads(sys.argv[1]):
    sys.argv = [script, *arguments]
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = runpy.run_path(script, run_name="__main__")
        code = 1  # ran to the end without reaching a parse or a trainer: the shim missed it
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    results.append([code, err.getvalue()[-2000:]])
print(json.dumps(results))
"""


def parse_all(commands: list[tuple[str, list[str]]]) -> list[tuple[int, str]]:
    result = subprocess.run([sys.executable, "-c", SHIM, json.dumps(commands)], cwd=REPO, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def doc_commands():
    """(doc, line number, command) of every command line in a ```bash block, continuations joined."""
    found = []
    for doc in DOCS:
        inside, pending, start = False, "", 0
        for number, line in enumerate(doc.read_text().splitlines(), 1):
            if line.startswith("```"):
                inside = not inside and line.strip() in ("```bash", "```sh", "```shell")
                continue
            if not inside:
                continue
            if not pending:
                start = number
            pending += line.rstrip()
            if pending.endswith("\\"):
                pending = pending[:-1] + " "
                continue
            line_commands, pending = re.sub(r"\s#\s.*$", "", pending).strip(), ""
            for command in (c.strip() for c in line_commands.split(" && ")):
                if command and not command.startswith("#"):
                    found.append((str(doc.relative_to(REPO)), start, command))
    return found


COMMANDS = doc_commands()


def script_and_arguments(command: str) -> tuple[str, list[str]] | None:
    """`python X.py ARGS` or `accelerate launch [its flags] X.py ARGS` -> (X.py, ARGS); else None."""
    import shlex

    words = shlex.split(re.sub(r"\s\[[^\]]*\]", "", command))  # optional parts: [--resume], [section.key=value ...]
    while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):  # VAR=value prefixes
        words = words[1:]
    if words[:1] and words[0].endswith("python") or words[:1] == ["python3"]:
        return words[1], words[2:]
    if words[:2] == ["accelerate", "launch"]:
        script = next(i for i, w in enumerate(words) if w.endswith(".py"))
        return words[script], words[script + 1:]
    return None


def test_the_docs_hold_commands():
    kinds = {c.split()[0] for _, _, c in COMMANDS}
    assert {"python", "make", "accelerate"} <= kinds and len(COMMANDS) > 30


PYTHON_COMMANDS = [c for c in COMMANDS if script_and_arguments(c[2])]


@pytest.fixture(scope="module")
def parsed():
    return dict(zip([c[2] for c in PYTHON_COMMANDS], parse_all([script_and_arguments(c) for _, _, c in PYTHON_COMMANDS])))


@pytest.mark.parametrize("doc, line, command", PYTHON_COMMANDS)
def test_python_command_parses_as_pasted(doc, line, command, parsed):
    script, _ = script_and_arguments(command)
    assert (REPO / script).is_file(), f"{doc}:{line}: {script} does not exist"
    code, stderr = parsed[command]
    assert code == 0, f"{doc}:{line}: `{command}` does not parse:\n{stderr}"


MAKEFILES = "".join(p.read_text() for p in REPO.glob("*.mk")) + (REPO / "Makefile").read_text()


@pytest.mark.parametrize("doc, line, command", [c for c in COMMANDS if c[2].split()[0] == "make"])
def test_make_command_names_a_target(doc, line, command):
    targets = [w for w in command.split()[1:] if "=" not in w and not w.startswith("-")]
    for target in targets or ["all"]:
        assert re.search(rf"^{re.escape(target)}:", MAKEFILES, re.M), f"{doc}:{line}: no make target {target!r}"


def section_of(doc: str, line: int) -> str:
    """The `## ` heading above a line of a doc."""
    headings = [text for text in (REPO / doc).read_text().splitlines()[:line] if text.startswith("## ")]
    return headings[-1] if headings else ""


@pytest.mark.parametrize("doc, line, command", [c for c in COMMANDS if "vllm serve" in c[2]])
def test_vllm_command_says_what_a_cpu_needs(doc, line, command):
    """A `vllm serve` line outside a GPU section sets the CPU build's KV cache; every one gives a speculative_config
    that is JSON naming a method vLLM has."""
    import shlex

    from specheads.heads.serving import VLLM_METHODS

    if "GPU" not in section_of(doc, line):
        assert "VLLM_CPU_KVCACHE_SPACE=" in command, f"{doc}:{line}: vLLM's CPU build stops without its KV cache size"
    words = shlex.split(command)
    if "--speculative-config" in words:
        spec = json.loads(words[words.index("--speculative-config") + 1])
        assert spec["method"] in VLLM_METHODS.values() and spec["model"], f"{doc}:{line}: {spec}"


def test_the_shim_fails_on_a_wrong_flag_a_wrong_value_and_a_wrong_override():
    results = parse_all([("scripts/bench.py", ["--no-such-flag"]), ("inference/chat.py", ["--top-p", "1.5"]),
                         ("train/medusa.py", ["--config", "configs/demo.yaml", "train.no_such_key=1"]),
                         ("train/medusa.py", ["--config", "configs/demo.yaml", "train.lr=1e-4"])])
    assert [code for code, _ in results] == [2, 2, 2, 0], results
    assert "unknown key 'train.no_such_key'" in results[2][1]

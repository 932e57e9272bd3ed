"""Prompts beyond chat, made offline: code, extraction and math questions for self-distillation.

    python scripts/make_prompts.py --out data/prompts/offline-mix.jsonl     (make prompts)

ShareGPT's training side is mostly chat; the benchmark's coding, math and extraction prompts are where drafts
trained on it do worst. These prompts are built from sources every machine has and that no benchmark question
comes from, so answering them with the base (scripts/self_distill.py --dataset <this file>) gives on-policy
answers in those categories:

- **code** from the Python standard library's own source, read with `ast` (nothing is imported): for a public
  function with a docstring, "write a function with this signature that does what its docstring says" and
  "explain this function" with its source;
- **extraction** from module docstrings: summarise a passage in bullet points, list the names it mentions;
- **math** from seeded templates: linear equations, percentages, rates, unit prices, simple probability.

Records are ShareGPT-format JSON lines with one user turn and no answer (`self_distill.py` answers them); each
has a stable id (`kind/module.function` or `math/template/N`), and the file is a pure function of the Python
version's standard library and the seed. Which benchmark category each prompt falls in is
`specheads.data.questions.classify`'s call, counted by `category_counts`.
"""

from __future__ import annotations

import ast
import functools
import random
import sysconfig
from collections import Counter
from pathlib import Path

# Standard-library folders that are tests, demos, GUIs or vendored code rather than library functions.
SKIPPED = {"test", "tests", "idlelib", "tkinter", "turtledemo", "lib2to3", "ensurepip", "site-packages",
           "__pycache__", "pydoc_data", "venv", "distutils", "msilib", "config-3.11-x86_64-linux-gnu"}
MAX_SOURCE_LINES = 40  # an "explain" prompt quotes the function: short ones only
MIN_PASSAGE_CHARS, MAX_PASSAGE_CHARS = 300, 1500


def stdlib_files(root: Path | None = None) -> list[Path]:
    """The standard library's .py files, sorted, outside SKIPPED folders."""
    root = Path(root or sysconfig.get_paths()["stdlib"])
    return sorted(p for p in root.rglob("*.py")
                  if not SKIPPED.intersection(p.relative_to(root).parts[:-1]) and not p.name.startswith("_"))


@functools.lru_cache(maxsize=4)
def parsed_stdlib(root: Path) -> tuple:
    """(module name, source, ast) of each readable file of stdlib_files(root), parsed once per process."""
    found = []
    for path in stdlib_files(root):
        try:
            source = path.read_text(encoding="utf-8")
            found.append((_module_name(path, root), source, ast.parse(source)))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
    return tuple(found)


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _summary(doc: str) -> str:
    """A docstring's first paragraph on one line."""
    return " ".join(doc.strip().split("\n\n")[0].split())


def code_prompts(root: Path | None = None) -> list[dict]:
    """Write / explain prompts from the public, documented top-level functions of the standard library."""
    root = Path(root or sysconfig.get_paths()["stdlib"])
    prompts = []
    for module, source, tree in parsed_stdlib(root):
        for node in tree.body:
            if not isinstance(node, ast.FunctionDef) or node.name.startswith("_"):
                continue
            doc = ast.get_docstring(node)
            if not doc:
                continue
            summary = _summary(doc)
            if not 20 <= len(summary) <= 300:
                continue
            signature = f"{node.name}({ast.unparse(node.args)})"
            ident = f"{module}.{node.name}"
            prompts.append({"id": f"write/{ident}", "text": (
                f"Write a Python function `{signature}`. What it must do, in the words of its docstring: "
                f"\"{summary}\" Give the code and a short example of calling it.")})
            segment = ast.get_source_segment(source, node)
            if segment and segment.count("\n") < MAX_SOURCE_LINES:
                prompts.append({"id": f"explain/{ident}", "text": (
                    f"Explain what this Python function from the `{module}` module does, step by step:\n\n"
                    f"```python\n{segment}\n```")})
    return prompts


def extraction_prompts(root: Path | None = None) -> list[dict]:
    """Summarise / list-the-names prompts over module docstrings of a readable length."""
    root = Path(root or sysconfig.get_paths()["stdlib"])
    prompts = []
    for module, _, tree in parsed_stdlib(root):
        doc = ast.get_docstring(tree)
        if not doc or not MIN_PASSAGE_CHARS <= len(doc) <= MAX_PASSAGE_CHARS:
            continue
        prompts.append({"id": f"summarise/{module}", "text": (
            f"Summarize the following text in three to five bullet points:\n\n{doc.strip()}")})
        prompts.append({"id": f"names/{module}", "text": (
            f"From the following text, extract every function, class or module name it mentions, "
            f"as a JSON list:\n\n{doc.strip()}")})
    return prompts


def _linear(r: random.Random) -> str:
    a, x, b = r.randint(2, 12), r.randint(-9, 15), r.randint(-30, 30)
    return f"Solve for x: {a}x + {b} = {a * x + b}. Show each step."


def _percent(r: random.Random) -> str:
    p, n = r.choice([5, 10, 12, 15, 20, 25, 30, 40, 45, 60, 75]), r.randint(2, 80) * 10
    return f"What is {p}% of {n}? Then calculate what percentage {n // 4} is of {n}."


def _rate(r: random.Random) -> str:
    d, t = r.randint(3, 40) * 10, r.randint(2, 8)
    return (f"A train travels {d} km in {t} hours at a constant speed. Calculate its speed, and how many km it "
            f"covers in {t + r.randint(1, 4)} hours at that speed.")


def _price(r: random.Random) -> str:
    n, price = r.randint(3, 24), r.randint(2, 90) / 4
    return (f"{n} notebooks cost ${n * price:.2f} in total. How much do 7 of them cost? Explain the calculation "
            f"step by step.")


def _probability(r: random.Random) -> str:
    red, blue = r.randint(2, 9), r.randint(2, 9)
    return (f"A bag holds {red} red and {blue} blue marbles. Two are drawn without replacement. What is the "
            f"probability that both are red? Give the answer as a fraction.")


def _system(r: random.Random) -> str:
    x, y = r.randint(-6, 9), r.randint(-6, 9)
    a, b, c, d = r.randint(1, 6), r.randint(1, 6), r.randint(1, 6), -r.randint(1, 6)
    return f"Solve the system of equations: {a}x + {b}y = {a * x + b * y} and {c}x {d:+d}y = {c * x + d * y}."


MATH_TEMPLATES = {"linear": _linear, "percent": _percent, "rate": _rate, "price": _price,
                  "probability": _probability, "system": _system}


def math_prompts(per_template: int, seed: int = 0) -> list[dict]:
    """`per_template` seeded questions of each MATH_TEMPLATES kind, distinct texts only."""
    prompts = []
    for name, make in MATH_TEMPLATES.items():
        r, seen = random.Random(f"{seed}/{name}"), set()
        for _ in range(per_template * 20):
            if len(seen) == per_template:
                break
            text = make(r)
            if text not in seen:
                seen.add(text)
                prompts.append({"id": f"math/{name}/{len(seen)}", "text": text})
    return prompts


def offline_mix(code: int, extraction: int, math_per_template: int, seed: int = 0,
                root: Path | None = None) -> list[dict]:
    """A seeded sample of `code` code prompts and `extraction` extraction prompts, plus the math ones, as
    ShareGPT records with one user turn, interleaved so a prefix (--limit) keeps the mix."""
    r = random.Random(seed)
    pools = [code_prompts(root), extraction_prompts(root), math_prompts(math_per_template, seed)]
    wanted = [code, extraction, len(pools[2])]
    chosen = [r.sample(pool, min(n, len(pool))) for pool, n in zip(pools, wanted)]
    merged = [item for group in chosen for item in group]
    r.shuffle(merged)
    return [{"id": p["id"], "conversations": [{"from": "human", "value": p["text"]}]} for p in merged]


def category_counts(records: list[dict]) -> Counter:
    """How many records fall in each benchmark category (data/questions.py's classifier; None: no rule)."""
    from specheads.data.questions import classify

    return Counter(classify(r["conversations"][0]["value"]) for r in records)


def main(argv=None) -> None:
    import argparse
    import json

    from specheads.heads.files import check_output_file, write_text

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="the JSONL file to write (replaced whole)")
    parser.add_argument("--code", type=int, default=1200, help="code prompts (write / explain a function)")
    parser.add_argument("--extraction", type=int, default=300, help="extraction prompts (at most what exists)")
    parser.add_argument("--math-per-template", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        out = check_output_file(args.out)
    except ValueError as err:
        raise SystemExit(f"make_prompts.py: {err}") from err
    records = offline_mix(args.code, args.extraction, args.math_per_template, args.seed)
    write_text(out, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
    kinds = Counter(r["id"].split("/")[0] for r in records)
    print(f"{len(records)} prompts -> {out}: {dict(kinds)}; benchmark categories {dict(category_counts(records))}")

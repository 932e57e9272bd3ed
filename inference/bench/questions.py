"""Benchmark questions: a JSONL file of {question_id, category, turns}, every line checked before any model loads."""

from __future__ import annotations

import json
from pathlib import Path


def check_question(q, where: str) -> dict:
    """One question as the benchmark answers it; a ValueError naming `where` (file:line) and the field otherwise."""
    if not isinstance(q, dict):
        raise ValueError(f"{where}: not a JSON object (a {type(q).__name__}); each line is one "
                         "{\"question_id\", \"category\", \"turns\"} object")
    for key in ("question_id", "category", "turns"):
        if key not in q:
            raise ValueError(f"{where}: question lacks field {key!r}")
    if isinstance(q["question_id"], bool) or not isinstance(q["question_id"], (str, int)):
        raise ValueError(f"{where}: field 'question_id' must be a string or an integer, got {q['question_id']!r}")
    if not isinstance(q["category"], str):
        raise ValueError(f"{where}: field 'category' must be a string, got {q['category']!r}")
    turns = q["turns"]
    if isinstance(turns, str):
        raise ValueError(f"{where}: field 'turns' must be a list of strings, got a string (write [\"...\"])")
    if not isinstance(turns, list):
        raise ValueError(f"{where}: field 'turns' must be a list of strings, got {turns!r}")
    if not turns:
        raise ValueError(f"{where}: field 'turns' is empty; a question needs at least one turn")
    for i, turn in enumerate(turns, 1):
        if not isinstance(turn, str):
            raise ValueError(f"{where}: field 'turns': turn {i} must be a string, got {turn!r}")
        if not turn.strip():
            raise ValueError(f"{where}: field 'turns': turn {i} is empty")
    return q


def load_questions(path, limit=None, skip=0, categories=None) -> list[dict]:
    """The questions of a JSONL file, every line checked first: a ValueError names the file, line and field.
    categories: keep only questions of these (before skip and limit); one the file lacks is an error."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such file")
    questions = []
    with open(path, "rb") as f:
        for line_no, raw in enumerate(f, 1):
            where = f"{path}:{line_no}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise ValueError(f"{where}: not UTF-8 text") from None
            if not line.strip():
                continue
            try:
                q = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{where}: not valid JSON ({err.msg.removesuffix(' at')} at column {err.colno})") from None
            questions.append(check_question(q, where))
    if categories:
        missing = sorted(set(categories) - {q["category"] for q in questions})
        if missing:
            raise ValueError(f"{path}: no question of category {', '.join(map(repr, missing))} "
                             f"(it has {', '.join(sorted({q['category'] for q in questions}))})")
        questions = [q for q in questions if q["category"] in categories]
    if skip >= len(questions):
        raise ValueError(f"{path}: --skip-questions {skip} leaves none of its {len(questions)} questions")
    return questions[skip:][:limit]

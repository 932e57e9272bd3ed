"""Write benchmark questions (MT-bench / Spec-Bench JSONL form) from held-out ShareGPT conversations.

    python scripts/make_questions.py --out data/questions/sharegpt-dev.jsonl --count 40

Uses the same fixed held-out split as training (data.heldout_size / data.split_seed), skipping the
conversations that training evaluates on, so no question was seen by the heads. Each question keeps
up to `--turns` user turns; the category is a keyword guess (code, math, writing, qa).
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from specheads.data.sharegpt import load_conversations, split_heldout

CATEGORY_PATTERNS = [
    ("code", r"```|\bdef |\bfunction\b|\bclass\b|\bcode\b|python|javascript|\bsql\b|\bjava\b|c\+\+|\bscript\b|\bapi\b"),
    ("math", r"\d+\s*[-+*/^]\s*\d+|equation|calculate|probability|integral|\bmath|solve"),
    ("writing", r"\bwrite\b|essay|story|poem|blog|article|letter|email|rewrite|summar"),
]


def categorise(text: str) -> str:
    lowered = text.lower()
    for category, pattern in CATEGORY_PATTERNS:
        if re.search(pattern, lowered):
            return category
    return "qa"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="sharegpt")
    parser.add_argument("--heldout-size", type=int, default=200)
    parser.add_argument("--split-seed", type=int, default=0)
    parser.add_argument("--skip", type=int, default=100, help="held-out conversations used by training's eval")
    parser.add_argument("--count", type=int, default=40)
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument("--max-chars", type=int, default=1500, help="skip prompts longer than this")
    parser.add_argument("--out", default="data/questions/sharegpt-dev.jsonl")
    args = parser.parse_args()

    _, heldout = split_heldout(load_conversations(args.dataset), args.heldout_size, args.split_seed)
    questions = []
    for conversation in heldout[args.skip:]:
        turns = [m["content"] for m in conversation.messages if m["role"] == "user"][: args.turns]
        if not turns or any(len(t) > args.max_chars or len(t.strip()) < 15 for t in turns):
            continue
        questions.append({"question_id": conversation.id, "category": categorise(turns[0]), "turns": turns})
        if len(questions) == args.count:
            break
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(q, ensure_ascii=False) + "\n" for q in questions))
    counts = {}
    for q in questions:
        counts[q["category"]] = counts.get(q["category"], 0) + 1
    print(f"wrote {len(questions)} questions to {out}: {counts}")


if __name__ == "__main__":
    main()

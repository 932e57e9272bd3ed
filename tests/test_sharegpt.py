"""ShareGPT reading: truncated JSON recovery, JSONL, role normalisation, the fixed split."""

import json

import pytest

from specheads.data.sharegpt import load_conversations, normalise, split_heldout

from conftest import synthetic_sharegpt, write_jsonl


def test_truncated_json_yields_every_complete_record(tmp_path):
    records = synthetic_sharegpt(5)
    text = json.dumps(records, indent=2)
    cut = text[: text.index('"c4"') + 20]  # stop inside the last record
    path = tmp_path / "cut.json"
    path.write_text(cut)
    conversations = load_conversations(str(path))
    assert [c.id for c in conversations] == ["c0", "c1", "c2", "c3"]
    assert conversations[0].messages[1]["role"] == "assistant"


def test_complete_json_and_jsonl(tmp_path):
    records = synthetic_sharegpt(4)
    (tmp_path / "all.json").write_text(json.dumps(records))
    write_jsonl(tmp_path / "all.jsonl", records)
    assert len(load_conversations(str(tmp_path / "all.json"))) == 4
    assert len(load_conversations(str(tmp_path / "all.jsonl"))) == 4


def test_normalise_roles():
    record = {"id": "x", "conversations": [
        {"from": "gpt", "value": "orphan answer"},
        {"from": "human", "value": "q1"}, {"from": "human", "value": "q1b"},
        {"from": "gpt", "value": ""}, {"from": "gpt", "value": "a1"}]}
    conversation = normalise(record, 0)
    assert conversation.messages == [{"role": "user", "content": "q1\nq1b"}, {"role": "assistant", "content": "a1"}]
    assert normalise({"conversations": [{"from": "human", "value": "q"}]}, 1) is None


def test_split_is_fixed_and_disjoint(tmp_path):
    write_jsonl(tmp_path / "d.jsonl", synthetic_sharegpt(50))
    conversations = load_conversations(str(tmp_path / "d.jsonl"))
    train_a, held_a = split_heldout(conversations, 10, seed=3)
    train_b, held_b = split_heldout(conversations, 10, seed=3)
    assert [c.id for c in held_a] == [c.id for c in held_b] and len(held_a) == 10
    assert not {c.id for c in held_a} & {c.id for c in train_a}
    assert [c.id for c in split_heldout(conversations, 10, seed=4)[1]] != [c.id for c in held_a]


def test_builtin_sharegpt_recovers_the_truncated_file():
    conversations = load_conversations("sharegpt")
    assert 17_000 < len(conversations) < 17_700
    assert all(c.messages[0]["role"] in ("user", "system") for c in conversations[:100])


def test_missing_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.json"):
        load_conversations(str(tmp_path / "nope.json"))


def test_data_split_picks_a_named_split_of_a_dataset_folder(tmp_path):
    """data.split for HF datasets (UltraChat's train_sft): a folder in the Hub's `data/{split}-NNNNN-of-NNNNN` layout,
    read by datasets.load_dataset; UltraChat-style records (messages, prompt_id). A file has no split."""
    folder = tmp_path / "ultrachat"
    (folder / "data").mkdir(parents=True)
    for split, n in (("train_sft", 3), ("test_sft", 2)):
        write_jsonl(folder / "data" / f"{split}-00000-of-00001.jsonl", [
            {"prompt_id": f"{split}-{i}", "messages": [{"role": "user", "content": f"q{i}"},
                                                      {"role": "assistant", "content": f"a{i}"}]} for i in range(n)])
    train = load_conversations(str(folder), split="train_sft")
    assert [c.id for c in train] == ["train_sft-0", "train_sft-1", "train_sft-2"]
    assert [c.id for c in load_conversations(str(folder), split="test_sft")] == ["test_sft-0", "test_sft-1"]
    with pytest.raises(ValueError, match=r"data\.split: .*train_sft"):
        load_conversations(str(folder), split="nope")
    write_jsonl(tmp_path / "d.jsonl", synthetic_sharegpt(2))
    with pytest.raises(ValueError, match=r"data\.split: 'train_sft' names a split .* is a file"):
        load_conversations(str(tmp_path / "d.jsonl"), split="train_sft")


def _ids(conversations):
    return [c.id for c in conversations]


def test_a_mixture_keeps_each_sources_held_out_split_and_weights_only_the_training_side(tmp_path):
    from specheads.data.sharegpt import load_mixture

    a, b = synthetic_sharegpt(30), [dict(r, id=f"b{i}") for i, r in enumerate(synthetic_sharegpt(20, seed=1))]
    write_jsonl(tmp_path / "a.jsonl", a)
    write_jsonl(tmp_path / "b.jsonl", b)
    alone_train, alone_held = split_heldout(load_conversations(str(tmp_path / "a.jsonl")), 5, 0)
    # one source in a list is exactly that source
    assert [_ids(x) for x in load_mixture([str(tmp_path / "a.jsonl")], 5, 0)] == [_ids(alone_train),
                                                                                  _ids(alone_held)]
    train, held = load_mixture([str(tmp_path / "a.jsonl"), {"source": str(tmp_path / "b.jsonl"), "weight": 2.5}], 5, 0)
    b_train, b_held = split_heldout(load_conversations(str(tmp_path / "b.jsonl")), 5, 0)
    assert _ids(held) == [x for pair in zip(_ids(alone_held), _ids(b_held)) for x in pair]  # round-robin
    assert _ids(train[:25]) == _ids(alone_train)  # a's training side as alone: adding b moved nothing of a
    from_b = _ids(train[25:])
    assert len(from_b) == 2 * 15 + round(0.5 * 15) and from_b[:30] == _ids(b_train) * 2
    assert set(from_b[30:]) < set(_ids(b_train)) and len(set(from_b[30:])) == 8  # a seeded half, no repeats
    assert not set(_ids(held)) & set(_ids(train))
    assert _ids(load_mixture([str(tmp_path / "a.jsonl"), {"source": str(tmp_path / "b.jsonl"), "weight": 2.5}],
                             5, 0)[0]) == _ids(train)  # seeded: the same mixture every time
    half, _ = load_mixture([{"source": str(tmp_path / "a.jsonl"), "weight": 0.5}], 5, 0)
    assert len(half) == round(0.5 * 25)
    # weight 0: the source is evaluated (its held-out split, round-robin as before) and never trained on
    train0, held0 = load_mixture([str(tmp_path / "a.jsonl"), {"source": str(tmp_path / "b.jsonl"), "weight": 0}], 5, 0)
    assert _ids(train0) == _ids(alone_train) and _ids(held0) == _ids(held)


def test_prompts_without_answers_load_only_when_asked(tmp_path):
    write_jsonl(tmp_path / "p.jsonl", [{"id": "q1", "conversations": [{"from": "human", "value": "Solve 2x = 4."}]}])
    with pytest.raises(ValueError, match="assistant turn"):
        load_conversations(str(tmp_path / "p.jsonl"))
    (prompt,) = load_conversations(str(tmp_path / "p.jsonl"), require_answer=False)
    assert prompt.id == "q1" and prompt.messages == [{"role": "user", "content": "Solve 2x = 4."}]


def test_a_mixed_dataset_in_the_config_is_checked_named_and_fingerprinted(tmp_path):
    from specheads.data.sharegpt import MissingDataFile, check_source
    from specheads.train.config import ConfigError, load_config
    from specheads.train.features import dataset_fingerprint
    from specheads.train.medusa import MedusaTrainConfig

    write_jsonl(tmp_path / "a.jsonl", synthetic_sharegpt(4))
    config = tmp_path / "c.yaml"
    config.write_text(f"data:\n  dataset: [{tmp_path / 'a.jsonl'}, {{source: {tmp_path / 'b.jsonl'}, weight: 2}}]\n")
    cfg = load_config(MedusaTrainConfig, str(config))
    assert cfg.data.dataset[1].weight == 2.0
    with pytest.raises(MissingDataFile, match="b.jsonl"):
        check_source(cfg.data.dataset)
    for bad, field in (("[]", "empty list"), ("[{source: a.jsonl, weight: -1}]", r"data.dataset\[\].weight"),
                       ("[{source: a.jsonl, weight: 0}]", "every source has weight 0"),
                       ("[{path: a.jsonl}]", "unknown key")):
        config.write_text(f"data:\n  dataset: {bad}\n")
        with pytest.raises(ConfigError, match=field):
            load_config(MedusaTrainConfig, str(config))
    single = dataset_fingerprint(str(tmp_path / "a.jsonl"))
    mixed = dataset_fingerprint([str(tmp_path / "a.jsonl"), {"source": str(tmp_path / "a.jsonl"), "weight": 2}])
    assert single and mixed not in ("", single)
    assert mixed != dataset_fingerprint([str(tmp_path / "a.jsonl"), str(tmp_path / "a.jsonl")])  # weights count

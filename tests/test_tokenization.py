"""Assistant-only labels through real chat templates."""

import pytest

from specheads.data.tokenization import IGNORE_INDEX, assistant_char_spans, pad_batch, tokenize_conversation

CONVERSATION = [
    {"role": "user", "content": "Name a prime number."},
    {"role": "assistant", "content": "Seven is prime."},
    {"role": "user", "content": "And an even one?"},
    {"role": "assistant", "content": "Two is the only even prime."},
]

# Real templates of other model families, applied to the SmolLM2 tokenizer's vocabulary.
LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
QWEN2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def labelled_text(tokenizer, example):
    """Decode each run of labelled tokens separately."""
    runs, current = [], []
    for token, label in zip(example.input_ids, example.labels):
        if label != IGNORE_INDEX:
            assert label == token
            current.append(token)
        elif current:
            runs.append(tokenizer.decode(current))
            current = []
    if current:
        runs.append(tokenizer.decode(current))
    return runs


def test_smollm2_template_labels_only_assistant_turns(smollm2_tokenizer):
    example = tokenize_conversation(smollm2_tokenizer, CONVERSATION, max_length=512)
    assert labelled_text(smollm2_tokenizer, example) == [
        "Seven is prime.<|im_end|>\n", "Two is the only even prime.<|im_end|>\n"]
    # the system prompt, user turns and the assistant header carry no loss
    text = smollm2_tokenizer.decode(example.input_ids)
    assert "You are a helpful AI assistant named SmolLM" in text
    assert example.num_labels < len(example.input_ids) / 2


@pytest.fixture(params=["llama3", "qwen2"])
def other_template_tokenizer(request, smollm2_tokenizer):
    import copy

    tokenizer = copy.deepcopy(smollm2_tokenizer)
    if request.param == "llama3":
        tokenizer.add_special_tokens({"additional_special_tokens": [
            "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]})
        tokenizer.chat_template = LLAMA3_TEMPLATE
        expected = ["Seven is prime.<|eot_id|>", "Two is the only even prime.<|eot_id|>"]
    else:
        tokenizer.chat_template = QWEN2_TEMPLATE
        expected = ["Seven is prime.<|im_end|>\n", "Two is the only even prime.<|im_end|>\n"]
    return tokenizer, expected


def test_other_real_templates_label_only_assistant_turns(other_template_tokenizer):
    tokenizer, expected = other_template_tokenizer
    example = tokenize_conversation(tokenizer, CONVERSATION, max_length=512)
    assert labelled_text(tokenizer, example) == expected


def test_truncation_keeps_labels_aligned(smollm2_tokenizer):
    full = tokenize_conversation(smollm2_tokenizer, CONVERSATION, max_length=512)
    cut = tokenize_conversation(smollm2_tokenizer, CONVERSATION, max_length=40)
    assert len(cut.input_ids) == 40
    assert cut.input_ids == full.input_ids[:40] and cut.labels == full.labels[:40]


def test_template_that_rewrites_history_is_refused(smollm2_tokenizer):
    import copy

    tokenizer = copy.deepcopy(smollm2_tokenizer)
    # renders only the last message: a prefix is then not a prefix of the whole
    tokenizer.chat_template = "{{ messages[-1]['content'] }}{% if add_generation_prompt %}>>{% endif %}"
    with pytest.raises(ValueError, match="not a prefix"):
        assistant_char_spans(tokenizer, CONVERSATION)


def test_pad_batch_masks_padding(smollm2_tokenizer):
    a = tokenize_conversation(smollm2_tokenizer, CONVERSATION, 512)
    b = tokenize_conversation(smollm2_tokenizer, CONVERSATION[:2], 512)
    batch = pad_batch([a, b], pad_token_id=0)
    assert batch["input_ids"].shape == (2, len(a.input_ids))
    assert batch["attention_mask"][1].sum() == len(b.input_ids)
    assert (batch["labels"][1, len(b.input_ids):] == IGNORE_INDEX).all()


def test_tokenize_all_is_tokenize_conversation_and_a_second_run_reads_its_cache(smollm2_tokenizer, tmp_path,
                                                                                 monkeypatch):
    """datasets.map with a cache file keyed by text, tokenizer, max_length and code: the same examples as the plain
    loop; a second call reads the file (tokenising again would raise here); another max_length or chat template
    makes another file."""
    import copy

    from specheads.data import tokenization
    from specheads.data.sharegpt import Conversation
    from specheads.data.tokenization import tokenize_all

    conversations = [Conversation(f"c{i}", [{"role": "user", "content": f"Count to {i}."},
                                            {"role": "assistant", "content": " ".join(map(str, range(i + 1)))}])
                     for i in range(12)]
    plain = [tokenize_conversation(smollm2_tokenizer, c.messages, 24) for c in conversations]
    first = tokenize_all(conversations, smollm2_tokenizer, 24, tmp_path)
    assert first == plain and len(list(tmp_path.glob("tokens-*.arrow"))) == 1

    def refuse(*args, **kwargs):
        raise AssertionError("tokenised again")

    with monkeypatch.context() as patched:
        patched.setattr(tokenization, "tokenize_conversation", refuse)
        assert tokenize_all(conversations, smollm2_tokenizer, 24, tmp_path) == plain
        with pytest.raises(AssertionError, match="tokenised again"):
            tokenize_all(conversations, smollm2_tokenizer, 32, tmp_path)  # another max_length: not that file
        other = copy.deepcopy(smollm2_tokenizer)
        other.chat_template = other.chat_template.replace("<|im_start|>", "<|im_start|> ")
        with pytest.raises(AssertionError, match="tokenised again"):
            tokenize_all(conversations, other, 24, tmp_path)
    assert tokenize_all(conversations[:3], smollm2_tokenizer, 24, None) == plain[:3]  # no cache asked: none written
    assert len(list(tmp_path.glob("tokens-*.arrow"))) == 1

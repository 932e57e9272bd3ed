"""Chat templates for tokenizers that ship none: FastChat's vicuna_v1.1 character for character, labels through a
real sentencepiece tokenizer laid out as Vicuna's, and the errors for a missing or wrong template."""

import copy
import json
import random

import pytest

from specheads.data.chat_templates import ALPACA_SYSTEM, BUILTIN, VICUNA_SYSTEM, ChatTemplateError, resolve_chat_template
from specheads.data.tokenization import IGNORE_INDEX, assistant_char_spans, tokenize_conversation

TWO_TURNS = [
    {"role": "user", "content": "Hello!"},
    {"role": "assistant", "content": "Hi there."},
    {"role": "user", "content": "How are you?"},
    {"role": "assistant", "content": "Fine."},
]


def fastchat_add_colon_two(system: str, roles: tuple[str, str], sep: str, sep2: str, messages: list) -> str:
    """FastChat's Conversation.get_prompt for SeparatorStyle.ADD_COLON_TWO, written out from its definition
    (messages: (role index, text or None) pairs)."""
    seps = [sep, sep2]
    ret = system + seps[0]
    for i, message in enumerate(messages):
        role = roles[i % 2]
        ret += role + ": " + message + seps[i % 2] if message else role + ":"
    return ret


def with_template(tokenizer, name):
    tokenizer = copy.deepcopy(tokenizer)
    tokenizer.chat_template = BUILTIN[name]
    return tokenizer


@pytest.fixture(scope="module")
def vicuna_tokenizer(vicuna_like_tokenizer_dir):
    from specheads.data.models import load_tokenizer

    return load_tokenizer(str(vicuna_like_tokenizer_dir), chat_template="vicuna_v1.1")


def test_vicuna_two_turns_render_as_fastchat(vicuna_tokenizer):
    text = vicuna_tokenizer.apply_chat_template(TWO_TURNS, tokenize=False)
    # the literal of ../shared/PUBLISHED-LAYOUTS.md §7, after the BOS the template holds
    assert text == "<s>" + VICUNA_SYSTEM + " USER: Hello! ASSISTANT: Hi there.</s>USER: How are you? ASSISTANT: Fine.</s>"
    prompt = vicuna_tokenizer.apply_chat_template(TWO_TURNS[:1], tokenize=False, add_generation_prompt=True)
    assert prompt == "<s>" + VICUNA_SYSTEM + " USER: Hello! ASSISTANT:"  # no trailing space


@pytest.mark.parametrize("seed", range(5))
def test_vicuna_and_alpaca_match_fastchat_on_random_conversations(vicuna_tokenizer, seed):
    rng = random.Random(seed)
    words = ["alpha", "beta", "gamma", "x:y", "  spaced ", "new\nline", "{{ not jinja }}", "</s>"]
    turns = [" ".join(rng.choice(words) for _ in range(rng.randint(1, 6))) for _ in range(2 * rng.randint(1, 4))]
    system = rng.choice([None, "Be brief."])
    messages = ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(turns)]
    cases = {"vicuna_v1.1": (VICUNA_SYSTEM, ("USER", "ASSISTANT"), " ", "</s>"),
             "alpaca": (ALPACA_SYSTEM, ("### Instruction", "### Response"), "\n\n", "</s>")}
    for name, (default_system, roles, sep, sep2) in cases.items():
        tokenizer = with_template(vicuna_tokenizer, name)
        expected = fastchat_add_colon_two(system or default_system, roles, sep, sep2, turns)
        assert tokenizer.apply_chat_template(messages, tokenize=False) == "<s>" + expected
        prompt = tokenizer.apply_chat_template(messages[:-1], tokenize=False, add_generation_prompt=True)
        assert prompt == "<s>" + fastchat_add_colon_two(system or default_system, roles, sep, sep2, turns[:-1] + [None])


def test_vicuna_labels_cover_each_answer_and_its_eos(vicuna_tokenizer):
    """The sentencepiece tokenizer (read from tokenizer.model alone) through vicuna_v1.1: labelled tokens are exactly
    each answer's tokens followed by </s>, and nothing of the system prompt or the user turns."""
    tokenizer = vicuna_tokenizer
    assert tokenizer.is_fast and tokenizer.eos_token == "</s>" and tokenizer.eos_token_id == 2
    example = tokenize_conversation(tokenizer, TWO_TURNS, max_length=512)
    assert example.input_ids[0] == tokenizer.bos_token_id and example.input_ids.count(tokenizer.bos_token_id) == 1
    runs, current = [], []
    for token, label in zip(example.input_ids, example.labels):
        if label != IGNORE_INDEX:
            assert label == token
            current.append(token)
        elif current:
            runs.append(current)
            current = []
    runs.append(current) if current else None
    assert [run[-1] for run in runs] == [tokenizer.eos_token_id] * 2  # each answer ends in its </s>, labelled
    assert [tokenizer.decode(run[:-1]).strip() for run in runs] == ["Hi there.", "Fine."]
    eos_positions = [i for i, t in enumerate(example.input_ids) if t == tokenizer.eos_token_id]
    assert all(example.labels[i] == tokenizer.eos_token_id for i in eos_positions) and len(eos_positions) == 2
    unlabelled = tokenizer.decode([t for t, label in zip(example.input_ids, example.labels) if label == IGNORE_INDEX])
    assert "Hello!" in unlabelled and "How are you?" in unlabelled and "Hi there" not in unlabelled


@pytest.mark.parametrize("name", sorted(BUILTIN))
def test_every_builtin_template_labels_only_answers(smollm2_tokenizer, name):
    tokenizer = with_template(smollm2_tokenizer, name)
    text, spans = assistant_char_spans(tokenizer, TWO_TURNS)
    answers = [text[start:end] for start, end in spans]
    assert [a.strip().startswith(m["content"]) for a, m in zip(answers, TWO_TURNS[1::2])] == [True, True]
    assert "Hello!" not in "".join(answers)
    example = tokenize_conversation(tokenizer, TWO_TURNS, max_length=512)
    assert 0 < example.num_labels < len(example.input_ids)


def test_templates_refuse_turns_that_do_not_alternate(vicuna_tokenizer):
    with pytest.raises(Exception, match="alternate"):
        vicuna_tokenizer.apply_chat_template([TWO_TURNS[0], TWO_TURNS[0]], tokenize=False)


def test_template_from_file_or_string(tmp_path):
    jinja = tmp_path / "t.jinja"
    jinja.write_text("{{ messages[0]['content'] }}")
    assert resolve_chat_template(str(jinja)) == "{{ messages[0]['content'] }}"
    config = tmp_path / "tokenizer_config.json"
    config.write_text(json.dumps({"chat_template": BUILTIN["chatml"]}))
    assert resolve_chat_template(str(config)) == BUILTIN["chatml"]
    assert resolve_chat_template("{% for m in messages %}{{ m.content }}{% endfor %}").startswith("{%")
    config.write_text(json.dumps({"other": 1}))
    with pytest.raises(ChatTemplateError, match="no string field 'chat_template'"):
        resolve_chat_template(str(config))
    with pytest.raises(ChatTemplateError, match=r"--chat-template: 'vicuna' is not a built-in template \(vicuna_v1.1"):
        resolve_chat_template("vicuna", "--chat-template")


def test_template_less_tokenizer_names_the_option(vicuna_like_tokenizer_dir):
    from specheads.data.models import load_tokenizer

    assert load_tokenizer(str(vicuna_like_tokenizer_dir)).chat_template is None  # no option: nothing asked
    with pytest.raises(ChatTemplateError, match="has no chat template: set data.chat_template to a built-in"):
        load_tokenizer(str(vicuna_like_tokenizer_dir), option="data.chat_template")


def test_config_refuses_an_unknown_template_name(tmp_path):
    from specheads.train.config import ConfigError, load_config
    from specheads.train.medusa import MedusaTrainConfig

    with pytest.raises(ConfigError, match="data.chat_template: 'fastchat' is not a built-in template"):
        load_config(MedusaTrainConfig, None, ["data.chat_template=fastchat"])


def test_slow_tokenizer_without_offsets_is_named(vicuna_like_tokenizer_dir):
    from transformers import SentencePieceBackend

    slow = SentencePieceBackend(vocab_file=str(vicuna_like_tokenizer_dir / "tokenizer.model"), bos_token="<s>",
                                eos_token="</s>", unk_token="<unk>")
    slow.chat_template = BUILTIN["vicuna_v1.1"]
    with pytest.raises(ValueError, match="gives no offset mapping, which assistant-only labels need"):
        tokenize_conversation(slow, TWO_TURNS, max_length=512)

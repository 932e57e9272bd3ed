"""Conversations -> token ids with labels on assistant tokens only.

The chat template decides where each assistant turn sits. We render the conversation
prefix by prefix: the text of `messages[:i]` with the generation prompt ends where
assistant turn i starts, and the text of `messages[:i+1]` ends where it stops. Tokens whose
characters fall inside those spans get labels; everything else is IGNORE_INDEX. This works
for any template whose rendering of a prefix is a prefix of the full rendering, and fails
loudly for one that is not.
"""

from __future__ import annotations

import hashlib
import inspect
import json
from pathlib import Path

from dataclasses import dataclass

IGNORE_INDEX = -100


@dataclass
class TokenizedConversation:
    input_ids: list[int]
    labels: list[int]  # IGNORE_INDEX outside assistant turns

    @property
    def num_labels(self) -> int:
        return sum(label != IGNORE_INDEX for label in self.labels)


def frequent_tokens(examples, vocab_size: int, count: int):
    """The `count` most frequent assistant tokens of these examples (ties and unseen ids by id): a draft
    vocabulary for EAGLE-3 drafts and Medusa heads."""
    import torch

    counts = torch.zeros(vocab_size, dtype=torch.long)
    for example in examples:
        labels = torch.as_tensor(example.labels)
        counts += torch.bincount(labels[labels != IGNORE_INDEX], minlength=vocab_size)[:vocab_size]
    return counts.argsort(descending=True, stable=True)[:count]  # stable: ties keep id order


def _render(tokenizer, messages, add_generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)


def assistant_char_spans(tokenizer, messages: list[dict]) -> tuple[str, list[tuple[int, int]]]:
    """Render the conversation; return its text and the [start, end) character span of each assistant turn."""
    full_text = _render(tokenizer, messages, add_generation_prompt=False)
    spans = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before = _render(tokenizer, messages[:i], add_generation_prompt=True)
        through = _render(tokenizer, messages[: i + 1], add_generation_prompt=False)
        if not full_text.startswith(before) or not full_text.startswith(through) or len(through) < len(before):
            raise ValueError(
                "chat template renders a conversation prefix that is not a prefix of the whole "
                f"conversation (assistant turn {i}); cannot locate assistant tokens"
            )
        spans.append((len(before), len(through)))
    return full_text, spans


def tokenize_conversation(tokenizer, messages: list[dict], max_length: int) -> TokenizedConversation:
    """Tokenise through the chat template; label assistant tokens; truncate to max_length tokens."""
    text, spans = assistant_char_spans(tokenizer, messages)
    # The template already holds any BOS it wants, so no extra special tokens.
    encoding = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True,
                         truncation=True, max_length=max_length)
    if "offset_mapping" not in encoding:  # a slow (Python sentencepiece) tokenizer returns none, silently
        raise ValueError(
            f"tokenizer {type(tokenizer).__name__} ({getattr(tokenizer, 'name_or_path', '?')}) gives no offset "
            "mapping, which assistant-only labels need: load it with AutoTokenizer.from_pretrained (or "
            "specheads.data.models.load_tokenizer), which builds a fast tokenizer from a sentencepiece "
            "tokenizer.model (needs the sentencepiece and protobuf packages)")
    labels = []
    span_index = 0
    for token_id, (start, end) in zip(encoding["input_ids"], encoding["offset_mapping"]):
        while span_index < len(spans) and start >= spans[span_index][1]:
            span_index += 1
        inside = span_index < len(spans) and start >= spans[span_index][0] and end > start
        labels.append(token_id if inside else IGNORE_INDEX)
    return TokenizedConversation(input_ids=list(encoding["input_ids"]), labels=labels)


def pad_batch(examples: list[TokenizedConversation], pad_token_id: int):
    """Right-pad a list of examples -> dict of input_ids, attention_mask, labels tensors [B, T]."""
    import torch

    length = max(len(example.input_ids) for example in examples)
    input_ids = torch.full((len(examples), length), pad_token_id, dtype=torch.long)
    labels = torch.full((len(examples), length), IGNORE_INDEX, dtype=torch.long)
    attention_mask = torch.zeros((len(examples), length), dtype=torch.long)
    for row, example in enumerate(examples):
        n = len(example.input_ids)
        input_ids[row, :n] = torch.tensor(example.input_ids)
        labels[row, :n] = torch.tensor(example.labels)
        attention_mask[row, :n] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def tokenizer_fingerprint(tokenizer) -> str:
    """sha256 of what decides a tokenizer's ids: its full serialised form (fast tokenizers) or vocabulary, its
    class and chat template."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    body = backend.to_str() if backend is not None else json.dumps(sorted(tokenizer.get_vocab().items()))
    extra = json.dumps([type(tokenizer).__name__, tokenizer.chat_template, tokenizer.all_special_tokens])
    return hashlib.sha256((body + "\0" + extra).encode()).hexdigest()


def _tokenize_batch(batch: dict, tokenizer, max_length: int) -> dict:
    out = [tokenize_conversation(tokenizer, messages, max_length) for messages in batch["messages"]]
    return {"input_ids": [o.input_ids for o in out], "labels": [o.labels for o in out]}


# The tokenisation code itself is part of the cache key: a change to it never reads an older file.
_CODE = "".join(inspect.getsource(f) for f in (tokenize_conversation, assistant_char_spans, _render))


def tokenize_all(conversations, tokenizer, max_length: int, cache_dir: str | Path | None, desc: str = "tokenising"):
    """tokenize_conversation over `conversations` through `datasets.map`, its result cached as an Arrow file under
    `cache_dir` (None: no cache) keyed by the conversations' text, the tokenizer (tokenizer_fingerprint), max_length
    and this module's tokenisation code: a second run, or a second process of the same run, reads it instead of
    tokenising again. Returns TokenizedConversation per conversation, in order."""
    import datasets

    messages = [c.messages for c in conversations]
    if not messages:
        return []
    table = datasets.Dataset.from_dict({"messages": messages})
    cache_file = None
    if cache_dir is not None:
        key = hashlib.sha256()
        for part in (json.dumps(messages, ensure_ascii=False), tokenizer_fingerprint(tokenizer), str(max_length),
                     _CODE):
            key.update(part.encode() + b"\0")
        Path(cache_dir).mkdir(parents=True, exist_ok=True)
        cache_file = str(Path(cache_dir) / f"tokens-{key.hexdigest()[:24]}.arrow")
    mapped = table.map(_tokenize_batch, batched=True, batch_size=256, remove_columns=["messages"],
                       fn_kwargs={"tokenizer": tokenizer, "max_length": max_length}, cache_file_name=cache_file,
                       load_from_cache_file=cache_file is not None, new_fingerprint=Path(cache_file or "none").stem,
                       desc=desc)
    return [TokenizedConversation(list(ids), list(labels))
            for ids, labels in zip(mapped["input_ids"], mapped["labels"])]

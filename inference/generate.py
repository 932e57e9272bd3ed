"""Text in, text out: chat prompts, streaming detokenisation and stop strings around TreeDecoder.

    gen = SpeculativeGenerator.from_pretrained("smollm2-135m-instruct", heads="runs/.../heads")
    for piece in gen.stream([{"role": "user", "content": "Hi!"}], max_new_tokens=128):
        print(piece, end="", flush=True)
    print(gen.stats.tau, gen.stats.tokens_per_s)
"""

from __future__ import annotations

from typing import Generator, Iterator

import torch

import json
import warnings
from pathlib import Path

from specheads.data.models import load_base_model, load_tokenizer
from specheads.heads import load_heads
from specheads.heads.files import CHAT_TEMPLATE, CONFIG_NAME
from specheads.heads.remote import resolve_heads
from specheads.heads.joint import load_adapted_base

from .cpu_verify import prepare_cpu_verify
from .decoder import DecodeStats, SamplingConfig, TreeDecoder
from .methods import MethodOptions, build_decoder, method_for


def make_decoder(model, heads=None, tree=None, eagle_tree: dict | None = None, prompt_lookup: bool = False,
                 options: MethodOptions | None = None) -> TreeDecoder:
    """The decoder for these heads (methods.method_for): Medusa with a static tree, EAGLE with an EAGLE-2 dynamic
    tree, none: plain decoding; prompt_lookup: with prompt lookup (the method's *_pld form).

    tree / eagle_tree: shorthands for options.tree / options.eagle_tree (top_k / depth / total_tokens / min_prob);
    by default the settings stored with the draft."""
    options = options or MethodOptions(tree=tree, eagle_tree=eagle_tree or {})
    return build_decoder(method_for(heads, prompt_lookup), model, heads, options)


def eos_token_ids(model, tokenizer) -> list[int]:
    """Every id that ends a turn: the tokenizer's EOS and the model's generation_config EOS ids."""
    ids = set()
    for value in (tokenizer.eos_token_id, getattr(model.generation_config, "eos_token_id", None)):
        if isinstance(value, int):
            ids.add(value)
        elif value:
            ids.update(value)
    return sorted(ids)


def stored_chat_template(heads) -> str | None:
    """The chat template stored with a draft (data.chat_template at training): from a loaded draft, or from a heads
    folder's config.json without loading its weights."""
    if heads is None:
        return None
    if not isinstance(heads, (str, Path)):
        return heads.metadata.get(CHAT_TEMPLATE)
    config = resolve_heads(heads) / CONFIG_NAME
    try:
        value = json.loads(config.read_text()).get(CHAT_TEMPLATE) if config.is_file() else None
    except (OSError, ValueError, AttributeError):
        return None  # loading the heads names what is wrong with the folder
    return value if isinstance(value, str) else None


def chat_tokenizer(model: str, heads=None, chat_template: str | None = None, option: str = "--chat-template"):
    """The base's tokenizer rendering prompts as the draft was trained to read them: `chat_template` (a built-in
    name, Jinja string or file) if given, else the template stored with the heads (a folder or a loaded draft),
    else the tokenizer's own; none at all is a ChatTemplateError naming `option`."""
    from specheads.data.chat_templates import resolve_chat_template

    stored = stored_chat_template(heads)
    if chat_template is not None and stored and resolve_chat_template(chat_template, option) != stored:
        warnings.warn(f"{option} differs from the chat template the draft was trained with: its acceptance will "
                      "suffer (train and decode with the same template)", stacklevel=2)
    return load_tokenizer(model, chat_template if chat_template is not None else stored, option=option)


def chat_input_ids(tokenizer, messages: list[dict] | str) -> torch.Tensor:
    if isinstance(messages, str):
        messages = [{"role": "user", "content": messages}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)
    return torch.tensor([ids["input_ids"]])


def _held_back(text: str, stop_strings) -> int:
    """How many trailing characters could still grow into a stop string (not safe to show yet)."""
    keep = 1 if text.endswith("\ufffd") else 0  # half of a multi-byte character
    for stop in stop_strings:
        for n in range(min(len(stop) - 1, len(text)), 0, -1):
            if text.endswith(stop[:n]):
                keep = max(keep, n)
                break
    return keep


def stream_text(token_chunks: Generator[list[int], None, None], tokenizer, stop_strings=()) -> Iterator[str]:
    """Turn accepted token chunks into text pieces; stop (and cut) at the first stop string."""
    ids: list[int] = []
    shown = 0
    for chunk in token_chunks:
        ids.extend(chunk)
        text = tokenizer.decode(ids, skip_special_tokens=True)
        hits = [text.find(s, max(shown - len(s), 0)) for s in stop_strings]
        hits = [h for h in hits if h >= 0]
        if hits:
            cut = min(hits)
            if cut > shown:
                yield text[shown:cut]
            token_chunks.close()  # stop decoding now, not at max_new_tokens
            return
        safe = len(text) - _held_back(text, stop_strings)
        if safe > shown:
            yield text[shown:safe]
            shown = safe
    text = tokenizer.decode(ids, skip_special_tokens=True)
    if len(text) > shown:
        yield text[shown:]


class SpeculativeGenerator:
    """A base model, its tokenizer and (optionally) draft heads: Medusa with their tree, or EAGLE."""

    def __init__(self, model, tokenizer, heads=None, tree=None, eagle_tree: dict | None = None,
                 prompt_lookup: bool = False, options: MethodOptions | None = None):
        self.model = model
        self.tokenizer = tokenizer
        self.decoder = make_decoder(model, heads, tree, eagle_tree, prompt_lookup, options)
        self.eos = eos_token_ids(model, tokenizer)

    @classmethod
    def from_pretrained(cls, model: str = "smollm2-135m-instruct", heads: str | None = None,
                        dtype: str = "auto", tree=None, device: str = "auto",
                        eagle_tree: dict | None = None, prompt_lookup: bool = False,
                        cpu_tuning: bool = True, options: MethodOptions | None = None,
                        chat_template: str | None = None, device_map: str | dict | None = None,
                        ) -> "SpeculativeGenerator":
        """device: auto (a GPU when there is one) | cpu | cuda | cuda:N | mps; device_map: a base spread over
        several GPUs (transformers' device_map). chat_template: see chat_tokenizer (default: the heads' own).
        cpu_tuning: CPU verify tuning (inference/cpu_verify.py: packed fp32/bf16 linears, SDPA GQA; CPU only)."""
        if isinstance(heads, (str, Path)):  # a folder, or a Hub id fetched once into the Hugging Face cache
            heads = resolve_heads(heads)
        tokenizer = chat_tokenizer(model, heads, chat_template)  # a missing template stops before any weights load
        base = load_base_model(model, dtype, device, device_map=device_map)
        if heads:  # Medusa-2 heads carry the LoRA adapter they were trained with: fold it into the base
            base = load_adapted_base(base, heads)
        draft = load_heads(heads, base) if heads else None
        prepare_cpu_verify(base, draft, enabled=cpu_tuning)
        return cls(base, tokenizer, draft, tree, eagle_tree, prompt_lookup, options)

    @property
    def stats(self) -> DecodeStats:
        return self.decoder.stats

    def stream_ids(self, input_ids: torch.Tensor, max_new_tokens: int = 256,
                   sampling: SamplingConfig | None = None) -> Iterator[list[int]]:
        return self.decoder.generate(input_ids, max_new_tokens, sampling, self.eos)

    def stream(self, messages: list[dict] | str, max_new_tokens: int = 256, sampling: SamplingConfig | None = None,
               stop_strings=()) -> Iterator[str]:
        """Yield the answer's text as tokens are accepted; stops at EOS, stop strings or max_new_tokens."""
        input_ids = chat_input_ids(self.tokenizer, messages)
        return stream_text(self.stream_ids(input_ids, max_new_tokens, sampling), self.tokenizer, stop_strings)

    def answer(self, messages, **kwargs) -> str:
        return "".join(self.stream(messages, **kwargs))

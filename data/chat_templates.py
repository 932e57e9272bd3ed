"""Chat templates for tokenizers that ship none (Vicuna, Alpaca-style bases), by name, Jinja string or file.

`data.chat_template` (training) and `--chat-template` (decoding, self-distillation) take one of:
- a built-in name (`BUILTIN`): `vicuna_v1.1` exactly as FastChat renders it, `llama-2`, `chatml`, `zephyr`,
  `alpaca`;
- a Jinja string (anything holding `{{` or `{%`), as in a tokenizer_config.json;
- a file: a `.jinja` file, or a tokenizer_config.json-style `.json` whose `chat_template` is a string.

The template becomes `tokenizer.chat_template`, so every caller keeps using `apply_chat_template`. The rendered
Jinja text is stored with the trained heads (`chat_template` in their config.json) and decoding takes it from
there, so training and serving render prompts the same way.

Built-in templates start with `bos_token` (Hugging Face's convention: the template holds the special tokens and
the text is tokenised with `add_special_tokens=False`, as vLLM's chat endpoint does too).
"""

from __future__ import annotations

import json
from pathlib import Path


class ChatTemplateError(ValueError):
    """A chat template option that names no built-in template, Jinja string or readable file; or none at all."""


VICUNA_SYSTEM = ("A chat between a curious user and an artificial intelligence assistant. The assistant gives "
                 "helpful, detailed, and polite answers to the user's questions.")
ALPACA_SYSTEM = ("Below is an instruction that describes a task. Write a response that appropriately completes "
                 "the request.")


def _js(text: str) -> str:
    """A Python string as a Jinja string literal."""
    return json.dumps(text)


def _add_colon_two(system: str, user: str, assistant: str, sep: str, sep2: str) -> str:
    """FastChat's ADD_COLON_TWO style: system + sep, then `role: message` + sep after a user turn and sep2 after
    an answer; a generation prompt is `assistant:` with no space. A system message replaces the default system."""
    return (
        "{{ bos_token }}"
        "{% if messages and messages[0]['role'] == 'system' %}{% set system = messages[0]['content'] %}"
        "{% set turns = messages[1:] %}{% else %}"
        f"{{% set system = {_js(system)} %}}{{% set turns = messages %}}{{% endif %}}"
        f"{{{{ system + {_js(sep)} }}}}"
        "{% for message in turns %}"
        "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
        "{{ raise_exception('turns must alternate user/assistant, starting with the user') }}{% endif %}"
        f"{{% if message['role'] == 'user' %}}{{{{ {_js(user + ': ')} + message['content'] + {_js(sep)} }}}}"
        f"{{% else %}}{{{{ {_js(assistant + ': ')} + message['content'] + {_js(sep2)} }}}}{{% endif %}}"
        "{% endfor %}"
        f"{{% if add_generation_prompt %}}{{{{ {_js(assistant + ':')} }}}}{{% endif %}}"
    )


# Meta's Llama-2 chat format: `<s>[INST] <<SYS>>\n{system}\n<</SYS>>\n\n{user} [/INST] {answer} </s>` per turn.
LLAMA2 = (
    "{% if messages and messages[0]['role'] == 'system' %}"
    "{% set system = '<<SYS>>\\n' + messages[0]['content'] + '\\n<</SYS>>\\n\\n' %}{% set turns = messages[1:] %}"
    "{% else %}{% set system = '' %}{% set turns = messages %}{% endif %}"
    "{% for message in turns %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('turns must alternate user/assistant, starting with the user') }}{% endif %}"
    "{% if message['role'] == 'user' %}"
    "{{ bos_token + '[INST] ' + (system if loop.first else '') + message['content'] | trim + ' [/INST]' }}"
    "{% else %}{{ ' ' + message['content'] | trim + ' ' + eos_token }}{% endif %}"
    "{% endfor %}"
)

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

ZEPHYR = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + eos_token + '\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)

BUILTIN: dict[str, str] = {
    "vicuna_v1.1": _add_colon_two(VICUNA_SYSTEM, "USER", "ASSISTANT", " ", "</s>"),
    "llama-2": LLAMA2,
    "chatml": CHATML,
    "zephyr": ZEPHYR,
    "alpaca": _add_colon_two(ALPACA_SYSTEM, "### Instruction", "### Response", "\n\n", "</s>"),
}


def builtin_name(template: str | None) -> str | None:
    """The built-in name of a rendered template, if it is one."""
    return next((name for name, text in BUILTIN.items() if text == template), None)


def resolve_chat_template(value: str | None, option: str = "data.chat_template") -> str | None:
    """The Jinja text `value` stands for (None stays None); a ChatTemplateError naming `option` otherwise."""
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ChatTemplateError(f"{option} must be a built-in name ({', '.join(BUILTIN)}), a Jinja string or a "
                                f"file, got {value!r}")
    if value in BUILTIN:
        return BUILTIN[value]
    if "{{" in value or "{%" in value:
        return value
    path = Path(value).expanduser()
    if path.is_file():
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError) as err:
            raise ChatTemplateError(f"{option}: cannot read {path}: {err}") from err
        if path.suffix == ".json":
            try:
                template = json.loads(text).get("chat_template")
            except (json.JSONDecodeError, AttributeError) as err:
                raise ChatTemplateError(f"{option}: {path} is not a JSON object: {err}") from err
            if not isinstance(template, str):
                raise ChatTemplateError(f"{option}: {path} holds no string field 'chat_template'")
            return template
        return text
    raise ChatTemplateError(f"{option}: {value!r} is not a built-in template ({', '.join(BUILTIN)}), a Jinja "
                            f"string or an existing file")


def missing_template_error(tokenizer_name: str, option: str) -> ChatTemplateError:
    return ChatTemplateError(
        f"the tokenizer of {tokenizer_name} has no chat template: set {option} to a built-in template "
        f"({', '.join(BUILTIN)}; Vicuna and Medusa's recipes use vicuna_v1.1), a Jinja string or a file")

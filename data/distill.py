"""Self-distillation: regenerate the assistant turns of a ShareGPT-format dataset with the base model itself.

Heads learn to predict what *this* base model will say, which is what speculation must match.
Each conversation's assistant turns are regenerated in order, the regenerated answers fed back
(the original answers are dropped). Who answers is a backend (data/answer_backends.py): HF `generate` here
(batched with left padding, bf16 where the CPU has it), vLLM's offline engine (--backend vllm) or an
OpenAI-compatible server (--endpoint URL); each gets the same prompt token ids, rendered with the chat template
the training uses.
Resumable: records are appended one complete line at a time; a rerun skips the conversations
already written (and drops a half-written last line), so nothing is duplicated or lost.
Output is ShareGPT-format JSONL that `data.dataset` accepts. The command line is scripts/self_distill.py.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from specheads.data.answer_backends import (BACKENDS, AnswerBackend, BackendError, EndpointBackend, HFBackend,
                                            Sampling, VLLMBackend, stop_token_ids)
from specheads.data.models import add_device_arguments, load_base_model, load_tokenizer, resolve_model
from specheads.heads.files import check_output_file
from specheads.data.sharegpt import load_conversations, split_heldout
from specheads.data.questions import base_id
from specheads.data.arguments import non_negative_float, non_negative_int, positive_int, top_p

USAGE = """Regenerate the assistant turns of a ShareGPT-format dataset with the base model itself.

    python scripts/self_distill.py --model smollm2-135m-instruct --dataset sharegpt \\
        --out runs/distill/smollm2-sharegpt.jsonl --limit 1000 --max-new-tokens 256

Heads learn to predict what *this* base model will say, which is what speculation must match.
Resumable: a rerun skips the conversations already written (and drops a half-written last line).
Output is ShareGPT-format JSONL that `data.dataset` accepts.
"""


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=USAGE,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--dataset", default="sharegpt")
    parser.add_argument("--out", required=True)
    parser.add_argument("--split", choices=["train", "heldout", "all"], default="all",
                        help="which side of the fixed held-out split to regenerate")
    parser.add_argument("--heldout-size", type=positive_int, default=200)
    parser.add_argument("--split-seed", type=int, default=0)
    parser.add_argument("--limit", type=positive_int, default=None, help="conversations to regenerate")
    parser.add_argument("--skip", type=non_negative_int, default=0,
                        help="pass over this many selected conversations first: --skip 3000 --limit 1800 answers "
                             "the 3,001st to 4,800th, as --limit 4800 does after a --limit 3000 run, batch for batch")
    parser.add_argument("--max-turns", type=positive_int, default=1, help="user turns kept per conversation")
    parser.add_argument("--max-prompt-tokens", type=positive_int, default=512, help="skip longer prompts")
    parser.add_argument("--max-new-tokens", type=positive_int, default=256)
    parser.add_argument("--batch-size", type=positive_int, default=16)
    parser.add_argument("--temperature", type=non_negative_float, default=0.0, help="0: greedy")
    parser.add_argument("--top-p", type=top_p, default=1.0)
    add_device_arguments(parser)  # --device (auto: a GPU when there is one), --dtype, --device-map
    parser.add_argument("--chat-template", default=None,
                        help="prompt format, as the training will use it (data.chat_template): a built-in name, "
                             "Jinja string or file; needed for a tokenizer that ships none (Vicuna)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--backend", choices=BACKENDS, default="hf",
                        help="who answers: hf (transformers' generate here) or vllm (vLLM's offline engine in its own "
                             "venv, `make setup-engines`; --dtype applies, --device is vLLM's own)")
    parser.add_argument("--endpoint", default=None, metavar="URL",
                        help="answer through an OpenAI-compatible server instead (vLLM, SGLang, TGI, llama.cpp's "
                             "server): URL/v1/completions gets the prompts as token ids")
    parser.add_argument("--served-model", default=None,
                        help="the model name the --endpoint serves (default: --model)")
    parser.add_argument("--engine-log", default=None, help="vLLM's log file (--backend vllm; default: a temp file)")
    args = parser.parse_args(argv)
    if args.endpoint and args.backend != "hf":
        parser.error("--endpoint and --backend vllm both name who answers: give one")
    return args


def open_backend(args, tokenizer) -> AnswerBackend:
    """The backend the command line asks for (loads the model where it runs here)."""
    sampling = Sampling(args.max_new_tokens, args.temperature, args.top_p, args.seed)
    if args.endpoint:
        return EndpointBackend(args.endpoint, args.served_model or args.model, sampling)
    model_path = resolve_model(args.model)
    if args.backend == "vllm":
        return VLLMBackend(model_path, tokenizer, sampling, stop_token_ids(model_path, tokenizer), args.dtype,
                           log=args.engine_log)
    model = load_base_model(args.model, args.dtype, args.device, device_map=args.device_map)
    return HFBackend(model, tokenizer, sampling, stop_token_ids(model_path, tokenizer))


def completed_ids(path: Path, warn=None) -> set[str]:
    """Ids already written. A last line without a newline is a complete record when it parses as one (a file
    edited by hand): kept, its newline added. Only a torn last line (one that does not parse: the process was
    killed mid-write) is cut off, and `warn` (default: stderr) is told. Any other line that is not a record with
    an "id" stops the run with the file and line named, and the file is left as it was."""
    if not path.exists():
        return set()
    data = path.read_bytes()
    good_end, done = 0, set()
    for number, line in enumerate(data.splitlines(keepends=True), 1):
        try:
            record_id = json.loads(line)["id"]
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as err:
            if not line.endswith(b"\n"):
                break  # the torn tail
            raise ValueError(f"{path}, line {number}: not a record with an \"id\" ({type(err).__name__}: {err}); "
                             f"fix or remove that line, nothing was changed") from err
        done.add(record_id)
        good_end += len(line)
    if good_end < len(data):
        (warn or (lambda line: print(line, file=sys.stderr)))(
            f"{path}: dropped a torn last line ({len(data) - good_end} bytes that are not a whole record: a run "
            f"killed mid-write); its conversation is answered again")
        with open(path, "r+b") as f:
            f.truncate(good_end)
    elif data and not data.endswith(b"\n"):
        with open(path, "ab") as f:  # a complete last record: the next one goes on a line of its own
            f.write(b"\n")
    return done


def render_prompts(tokenizer, histories: list[list[dict]]) -> list[list[int]]:
    """Each history through the chat template, ready for the assistant's turn, as token ids (every backend gets
    these very ids)."""
    texts = [tokenizer.apply_chat_template(h, tokenize=False, add_generation_prompt=True) for h in histories]
    return [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]


def answer_batch(backend: AnswerBackend, tokenizer, histories: list[list[dict]]) -> tuple[list[str], int]:
    """One assistant turn for each history; returns texts and new-token count."""
    return backend.answer(render_prompts(tokenizer, histories))


BENCHMARK_QUESTIONS = ("sharegpt-test.jsonl", "sharegpt-tune.jsonl")  # in data/questions/


def benchmark_conversations() -> frozenset[str]:
    """The original ShareGPT conversations (id before its _N segment suffix) the benchmark's test and tune
    questions come from: never answered for training, so the test split stays unseen."""
    folder = Path(__file__).resolve().parent / "questions"
    ids = set()
    for name in BENCHMARK_QUESTIONS:
        path = folder / name
        if path.is_file():
            ids.update(base_id(json.loads(line)["question_id"])
                       for line in path.read_text().splitlines() if line.strip())
    return frozenset(ids)


def work_list(conversations, tokenizer, max_turns: int, max_prompt_tokens: int, limit: int | None,
              exclude: frozenset[str] = frozenset()) -> list[tuple]:
    """(prompt length, id, system turn, user turns) of each conversation to regenerate, in data order, leaving
    out conversations cut from an original in `exclude`: a pure function of the arguments, so a rerun sees the
    same list."""
    todo = []
    for conversation in conversations:
        if base_id(conversation.id) in exclude:
            continue
        users = [m for m in conversation.messages if m["role"] == "user"][:max_turns]
        system = [m for m in conversation.messages[:1] if m["role"] == "system"]
        prompt = tokenizer.apply_chat_template(system + users[:1], tokenize=True, add_generation_prompt=True)
        prompt_length = len(getattr(prompt, "input_ids", prompt))
        if prompt_length <= max_prompt_tokens:
            todo.append((prompt_length, conversation.id, system, users))
        if limit is not None and len(todo) >= limit:
            break
    return todo


def source_conversations(dataset: str, split: str, heldout_size: int, split_seed: int) -> list:
    """The conversations of `dataset` to answer. --split all keeps prompt-only records too (an offline prompt
    file). --split train / heldout splits the answered conversations, as everything else does (training, the
    benchmark questions' held-out side): a record without an answer added to the list would move the split."""
    if split == "all":
        return load_conversations(dataset, require_answer=False)
    train, heldout = split_heldout(load_conversations(dataset), heldout_size, split_seed)
    return train if split == "train" else heldout


def sharegpt_record(conv_id: str, history: list[dict]) -> dict:
    return {"id": conv_id, "conversations": [
        {"from": {"user": "human", "assistant": "gpt"}.get(m["role"], m["role"]), "value": m["content"]}
        for m in history]}


def main(argv=None):
    args = parse_args(argv)
    out = Path(args.out)
    try:  # before any model loads: a damaged file or an --out that cannot be written stops the run at once
        check_output_file(out, [("--dataset", args.dataset), ("--model folder", args.model)])
        done = completed_ids(out)
    except ValueError as err:
        raise SystemExit(f"self_distill.py: {err}") from err
    torch.manual_seed(args.seed)
    try:  # also before any model loads; a damaged data file is named with its line
        conversations = source_conversations(args.dataset, args.split, args.heldout_size, args.split_seed)
    except (ValueError, FileNotFoundError) as err:
        raise SystemExit(f"self_distill.py: --dataset: {err}") from err
    try:
        tokenizer = load_tokenizer(args.model, args.chat_template, option="--chat-template")
    except ValueError as err:
        raise SystemExit(f"self_distill.py: {err}") from err
    tokenizer.padding_side = "left"

    todo = work_list(conversations, tokenizer, args.max_turns, args.max_prompt_tokens,
                     None if args.limit is None else args.skip + args.limit, benchmark_conversations())[args.skip:]
    out.parent.mkdir(parents=True, exist_ok=True)
    # Batches of similar prompt length waste little on padding.
    pending = [item[1:] for item in sorted(todo, key=lambda item: item[0]) if item[1] not in done]
    print(f"{len(todo)} conversations selected, {len(todo) - len(pending)} already written, {len(pending)} to go")
    if not pending:
        return
    try:
        backend = open_backend(args, tokenizer)
    except BackendError as err:
        raise SystemExit(f"self_distill.py: {err}") from err
    try:
        write_answers(backend, tokenizer, pending, len(todo), out, args.batch_size)
    except BackendError as err:
        raise SystemExit(f"self_distill.py: {err}; the answers written so far are kept: rerun to go on") from err
    finally:
        backend.close()


def write_answers(backend: AnswerBackend, tokenizer, pending: list[tuple], selected: int, out: Path,
                  batch_size: int) -> None:
    """Answer `pending` (id, system turn, user turns) batch by batch, turn by turn (each answer regenerated with the
    regenerated history), appending whole records to `out`."""
    progress = tqdm(total=selected, initial=selected - len(pending), desc=f"self-distilling ({backend.name})")
    start, total_tokens = time.time(), 0
    with open(out, "a", encoding="utf-8") as sink:
        for i in range(0, len(pending), batch_size):
            group = pending[i:i + batch_size]
            histories = [list(system) for _, system, _ in group]
            for turn in range(max(len(users) for _, _, users in group)):
                active = [j for j, (_, _, users) in enumerate(group) if turn < len(users)]
                for j in active:
                    histories[j].append(group[j][2][turn])
                answers, new_tokens = answer_batch(backend, tokenizer, [histories[j] for j in active])
                total_tokens += new_tokens
                for j, answer in zip(active, answers):
                    histories[j].append({"role": "assistant", "content": answer})
            for (conv_id, _, _), history in zip(group, histories):
                sink.write(json.dumps(sharegpt_record(conv_id, history), ensure_ascii=False) + "\n")
            sink.flush()
            os.fsync(sink.fileno())
            progress.update(len(group))
            progress.set_postfix(tokens_s=f"{total_tokens / (time.time() - start):.0f}")
    progress.close()
    elapsed = time.time() - start
    if total_tokens:
        print(f"generated {total_tokens} tokens in {elapsed:.0f} s ({total_tokens / elapsed:.0f} tokens/s, "
              f"{len(pending) / elapsed * 3600:.0f} answers/hour, {backend.name})")

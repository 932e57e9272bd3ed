"""Chat with a model in the terminal, decoding with draft heads (or plainly with --no-heads).

    python inference/chat.py --model smollm2-135m-instruct --heads runs/smollm2-135m-medusa1/heads
    python inference/chat.py --heads runs/smollm2-135m-eagle3/heads      # EAGLE drafts: EAGLE-2 dynamic tree
    python inference/chat.py --model smollm2-135m-instruct --no-heads --prompt "Hello!"
    python inference/chat.py --heads runs/smollm2-135m-medusa1/heads --prompt-lookup   # heads + prompt lookup

Commands: /reset clears the conversation, /quit (or Ctrl-D, Ctrl-C) leaves. After each answer
one line reports tokens, tokens/s and τ (tokens per base forward). Ctrl-C while loading or answering --prompt
exits quietly with status 130, what was already written left as it is.
"""

from __future__ import annotations

import argparse
import sys

from specheads.data.models import add_device_arguments
from specheads.inference.cli import non_negative_float, non_negative_int, positive_int, top_p
from specheads.inference.cpu_verify import add_untuned_cpu_argument
from specheads.inference.decoder import SamplingConfig
from specheads.inference.generate import SpeculativeGenerator
from specheads.inference.methods import add_method_arguments, options_from_args
from specheads.inference.tree import TreeError
from specheads.inference.verify import PromptTooLongError

DEFAULT_HEADS = "runs/smollm2-135m-medusa1/heads"


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct", help="built-in name, HF id or local path")
    parser.add_argument("--heads", default=None,
                        help=f"Medusa heads or EAGLE draft folder (default {DEFAULT_HEADS} if present)")
    parser.add_argument("--no-heads", action="store_true", help="plain decoding, one token per forward")
    parser.add_argument("--prompt-lookup", action="store_true",
                        help="also draft by copying from the conversation (prompt lookup, trusted by match length; "
                             "bench.py's medusa_pld); with --no-heads, prompt lookup alone")
    add_method_arguments(parser)  # --tree, --eagle-top-k ..., --pld-*: the same flags as bench.py's
    add_device_arguments(parser)  # --device (auto: a GPU when there is one), --dtype, --device-map
    parser.add_argument("--chat-template", default=None,
                        help="prompt format: a built-in name (vicuna_v1.1, llama-2, chatml, zephyr, alpaca), a Jinja "
                             "string or file; default: the one stored with the heads, else the tokenizer's")
    add_untuned_cpu_argument(parser)
    parser.add_argument("--temperature", type=non_negative_float, default=0.0, help="0: greedy")
    parser.add_argument("--top-p", type=top_p, default=1.0, help="nucleus sampling mass, in (0, 1]")
    parser.add_argument("--top-k", type=non_negative_int, default=0, help="0: off")
    parser.add_argument("--acceptance", default="auto", choices=["auto", "greedy", "typical", "lossless"])
    parser.add_argument("--max-new-tokens", type=positive_int, default=256)
    parser.add_argument("--system", default=None, help="system prompt")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--prompt", default=None, help="answer this once and exit")
    return parser.parse_args(argv)


def load_generator(args) -> SpeculativeGenerator:
    from pathlib import Path

    heads = None
    if not args.no_heads:
        heads = args.heads or (DEFAULT_HEADS if Path(DEFAULT_HEADS).is_dir() else None)
        if heads is None:
            raise SystemExit(f"no heads: pass --heads DIR (e.g. after `make demo`: {DEFAULT_HEADS}) or --no-heads")
    try:
        options = options_from_args(args)
    except ValueError as err:
        raise SystemExit(f"chat.py: {err}") from err
    try:
        return SpeculativeGenerator.from_pretrained(args.model, heads, args.dtype, prompt_lookup=args.prompt_lookup,
                                                    cpu_tuning=not args.untuned_cpu, options=options,
                                                    device=args.device, device_map=args.device_map,
                                                    chat_template=args.chat_template)
    except TreeError as err:  # a tree these heads cannot fill (too deep, ranks beyond their vocabulary)
        raise SystemExit(f"--tree: {err}" if options.tree is not None else f"the tree stored in {heads}: {err}") from err
    except (FileNotFoundError, ValueError) as err:  # a missing or damaged model or heads folder: the error names it
        raise SystemExit(f"chat.py: {err}") from err


def answer(generator, messages, args, out) -> str:
    sampling = SamplingConfig(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                              acceptance=args.acceptance, seed=args.seed)
    pieces = []
    for piece in generator.stream(messages, args.max_new_tokens, sampling):
        pieces.append(piece)
        out.write(piece)
        out.flush()
    stats = generator.stats
    out.write(f"\n[{stats.new_tokens} tokens, {stats.tokens_per_s:.1f} tokens/s, tau {stats.tau:.2f}]\n")
    out.flush()
    return "".join(pieces)


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        return run(args)
    except KeyboardInterrupt:  # Ctrl-C while loading or answering --prompt: no traceback, 130 as for SIGINT
        sys.stdout.write("\n")
        sys.stdout.flush()
        return 130
    except PromptTooLongError as err:  # --prompt longer than the model's context
        print(f"chat.py: --prompt: {err}", file=sys.stderr)
        return 1


def run(args) -> int:
    generator = load_generator(args)
    start = [{"role": "system", "content": args.system}] if args.system else []
    messages = list(start)
    out = sys.stdout
    if args.prompt is not None:
        answer(generator, messages + [{"role": "user", "content": args.prompt}], args, out)
        return 0
    interactive = sys.stdin.isatty()
    if interactive:
        out.write("specheads chat: /reset clears the conversation, /quit leaves.\n")
    try:
        while True:
            if interactive:
                out.write("> ")
                out.flush()
            line = sys.stdin.readline()
            if not line:  # EOF
                break
            text = line.strip()
            if not text:
                continue
            if text in ("/quit", "/exit"):
                break
            if text == "/reset":
                messages = list(start)
                out.write("[conversation cleared]\n")
                continue
            messages.append({"role": "user", "content": text})
            try:
                reply = answer(generator, messages, args, out)
            except PromptTooLongError as err:  # the conversation outgrew the context: say so, keep the session
                messages.pop()
                print(f"chat.py: {err}; /reset starts a new conversation", file=sys.stderr)
                continue
            messages.append({"role": "assistant", "content": reply})
    except KeyboardInterrupt:
        out.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

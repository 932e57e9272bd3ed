"""Pick an EAGLE draft's dynamic-tree shape for this machine and store it with the draft.

    python scripts/tune_eagle_tree.py --heads runs/smollm2-135m-eagle3/heads --prompts 6     (this module's CLI)

The best tree depends on the draft's accuracy and on what a verify forward of n tokens costs here
(on 2 CPU cores 32 tokens cost ~1.6x one token; on a GPU they are nearly free). So this measures,
on held-out dev prompts, tokens/s of each (top_k, depth, total_tokens, min_prob) candidate against plain
decoding in the same process (interleaved prompt by prompt), and writes the fastest into the draft's config.json as `eagle_tree`
(chat.py and bench.py use it unless told otherwise).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from specheads.data.models import add_device_arguments, load_base_model
from specheads.heads.files import FileWriteError, update_config
from specheads.heads import load_heads
from specheads.heads.kinds import kind_of
from specheads.inference.cli import positive_int
from specheads.inference.decoder import TreeDecoder
from specheads.inference.eagle import check_tree_settings
from specheads.inference.methods import MethodOptions, build_decoder, method_for
from specheads.inference.generate import chat_input_ids, chat_tokenizer, eos_token_ids
from specheads.inference.cpu_verify import add_untuned_cpu_argument, prepare_cpu_verify
from specheads.inference.timing import interleaved_speeds

# (top_k, depth, total_tokens, min_prob): min_prob > 0 drops nodes the draft itself finds unlikely. On 2 CPU
# cores min_prob 0.02-0.05 made every shape faster at nearly the same τ (README results); on a GPU, where
# verified tokens are nearly free, the larger trees with min_prob 0 tend to win.
CANDIDATES = [(4, 4, 10, 0.0), (6, 5, 18, 0.0), (10, 6, 40, 0.0), (4, 4, 10, 0.03), (6, 5, 14, 0.03),
              (8, 6, 26, 0.03), (10, 7, 40, 0.03), (8, 6, 26, 0.05)]
SHAPE_KEYS = ("top_k", "depth", "total_tokens", "min_prob")


def parse_shape(text: str) -> tuple:
    """"top_k,depth,total_tokens[,min_prob]" -> (top_k, depth, total_tokens, min_prob); ValueError if invalid."""
    values = text.split(",")
    if len(values) not in (3, 4):
        raise ValueError(text)
    top_k, depth, total = (int(v) for v in values[:3])
    min_prob = float(values[3]) if len(values) == 4 else 0.0
    check_tree_settings(top_k, depth, total, min_prob)  # the checks EagleCandidates makes, before any timing
    return top_k, depth, total, min_prob


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--heads", required=True, help="EAGLE draft folder (EagleDraft.save_pretrained)")
    parser.add_argument("--questions", default="data/questions/sharegpt-dev.jsonl")
    parser.add_argument("--prompts", type=positive_int, default=6, help="dev prompts to time (the last ones of the file)")
    parser.add_argument("--max-new-tokens", type=positive_int, default=96)
    add_device_arguments(parser)  # --device (auto: a GPU when there is one), --dtype, --device-map
    parser.add_argument("--chat-template", default=None, help="prompt format; default: the one stored with the heads")
    add_untuned_cpu_argument(parser)
    parser.add_argument("--shapes", default=None,
                        help="candidate shapes top_k,depth,total_tokens[,min_prob] separated by ';' (default: %s)"
                        % ";".join(",".join(map(str, shape)) for shape in CANDIDATES))
    parser.add_argument("--dry-run", action="store_true", help="measure and print, do not write config.json")
    args = parser.parse_args(argv)
    given = args.shapes
    try:
        args.shapes = [parse_shape(shape) for shape in given.split(";")] if given else CANDIDATES
        if len(set(args.shapes)) != len(args.shapes):
            parser.error(f"--shapes: a shape is given twice in {given!r}")
    except ValueError:
        parser.error(f"--shapes: expected top_k,depth,total_tokens[,min_prob][;...] (top_k >= 1, depth >= 1, "
                     f"total_tokens >= 2, 0 <= min_prob < 1), got {given!r}")
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    tokenizer = chat_tokenizer(args.model, args.heads, args.chat_template)
    model = load_base_model(args.model, args.dtype, args.device, device_map=args.device_map)
    draft = load_heads(args.heads, model)
    kind = kind_of(draft)
    if kind.chain != "dynamic":
        hint = "use scripts/build_tree.py for those" if kind.name == "medusa" else "it drafts a block, not a tree"
        raise SystemExit(f"{args.heads} holds {kind.title}, not an EAGLE draft: {hint}")
    prepare_cpu_verify(model, draft, enabled=not args.untuned_cpu)
    eos = eos_token_ids(model, tokenizer)
    questions = [json.loads(line) for line in Path(args.questions).read_text().splitlines() if line.strip()]
    # The benchmark takes the first questions; tune on the last ones so the two do not overlap.
    prompts = [chat_input_ids(tokenizer, q["turns"][0]) for q in questions[-args.prompts:]]
    decoders = {"plain": TreeDecoder(model)}
    for shape in args.shapes:
        decoders[shape] = build_decoder(method_for(draft), model, draft,
                                        MethodOptions(eagle_tree=dict(zip(SHAPE_KEYS, shape))))
    speeds = interleaved_speeds(decoders, prompts, args.max_new_tokens, eos)
    plain_speed = speeds.pop("plain")[0]
    print(f"plain decoding: {plain_speed:.1f} tokens/s")
    measured = []
    for shape, (speed, tau) in speeds.items():
        measured.append({**dict(zip(SHAPE_KEYS, shape)), "tokens_per_s": speed, "tau": tau,
                         "speedup": speed / plain_speed})
        top_k, depth, total, min_prob = shape
        print(f"top_k {top_k:2d} depth {depth} tokens {total:2d} min_prob {min_prob:g}: τ {tau:.2f}, "
              f"{speed:.1f} tokens/s, {speed / plain_speed:.2f}x")
    best = max(measured, key=lambda m: m["tokens_per_s"])
    chosen = {key: best[key] for key in SHAPE_KEYS}
    print(f"fastest: {chosen}")
    if not args.dry_run:
        try:
            path = update_config(args.heads, {"eagle_tree": chosen, "eagle_tree_measurements": {
                "plain_tokens_per_s": plain_speed, "candidates": measured}}, what="EAGLE draft")
        except FileWriteError as err:  # a full disk: config.json stays as it was
            raise SystemExit(f"tune_eagle_tree.py: {err}") from err
        print(f"stored in {path}")
    return chosen


"""Benchmark decoding methods on the same questions in one process (scripts/bench.py is this module's CLI).

    python scripts/bench.py --model smollm2-135m-instruct --heads runs/smollm2-135m-medusa1/heads \
        --questions data/questions/sharegpt-dev.jsonl --methods baseline,prompt_lookup,medusa \
        --temperature 0 --max-new-tokens 128 --out runs/bench

Methods: baseline (HF `generate`, the reference), hf_unpacked (the same with every linear through stock
F.linear, i.e. as transformers runs it without the CPU tuning's packed weights; a run then shows what packing
gives HF itself, and results.md adds each method's speedup against it), prompt_lookup (HF prompt lookup decoding, a peer),
plain (our decoder without heads), pld (prompt lookup as a candidate source of our decoder),
medusa (our tree decoder with the heads and their tree; --heads NAME=DIR,NAME=DIR compares several sets as
medusa:NAME; Medusa-2 heads decode on the base with their LoRA adapter merged, and an extra baseline:NAME
(HF greedy of that adapted model) is their reference for speedup and greedy match), medusa_pld (the heads with
prompt lookup: --pld-combine by-match = a lookup chain alone when the match is long enough to trust, a short
match merged with the heads' tree, else the heads' tree; first = the lookup chain when it finds one, else the
heads' tree; merge = both in one tree, verified in one forward), eagle2 / eagle3 (an EAGLE-1 / EAGLE-3 draft from --eagle-heads with an
EAGLE-2 dynamic tree of --eagle-tokens nodes), eagle2_pld / eagle3_pld (that draft with prompt lookup, as medusa_pld), dflash / dflash_pld (a DFlash block
drafter from --drafts, its chain or stored tree). --drafts (alias --eagle-heads) takes one folder of each kind.
Every method is built by the registry in inference/methods.py.
Seed methods: sps (draft-model speculative
sampling; the draft is the base's first --draft-layers layers + norm + lm_head, weights shared, γ fixed
or 'auto'), lookahead (Jacobi window W, n-grams N, pool G), hf_assisted (HF `generate` with that same
self-draft as assistant_model, HF's default assistant schedule), hf_prompt_lookup (= prompt_lookup).
Questions are JSONL {question_id, category, turns}; each turn is answered in order, the method's own
answers fed back. τ = new tokens / base forwards (counted with a forward hook, for every method).
Writes OUT/results.json, OUT/results.md and OUT/results.png.

--batch-size B: throughput mode. The questions' first turns are decoded B at a time (greedy): baseline is
HF batched `generate` (left padding), our methods with a batched form (plain, pld, medusa, medusa_pld,
eagle2(_pld), eagle3(_pld)) our batched decoder (inference/batched.py), each row at its own pace (drafts run row by row, the base forward batched).
Reported per method: total new tokens / total seconds, τ per row, speedup vs the HF batch, and greedy match
per row against it. Writes OUT/results.json and OUT/results.md.
"""

from __future__ import annotations

import argparse
import json
import sys

from specheads.data.models import add_device_arguments, load_base_model
from specheads.heads import load_heads
from specheads.heads.files import OutputPathError, check_output_dir
from specheads.heads.joint import adapter_of, load_adapted_base
from specheads.heads.loading import folder_kind, load_medusa_heads
from specheads.inference.cli import float_in, non_negative_float, non_negative_int, positive_int, top_p
from specheads.inference.cpu_verify import add_untuned_cpu_argument, prepare_cpu_verify
from specheads.inference.generate import chat_tokenizer
from specheads.inference.methods import METHODS, add_method_arguments, draft_kind, options_from_args
from specheads.inference.tree import TreeError, check_tree_fits
from specheads.inference.verify import PromptTooLongError

from .questions import load_questions
from .report import NOISE_BOUND, write_results
from .runner import own_baseline, registered, run_batched, run_single

DRAFT_KINDS = ("eagle1", "eagle3", "dflash")  # the drafts --drafts gives
BATCHED_METHODS = ("baseline", *(name for name, m in METHODS.items() if m.batched))  # --batch-size


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--heads", default=None, help="Medusa heads folder, or NAME=DIR,NAME=DIR to compare sets")
    parser.add_argument("--drafts", "--eagle-heads", dest="eagle_heads", default=None,
                        help="draft folder(s), comma-separated: an EAGLE-1 draft for eagle2*, an EAGLE-3 one for "
                             "eagle3*, a DFlash drafter for dflash*")
    parser.add_argument("--questions", default="data/questions/sharegpt-dev.jsonl")
    parser.add_argument("--methods", default="baseline,prompt_lookup,medusa")
    parser.add_argument("--temperature", type=non_negative_float, default=0.0, help="0: greedy")
    parser.add_argument("--top-p", type=top_p, default=1.0, help="nucleus sampling mass, in (0, 1]")
    parser.add_argument("--max-new-tokens", type=positive_int, default=128)
    parser.add_argument("--max-questions", type=positive_int, default=None)
    parser.add_argument("--categories", type=lambda text: [c for c in text.split(",") if c], default=None,
                        help="comma-separated: answer only questions of these categories (e.g. coding)")
    parser.add_argument("--skip-questions", type=non_negative_int, default=0,
                        help="start after this many questions of the file (e.g. a second, untuned half)")
    add_device_arguments(parser)  # --device (auto: a GPU when there is one), --dtype, --device-map
    parser.add_argument("--chat-template", default=None,
                        help="prompt format (built-in name, Jinja string or file); default: the one stored with the "
                             "first --heads / --drafts folder, else the tokenizer's")
    add_untuned_cpu_argument(parser)
    parser.add_argument("--seed", type=int, default=0)
    add_method_arguments(parser)  # --tree, --eagle-*, --pld-*, --draft-layers, --gamma, --lookahead-*: as chat.py
    parser.add_argument("--batch-size", type=positive_int, default=None,
                        help="throughput mode: decode first turns B at a time "
                             "(methods " + ", ".join(BATCHED_METHODS) + ")")
    parser.add_argument("--noise-bound", type=float_in(0.0, float("inf"), low_open=True), default=NOISE_BOUND,
                        help="flag the run as noisy when a fixed probe forward, timed before each question, varies "
                             "by more than this coefficient of variation (default %(default)s; single-row runs)")
    parser.add_argument("--experiment", default=None,
                        help="a name for a run that compares drafts not committed (e.g. dflash-vs-eagle3): the results "
                             "pages give it its own table, never a row of the summary or the README")
    parser.add_argument("--out", default="runs/bench")
    return parser.parse_args(argv)



def parse_heads_sets(spec: str | None) -> dict[str, str]:
    """--heads: 'DIR' -> {"medusa": DIR}; 'A=DIR1,B=DIR2' -> {"medusa:A": DIR1, "medusa:B": DIR2}."""
    if not spec:
        return {}
    entries = spec.split(",")
    if len(entries) == 1 and "=" not in entries[0]:
        return {"medusa": entries[0]}
    sets = {}
    for entry in entries:
        name, sep, directory = entry.partition("=")
        if not sep or not name or not directory:
            raise SystemExit(f"--heads: {entry!r} must look like NAME=DIR when several sets are compared")
        sets[f"medusa:{name}"] = directory
    return sets


def command_line(argv) -> str:
    return "python scripts/bench.py " + " ".join(sys.argv[1:] if argv is None else argv)



def load_drafts(args, methods, model) -> dict:
    """{bench method: draft} for the methods that decode with an EAGLE draft or a DFlash drafter, from --drafts
    (one folder of each kind at most: each method takes the one of its kind)."""
    wanted = [m for m in methods if METHODS[registered(m)].draft in DRAFT_KINDS]
    if not wanted:
        return {}
    if not args.eagle_heads:
        raise SystemExit(f"--methods {','.join(wanted)} need --drafts DIR[,DIR]")
    by_kind = {}
    for directory in args.eagle_heads.split(","):
        try:
            draft = load_heads(directory, model)
        except (FileNotFoundError, ValueError) as err:  # not a draft folder, damaged, or not this base's
            raise SystemExit(f"--drafts: {err}") from err
        kind = draft_kind(draft)
        if kind not in DRAFT_KINDS:
            raise SystemExit(f"--drafts: {directory} holds Medusa heads (give them with --heads), not an EAGLE "
                             "draft or a DFlash drafter")
        if kind in by_kind:
            raise SystemExit(f"--drafts: two {kind} drafts ({args.eagle_heads}); bench one at a time")
        by_kind[kind] = draft
    missing = [m for m in wanted if METHODS[m].draft not in by_kind]
    if missing:
        raise SystemExit(f"--methods {','.join(missing)}: no {'/'.join(METHODS[m].draft for m in missing)} draft "
                         f"among --drafts {args.eagle_heads}")
    return {m: by_kind[METHODS[m].draft] for m in wanted}


def check_inputs_and_out(args, methods) -> None:
    """Before any model loads: every --heads / --drafts folder a method needs holds a config.json specheads reads,
    and --out is created and writable, apart from every input (results that cannot be written are found out now,
    not after the run; the bench writes only its own named files, so an --out above an input is fine)."""
    kinds = {METHODS[registered(m)].draft for m in methods}
    folders = {"--heads": list(parse_heads_sets(args.heads).values()) if "medusa" in kinds else [],
               "--drafts": [d for d in (args.eagle_heads or "").split(",") if d] if kinds & set(DRAFT_KINDS) else []}
    for flag, directories in folders.items():
        for directory in directories:
            try:
                folder_kind(directory)
            except (FileNotFoundError, ValueError) as err:
                raise SystemExit(f"{flag}: {err}") from err
    inputs = [("--questions file", args.questions), ("--model folder", args.model),
              *(("--heads folder", d) for d in folders["--heads"]), *(("--drafts folder", d) for d in folders["--drafts"])]
    try:
        check_output_dir(args.out, inputs, above_inputs_ok=True)
    except OutputPathError as err:
        raise SystemExit(f"--out: {err}") from err


def main(argv=None):
    args = parse_args(argv)
    methods = args.methods.split(",")
    for m in methods:
        if m not in METHODS:
            raise SystemExit(f"--methods: unknown method {m!r}; choose from {', '.join(METHODS)}")
    try:
        options = options_from_args(args)
    except ValueError as err:
        raise SystemExit(str(err)) from err
    if any(METHODS[m].draft == "medusa" for m in methods) and not args.heads:
        raise SystemExit("--methods medusa/medusa_pld need --heads DIR")
    if args.batch_size:
        unknown = [m for m in methods if m not in BATCHED_METHODS]
        if unknown or args.temperature != 0:
            raise SystemExit(f"--batch-size: greedy (T=0) methods {', '.join(BATCHED_METHODS)} only "
                             f"(got {', '.join(methods)}, T={args.temperature})")
    try:  # before any model loads: a bad questions file stops the run at once
        questions = load_questions(args.questions, args.max_questions, args.skip_questions, args.categories)
    except ValueError as err:
        raise SystemExit(f"--questions: {err}") from err
    check_inputs_and_out(args, methods)
    first_draft = next(iter(parse_heads_sets(args.heads).values()), None) or (args.eagle_heads or "").split(",")[0]
    try:
        tokenizer = chat_tokenizer(args.model, first_draft or None, args.chat_template)
        model = load_base_model(args.model, args.dtype, args.device, device_map=args.device_map)
    except (FileNotFoundError, ValueError) as err:  # a missing model folder, a Hub id that cannot be fetched, no
        raise SystemExit(f"bench: {err}") from err      # chat template: each error names its flag or id
    heads = {}  # bench method -> (the model it decodes on, its Medusa heads)
    if any(METHODS[m].draft == "medusa" for m in methods):
        for method, directory in parse_heads_sets(args.heads).items():
            target = (load_adapted_base(load_base_model(args.model, args.dtype, args.device, device_map=args.device_map),
                                        directory) if adapter_of(directory) else model)
            try:
                heads[method] = (target, load_medusa_heads(directory, base_model=target))
            except (FileNotFoundError, ValueError) as err:  # not Medusa heads, damaged, or not this base's
                raise SystemExit(f"--heads: {err}") from err
        if "medusa" in methods and "medusa" not in heads:  # `medusa` stands for every named set
            methods = [n for m in methods for n in (heads if m == "medusa" else [m])]
        methods += [own_baseline(m) for m, (target, _) in heads.items()
                    if target is not model and m in methods]
        if args.batch_size and (len(heads) > 1 or next(iter(heads.values()))[0] is not model):
            raise SystemExit("--batch-size: one plain heads folder (a Medusa-2 folder: use its merged export)")
    for flag, tree in (("--tree", args.tree), ("--pld-heads-tree", args.pld_heads_tree)):
        for _, head_set in (heads.values() if tree else ()):  # before any decoding: can these heads fill it?
            try:
                check_tree_fits(json.loads(tree), head_set.config.num_heads, head_set.config.projected_vocab_size)
            except TreeError as err:
                raise SystemExit(f"{flag}: {err}") from err
    if "baseline" not in methods:
        methods = ["baseline"] + methods  # speedup is always against HF greedy in the same run
    layers = model.config.num_hidden_layers
    if {"sps", "hf_assisted"} & set(methods) and args.draft_layers and args.draft_layers > layers:
        raise SystemExit(f"--draft-layers: num_layers must be in 1..{layers}, got {args.draft_layers}")
    loaded = load_drafts(args, methods, model)
    drafts = {m: (model, d) for m, d in loaded.items()}
    drafts.update(heads)
    for m in methods:  # medusa_pld decodes with the `medusa` set, else the first named one
        if m == "medusa_pld":
            drafts[m] = heads.get("medusa") or next(iter(heads.values()))
    # every method, the baseline included, runs on the same (packed or plain) weights
    prepare_cpu_verify(model, *(m for pair in heads.values() for m in pair), *loaded.values(),
                       enabled=not args.untuned_cpu)
    command = command_line(argv)
    try:
        if args.batch_size:
            results, records = run_batched(args, options, model, tokenizer, methods, drafts, questions, command), None
        else:
            results, records = run_single(args, options, model, tokenizer, methods, drafts, questions, command)
    except PromptTooLongError as err:
        raise SystemExit(f"--questions {args.questions}: {err}") from err
    print(write_results(args.out, results, records))
    return results

"""Running the benchmark's methods on the same questions in one process: decoders from the methods registry.

Each method is built once (methods.build_source, or HF `generate` arguments for the peers), then every question
is answered by every method in turn, interleaved so that machine noise hits all of them alike. τ counts the base
model's forwards with a forward hook, for every method alike.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections import defaultdict

import torch
from tqdm.auto import tqdm

from specheads.inference.batched import BatchedTreeDecoder, left_pad
from specheads.inference.cpu_verify import stock_linears
from specheads.inference.decoder import SamplingConfig, TreeDecoder
from specheads.inference.generate import chat_input_ids, eos_token_ids
from specheads.inference.timing import synchronize
from specheads.inference.methods import METHODS, Context, MethodOptions, build_source
from specheads.inference.verify import PromptTooLongError, position_budget

from .report import NOISE_BOUND, machine_noise, run_header, summarise


class ForwardCounter:
    """Counts calls of the base model's forward (one per verification or decode step)."""

    def __init__(self, model):
        self.calls = 0
        model.register_forward_hook(self._hook)

    def _hook(self, *args):
        self.calls += 1


class Probe:
    """A fixed forward of the base model (the same 64 token ids, no cache), timed before each question: its time
    does not depend on any text, so its spread over the run is the machine's (report.machine_noise)."""

    def __init__(self, model, tokens: int = 64, repeats: int = 3):
        self.model, self.repeats = model, repeats
        self.ids = (torch.arange(tokens) % model.config.vocab_size).unsqueeze(0).to(model.device)
        self.seconds: list[float] = []

    def __call__(self) -> None:
        times = []
        with torch.inference_mode():
            for _ in range(self.repeats):
                synchronize(self.model.device)
                start = time.perf_counter()
                self.model(self.ids, use_cache=False)
                synchronize(self.model.device)
                times.append(time.perf_counter() - start)
        self.seconds.append(sorted(times)[len(times) // 2])  # the median: one preempted call is not the machine


def scoped_options(method: str, options: MethodOptions) -> MethodOptions:
    """The options one method of a mixed run decodes with: --tree is the Medusa and DFlash methods' static tree,
    which an EAGLE method (it grows its own, set with --eagle-*) leaves aside instead of refusing the run."""
    if options.tree is not None and METHODS[registered(method)].draft in ("eagle1", "eagle3"):
        return dataclasses.replace(options, tree=None)
    return options


def fits(model, prompt_length: int, question: dict, turn: int) -> None:
    """PromptTooLongError naming the question and turn whose prompt exceeds the model's positions."""
    try:
        position_budget(model, prompt_length, 1)
    except PromptTooLongError as err:
        raise PromptTooLongError(f"question {question['question_id']!r}, turn {turn + 1}: {err}") from None


def registered(method: str) -> str:
    """The registry name of a bench method: medusa:NAME (one of several heads sets) and baseline:NAME (HF greedy
    of a Medusa-2 set's adapted model) are medusa and baseline."""
    return method.partition(":")[0]


def own_baseline(method: str) -> str:
    """The name of HF greedy on the adapted model a Medusa-2 method decodes with."""
    return "baseline:" + (method.partition(":")[2] or method)


def reference_of(method: str, methods) -> str:
    """The HF greedy run a method is compared with: its own adapted model's, else the base's."""
    own = own_baseline(method)
    return own if own in methods and not method.startswith("baseline") else "baseline"


class Runner:
    """Single-row runs. drafts: {bench method: (the model it decodes on, its draft)} for the methods with a draft;
    a Medusa-2 set decodes on its adapted model, which gets its own forward counter and HF greedy reference."""

    def __init__(self, args, options: MethodOptions, model, tokenizer, methods, drafts: dict):
        self.args, self.model, self.tokenizer = args, model, tokenizer
        self.eos = eos_token_ids(model, tokenizer)
        self.counter = ForwardCounter(model)
        self.model_of, self.counter_of = {}, {}  # methods that run on another (LoRA-adapted) model
        plain = Context(model, None, options)  # sps and hf_assisted share its self-draft
        self.decoders, self.hf_kwargs = {}, {}
        for method in methods:
            spec = METHODS[registered(method)]
            target, draft = drafts.get(method, (model, None))
            if target is not model:  # Medusa-2: its own model, forward counter and HF greedy reference
                counter = ForwardCounter(target)
                for name in (method, own_baseline(method)):
                    self.model_of[name], self.counter_of[name] = target, counter
            if spec.ours:
                ctx = plain if draft is None else Context(target, draft, scoped_options(method, options))
                self.decoders[method] = TreeDecoder(target, candidates=build_source(spec.name, target, draft,
                                                                                    ctx.options, context=ctx))
            else:
                self.hf_kwargs[method] = spec.hf(plain)
        self.sampling = SamplingConfig(temperature=args.temperature, top_p=args.top_p)

    def generate(self, method: str, input_ids: torch.Tensor, seed: int) -> tuple[list[int], dict]:
        """New token ids, and (our decoders only) tokens per step and where the step time went."""
        max_new = self.args.max_new_tokens
        if method in self.decoders:
            decoder = self.decoders[method]
            self.sampling.seed = seed
            ids = decoder.generate_ids(input_ids, max_new, self.sampling, self.eos)
            stats = decoder.stats
            return ids, {"accepted": list(stats.accepted_lengths), "step_seconds": stats.step_seconds,
                         "verify_seconds": stats.verify_seconds, "draft_seconds": stats.draft_seconds}
        kwargs = dict(max_new_tokens=max_new, eos_token_id=self.eos, pad_token_id=self.tokenizer.pad_token_id,
                      attention_mask=torch.ones_like(input_ids), **self.hf_kwargs[method])
        if self.args.temperature > 0:
            torch.manual_seed(seed)
            kwargs.update(do_sample=True, temperature=self.args.temperature, top_p=self.args.top_p)
        else:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        unpacked = stock_linears() if method == "hf_unpacked" else contextlib.nullcontext()
        with torch.inference_mode(), unpacked:
            out = self.model_of.get(method, self.model).generate(input_ids, **kwargs)
        return out[0, input_ids.shape[1]:].tolist(), {"accepted": []}

    def run_question(self, method: str, question: dict) -> dict:
        messages, turns = [], []
        for i, turn in enumerate(question["turns"]):
            messages.append({"role": "user", "content": turn})
            input_ids = chat_input_ids(self.tokenizer, messages)
            fits(self.model, input_ids.shape[1], question, i)  # HF generate would run past the positions silently
            counter = self.counter_of.get(method, self.counter)
            counter.calls = 0
            start = time.perf_counter()
            ids, extra = self.generate(method, input_ids, seed=self.args.seed + i)
            seconds = time.perf_counter() - start
            turns.append({"tokens": ids, "seconds": seconds, "forwards": counter.calls, **extra})
            messages.append({"role": "assistant", "content": self.tokenizer.decode(ids, skip_special_tokens=True)})
        new = sum(len(t["tokens"]) for t in turns)
        return {"question_id": question["question_id"], "category": question["category"], "turns": turns,
                "new_tokens": new, "seconds": sum(t["seconds"] for t in turns),
                "forwards": sum(t["forwards"] for t in turns)}


def method_results(records: dict, methods: list[str], greedy: bool) -> dict:
    """A single-row run's per-method figures from its records (overall and per category, against each method's
    reference) and the accepted lengths' histogram: {"methods": ..., "accepted_length_histogram": ...}."""
    out = {"methods": {}, "accepted_length_histogram": {}}
    for method in methods:
        base = records[reference_of(method, methods)] if method != "baseline" else None
        by_category = defaultdict(list)
        for i, r in enumerate(records[method]):
            by_category[r["category"]].append(i)
        per_category = {c: summarise([records[method][i] for i in idx],
                                     [base[i] for i in idx] if base else None, greedy)
                        for c, idx in sorted(by_category.items())}
        out["methods"][method] = {"overall": summarise(records[method], base, greedy), "per_category": per_category}
        hist = defaultdict(int)
        for r in records[method]:
            for t in r["turns"]:
                for a in t["accepted"]:
                    hist[str(a)] += 1
        out["accepted_length_histogram"][method] = dict(hist)
    return out


def run_single(args, options, model, tokenizer, methods, drafts, questions, command: str) -> tuple[dict, dict]:
    """Every method on every question (all turns); -> (results, records per method)."""
    for question in questions:  # every first turn fits, before any is timed (later turns are checked as they come)
        fits(model, chat_input_ids(tokenizer, question["turns"][0]).shape[1], question, 0)
    runner = Runner(args, options, model, tokenizer, methods, drafts)
    for method in methods:  # warm-up: first calls allocate and tune kernels
        runner.run_question(method, {**questions[0], "turns": questions[0]["turns"][:1]})
    records = {m: [] for m in methods}
    probe = Probe(model)
    probe()  # warm-up
    probe.seconds.clear()
    for question in tqdm(questions, desc="questions"):
        probe()
        for method in methods:  # interleaved, so machine noise hits every method alike
            records[method].append(runner.run_question(method, question))

    results = {**run_header(args, model, command, len(questions))}
    results.update(method_results(records, methods, greedy=args.temperature == 0))
    # how much the machine moved over the run (report.machine_noise)
    results["noise"] = machine_noise(probe.seconds, records.get("baseline", []), getattr(args, "noise_bound", NOISE_BOUND))
    return results, records


def hf_generate_batch(model, tokenizer, prompts: list[list[int]], max_new_tokens: int, eos: list[int]):
    """HF batched greedy `generate` on left-padded prompts; each row cut after its first EOS."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[0]
    ids, valid = left_pad(prompts, pad, model.device)
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=valid.long(), max_new_tokens=max_new_tokens,
                             do_sample=False, temperature=None, top_p=None, top_k=None, eos_token_id=eos,
                             pad_token_id=pad)[:, ids.shape[1]:].tolist()
    rows = []
    for row in out:
        stop = next((i for i, t in enumerate(row) if t in eos), None)
        rows.append(row if stop is None else row[: stop + 1])
    return rows


def run_batched(args, options, model, tokenizer, methods, drafts, questions, command: str) -> dict:
    """Throughput of decoding the first turns B at a time, every method on the same batches."""
    eos = eos_token_ids(model, tokenizer)
    decoders = {}
    for method in methods:
        if method != "baseline":
            draft = drafts[method][1] if method in drafts else None  # batched: every draft is on the base itself
            decoders[method] = BatchedTreeDecoder(model, candidates=build_source(registered(method), model, draft,
                                                                                 scoped_options(method, options)))
    prompts = [chat_input_ids(tokenizer, [{"role": "user", "content": q["turns"][0]}])[0].tolist() for q in questions]
    for question, prompt in zip(questions, prompts):
        fits(model, len(prompt), question, 0)
    batches = [prompts[i:i + args.batch_size] for i in range(0, len(prompts), args.batch_size)]

    def run(method, batch):
        start = time.perf_counter()
        if method == "baseline":
            rows, row_forwards = hf_generate_batch(model, tokenizer, batch, args.max_new_tokens, eos), None
        else:
            decoder = decoders[method]
            rows = decoder.generate(batch, args.max_new_tokens, eos, pad_token_id=tokenizer.pad_token_id or 0)
            row_forwards = decoder.row_forwards
        return rows, time.perf_counter() - start, row_forwards

    for method in methods:  # warm-up
        run(method, batches[0][:2])
    totals = {m: {"tokens": 0, "seconds": 0.0, "row_forwards": 0, "rows": []} for m in methods}
    for batch in tqdm(batches, desc=f"batches of {args.batch_size}"):
        for method in methods:  # interleaved, so machine noise hits every method alike
            rows, seconds, row_forwards = run(method, batch)
            t = totals[method]
            t["tokens"] += sum(len(r) for r in rows)
            t["seconds"] += seconds
            t["row_forwards"] += row_forwards or 0
            t["rows"].extend(rows)
    base = totals["baseline"]
    results = run_header(args, model, command, len(prompts))
    for method in methods:
        t = totals[method]
        tps = t["tokens"] / t["seconds"]
        summary = {"tokens_per_s": tps, "new_tokens": t["tokens"], "seconds": t["seconds"],
                   "speedup": tps / (base["tokens"] / base["seconds"]),
                   "greedy_match": sum(a == b for a, b in zip(t["rows"], base["rows"])) / len(prompts)}
        if t["row_forwards"]:
            summary["tau"] = t["tokens"] / t["row_forwards"]
        results["methods"][method] = {"overall": summary}
    return results

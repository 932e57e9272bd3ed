"""The training loop every draft-head trainer shares (Medusa, EAGLE).

A trainer supplies a `Task`: how to build its trainable module on the frozen base, its loss on a
batch, and its held-out evaluation. This module owns the rest: typed config sections, data loading
and tokenisation, accelerate (single CPU process up to DeepSpeed), AdamW + cosine warm-up + gradient
accumulation, TensorBoard and tqdm, safetensors checkpoints that resume exactly (past a damaged newest one),
refusing to overwrite, to resume a different run or from another data position, one run per output_dir (a
lock), and stopping on a non-finite loss.
"""

from __future__ import annotations

import json
import math
import os
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch
from tqdm.auto import tqdm

from specheads.data.models import cpu_supports_bf16, load_base_model, load_tokenizer
from specheads.data.sharegpt import load_conversations, split_heldout
from specheads.data.tokenization import pad_batch, tokenize_conversation
from specheads.heads.files import write_text
from specheads.heads.fingerprint import KEY as FINGERPRINT
from specheads.heads.fingerprint import base_fingerprint
from specheads.train.checkpoint import CheckpointWriteError, latest_checkpoint, load_checkpoint, save_checkpoint
from specheads.train.config import config_to_dict
from specheads.train.resume import (apply_config_hyperparameters, changed_optimizer_settings, check_same_run,
                                    flat_config, resume_point)
from specheads.train.run_dir import OutputDirLock


# ---- config sections shared by every trainer -----------------------------------------------

@dataclass
class ModelSection:
    name: str = "smollm2-135m-instruct"  # built-in name, HF model id or local path
    dtype: str = "auto"  # dtype of the frozen base: auto | bf16 | fp32 | fp16 | fp64


@dataclass
class DataSection:
    dataset: str = "sharegpt"  # built-in name, ShareGPT .json/.jsonl path, or HF dataset id
    max_length: int = 512
    heldout_size: int = 200
    split_seed: int = 0
    max_train_conversations: int | None = None
    max_heldout_eval: int | None = None  # evaluate on the first N held-out conversations

    def validate(self):
        if self.max_length < 8:
            raise ValueError(f"data.max_length must be >= 8, got {self.max_length}")
        if self.heldout_size < 1:
            raise ValueError(f"data.heldout_size must be >= 1, got {self.heldout_size}")
        for name in ("max_train_conversations", "max_heldout_eval"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"data.{name} must be >= 1 (or null: all), got {getattr(self, name)}")


def check_finite(section: str, obj, names, minimum: float = 0.0, inclusive: bool = False) -> None:
    """ValueError naming `section.name` unless each value is a finite number > minimum (>= with inclusive)."""
    for name in names:
        value = getattr(obj, name)
        if not (math.isfinite(value) and (value >= minimum if inclusive else value > minimum)):
            raise ValueError(f"{section}.{name} must be a finite number {'>=' if inclusive else '>'} {minimum:g}, "
                             f"got {value}")


@dataclass
class TrainSection:
    output_dir: str = "runs/medusa"
    epochs: float = 1.0
    max_steps: int | None = None  # optimizer updates; overrides epochs when set
    batch_size: int = 4  # sequences per process per micro-batch
    grad_accum: int = 1
    lr: float = 1e-3
    weight_decay: float = 0.0
    adam_betas: list[float] | None = None  # default (0.9, 0.999)
    warmup_ratio: float = 0.1
    max_grad_norm: float | None = None
    head_loss_decay: float = 0.8
    mixed_precision: str = "auto"  # auto | bf16 | fp16 | no
    seed: int = 42
    log_every: int = 10
    eval_every: int = 0  # 0: only at the end
    save_every: int = 100
    keep_checkpoints: int = 2  # 0: keep all

    def validate(self):
        if not self.output_dir.strip():
            raise ValueError(f"train.output_dir must name a folder, got {self.output_dir!r}")
        if self.mixed_precision not in ("auto", "bf16", "fp16", "no"):
            raise ValueError(f"train.mixed_precision must be auto, bf16, fp16 or no, got {self.mixed_precision!r}")
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError(f"train.max_steps must be >= 1 (or null: train.epochs decides), got {self.max_steps}")
        check_finite("train", self, ("lr", "epochs", "head_loss_decay"))
        check_finite("train", self, ("weight_decay",), inclusive=True)
        if self.max_grad_norm is not None and not (math.isfinite(self.max_grad_norm) and self.max_grad_norm > 0):
            raise ValueError(f"train.max_grad_norm must be a finite number > 0 (or null), got {self.max_grad_norm}")
        for name in ("batch_size", "grad_accum", "log_every", "save_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"train.{name} must be >= 1, got {getattr(self, name)}")
        for name, note in (("eval_every", ""), ("keep_checkpoints", " (0 keeps all)")):
            if getattr(self, name) < 0:
                raise ValueError(f"train.{name} must be >= 0{note}, got {getattr(self, name)}")
        if not 0 <= self.seed < 2**32:  # numpy's seed range (accelerate's set_seed seeds numpy too)
            raise ValueError(f"train.seed must be in [0, 2**32), got {self.seed}")
        if not 0 <= self.warmup_ratio < 1:
            raise ValueError(f"train.warmup_ratio must be in [0, 1), got {self.warmup_ratio}")
        if self.adam_betas is not None and (len(self.adam_betas) != 2 or not all(0 <= b < 1 for b in self.adam_betas)):
            raise ValueError(f"train.adam_betas must be two numbers in [0, 1), got {self.adam_betas}")


class Task(Protocol):
    """What a trainer adds to the shared loop.

    The module `build` returns is what trains, checkpoints and is saved (its `save_pretrained(dir, extra,
    state_dict)`); only its parameters with requires_grad are optimised."""

    name: str  # TensorBoard project name and progress-bar label
    part_names: list[str]  # names of the loss components logged separately (e.g. one per head)

    def build(self, base, tokenizer, examples) -> torch.nn.Module: ...
    def restore(self, module, directory: Path, base) -> None: ...  # load a checkpoint's weights into module
    def param_groups(self, module, lr: float) -> list[dict]: ...
    def loss(self, module, base, batch: dict, indices: list[int], step: int) -> tuple[torch.Tensor, torch.Tensor]: ...
    def evaluate(self, module, base, examples, pad_token_id: int, batch_size: int, accelerator) -> dict: ...
    def format_result(self, result: dict) -> str: ...
    def eval_logs(self, result: dict) -> dict: ...
    def final_extra(self, result: dict) -> dict: ...


def trainable_parameters(module) -> list[torch.nn.Parameter]:
    return [p for p in module.parameters() if p.requires_grad]


class DraftTask:
    """Defaults of a Task whose module is the draft alone: restore from its saved folder, one
    parameter group."""

    def load(self, directory: Path, base) -> torch.nn.Module:
        raise NotImplementedError

    def restore(self, module, directory: Path, base) -> None:
        module.load_state_dict(self.load(directory, base).state_dict())

    def param_groups(self, module, lr: float) -> list[dict]:
        return [{"params": trainable_parameters(module), "lr": lr}]


# ---- data --------------------------------------------------------------------------------

def build_examples(conversations, tokenizer, max_length: int, desc: str):
    examples = []
    for conversation in tqdm(conversations, desc=f"tokenising {desc}", leave=False):
        example = tokenize_conversation(tokenizer, conversation.messages, max_length)
        if example.num_labels > 0:
            examples.append(example)
    return examples


def load_examples(cfg, tokenizer):
    """(training examples, held-out examples) as the config's data section describes them."""
    conversations = load_conversations(cfg.data.dataset)
    train_convs, heldout_convs = split_heldout(conversations, cfg.data.heldout_size, cfg.data.split_seed)
    train_convs = train_convs[: cfg.data.max_train_conversations]
    heldout_convs = heldout_convs[: cfg.data.max_heldout_eval]
    return (build_examples(train_convs, tokenizer, cfg.data.max_length, "train"),
            build_examples(heldout_convs, tokenizer, cfg.data.max_length, "held-out"))


def epoch_order(num_examples: int, seed: int, epoch: int) -> list[int]:
    """The shuffled order of one epoch, a pure function of seed and epoch (so resume can skip ahead)."""
    order = list(range(num_examples))
    random.Random(seed * 1_000_003 + epoch).shuffle(order)
    return order


def micro_batches(num_examples: int, cfg: TrainSection, world: int, rank: int, start: int):
    """Yield (micro_index, example indices of this rank) from global micro-batch `start` on, forever."""
    per_step = cfg.batch_size * world
    per_epoch = num_examples // per_step
    if per_epoch == 0:
        raise ValueError(f"{num_examples} training examples cannot fill one batch of {per_step}")
    index = start
    while True:
        epoch, offset = divmod(index, per_epoch)
        order = epoch_order(num_examples, cfg.seed, epoch)
        batch = order[offset * per_step: (offset + 1) * per_step]
        yield index, batch[rank * cfg.batch_size: (rank + 1) * cfg.batch_size]
        index += 1


def heldout_batches(examples, pad_token_id: int, batch_size: int, accelerator):
    """This rank's share of the held-out examples: (their indices in `examples`, the padded batch on the
    accelerator's device). The indices key cached base states.

    Every rank gets the same number (the last len % processes examples are left out when there are
    several), so all ranks run the same forwards: DeepSpeed ZeRO-3 gathers weights collectively in each."""
    world = accelerator.num_processes
    usable = len(examples) - len(examples) % world
    mine = list(range(accelerator.process_index, usable, world))
    for i in range(0, len(mine), batch_size):
        indices = mine[i:i + batch_size]
        batch = pad_batch([examples[j] for j in indices], pad_token_id)
        yield indices, {k: v.to(accelerator.device) for k, v in batch.items()}


# ---- run ---------------------------------------------------------------------------------

def uses_deepspeed(accelerator) -> bool:
    from accelerate.utils import DistributedType

    return accelerator.distributed_type == DistributedType.DEEPSPEED


def partitions_weights(accelerator) -> bool:
    """DeepSpeed ZeRO-3: each rank holds only a slice of every trained weight."""
    return uses_deepspeed(accelerator) and accelerator.state.deepspeed_plugin.zero_stage == 3


def gathered_state_dict(accelerator, module) -> dict | None:
    """The module's full weights under ZeRO-3 (a collective: every rank calls it); else None,
    and the module's own state_dict is complete."""
    return accelerator.get_state_dict(module) if partitions_weights(accelerator) else None


def rank_checksums(accelerator, module) -> list[float] | None:
    """A checksum of the trained weights on every rank: data parallelism must keep them identical.
    None under ZeRO-3, where each rank holds only its partition."""
    if partitions_weights(accelerator):
        return None
    params = trainable_parameters(accelerator.unwrap_model(module))
    local = torch.stack([p.detach().double().sum() + p.detach().double().abs().sum() for p in params]).sum()
    return accelerator.gather(local.reshape(1).to(accelerator.device)).tolist()


def no_gpu() -> bool:
    mps = getattr(torch.backends, "mps", None)
    xpu = getattr(torch, "xpu", None)
    return not (torch.cuda.is_available() or (mps is not None and mps.is_available())
                or (xpu is not None and xpu.is_available()))


def accelerator_settings() -> dict:
    """Accelerator arguments for machines without a GPU. Plain data parallelism: `cpu=True`, or `accelerate
    launch --multi_gpu --num_processes N` starts N unconnected single-process runs instead of one gloo
    group. DeepSpeed (its CPU accelerator): accelerate enables it only when not told `cpu`, and needs the
    gloo backend named, or every rank believes it is the only one."""
    from accelerate.utils import InitProcessGroupKwargs

    if not no_gpu():
        return {}
    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true":
        return {"kwargs_handlers": [InitProcessGroupKwargs(backend="gloo")]}
    return {"cpu": True}


def resolve_mixed_precision(setting: str) -> str:
    if setting != "auto":
        return setting
    if torch.cuda.is_available():
        return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    return "bf16" if cpu_supports_bf16() else "no"


def run_training(cfg, task: Task, resume: bool = False) -> dict:
    """Train task's module per cfg (sections model, data, train, + the task's own); return the evaluation.

    The main process holds train.output_dir's lock for the whole run: a second run on it stops at once."""
    from accelerate import Accelerator

    t = cfg.train
    out = Path(t.output_dir)
    accelerator = Accelerator(**accelerator_settings(), gradient_accumulation_steps=t.grad_accum,
                              mixed_precision=resolve_mixed_precision(t.mixed_precision),
                              log_with="tensorboard", project_dir=str(out / "logs"))
    lock = OutputDirLock(out) if accelerator.is_main_process else None
    if lock is not None:
        lock.acquire()
    try:
        return _run_training(cfg, task, resume, accelerator)
    finally:
        if lock is not None:
            lock.release()


def _run_training(cfg, task: Task, resume: bool, accelerator) -> dict:
    from accelerate.utils import set_seed
    from transformers import get_cosine_schedule_with_warmup

    t = cfg.train
    out = Path(t.output_dir)
    checkpoints = out / "checkpoints"
    main = accelerator.is_main_process
    if not resume and latest_checkpoint(checkpoints) is not None:
        raise SystemExit(f"{checkpoints} already holds checkpoints: pass --resume to continue that run, "
                         "or set train.output_dir to a new folder (nothing was overwritten)")
    latest, saved_state = None, {}
    if resume:  # checked before any model loads
        def warn(line):
            if main:
                print(line, file=sys.stderr)

        latest, saved_state = resume_point(checkpoints, warn)
        if latest is None:
            accelerator.print(f"--resume: no checkpoint under {checkpoints}; starting fresh")
        else:
            check_same_run(saved_state.get("config", {}), config_to_dict(cfg), latest, saved_state.get("processes"),
                           accelerator.num_processes)
    set_seed(t.seed)

    tokenizer = load_tokenizer(cfg.model.name)
    base = load_base_model(cfg.model.name, cfg.model.dtype, accelerator.device)
    fingerprint = base_fingerprint(base)  # before DeepSpeed may partition it; saved with the heads
    base.requires_grad_(False)
    train_examples, heldout_examples = load_examples(cfg, tokenizer)

    module = task.build(base, tokenizer, train_examples)
    optimizer = torch.optim.AdamW(task.param_groups(module, t.lr), lr=t.lr, weight_decay=t.weight_decay,
                                  betas=tuple(t.adam_betas or (0.9, 0.999)))
    per_update = t.batch_size * accelerator.num_processes * t.grad_accum
    total_steps = t.max_steps or max(1, math.ceil(t.epochs * len(train_examples) / per_update))
    scheduler = get_cosine_schedule_with_warmup(optimizer, int(t.warmup_ratio * total_steps), total_steps)

    step, micro_start = 0, 0
    if latest is not None:
        fresh_groups = [dict(group) for group in optimizer.param_groups]  # as the config builds them
        task.restore(module, latest / "heads", base)
        try:
            state = load_checkpoint(latest, None if uses_deepspeed(accelerator) else optimizer)
        except ValueError as err:
            raise SystemExit(f"--resume: {err}") from None
        scheduler.load_state_dict(state["scheduler"])
        apply_config_hyperparameters(optimizer, scheduler, fresh_groups)
        step, micro_start = state["step"], state["micro_batches_done"]
        accelerator.print(f"resumed from {latest} at step {step}")
        changed = changed_optimizer_settings(saved_state.get("config", {}), config_to_dict(cfg))
        if changed:
            lr_note = (f" (lr: the schedule's value at step {step} of {total_steps} for the new lr)"
                       if any(c.startswith("train.lr:") for c in changed) else "")
            accelerator.print(f"--resume: changed since {latest.name}: {'; '.join(changed)}. The run continues with "
                              f"the new value{'s' if len(changed) > 1 else ''}{lr_note}")
    if uses_deepspeed(accelerator):  # no dataloader goes through prepare, so DeepSpeed is told the batch size
        ds_config = accelerator.state.deepspeed_plugin.deepspeed_config
        if ds_config.get("gradient_accumulation_steps", t.grad_accum) not in ("auto", t.grad_accum):
            raise SystemExit(f"the DeepSpeed config accumulates {ds_config['gradient_accumulation_steps']} micro-batches "
                             f"but train.grad_accum is {t.grad_accum}: make them equal")
        ds_config.update(train_micro_batch_size_per_gpu=t.batch_size, gradient_accumulation_steps=t.grad_accum,
                         train_batch_size=per_update)
    module, optimizer = accelerator.prepare(module, optimizer)

    if main:
        out.mkdir(parents=True, exist_ok=True)
        write_text(out / "train_config.json", json.dumps(config_to_dict(cfg), indent=2))
    hparams = {k: (v if isinstance(v, (int, float, str, bool)) else str(v))
               for k, v in flat_config(config_to_dict(cfg)).items()}
    accelerator.init_trackers(task.name, config=hparams)
    accelerator.print(f"{len(train_examples)} training / {len(heldout_examples)} held-out conversations; "
                      f"{total_steps} updates of {per_update} sequences; mixed precision {accelerator.mixed_precision}; "
                      f"{accelerator.num_processes} process(es), {accelerator.distributed_type.value}")

    def save(step_now, micro_done):
        full_state = gathered_state_dict(accelerator, module)
        if main:
            trainer_state = {"step": step_now, "micro_batches_done": micro_done, "processes": accelerator.num_processes,
                             "scheduler": scheduler.state_dict(), "config": config_to_dict(cfg)}
            # DeepSpeed's ZeRO optimizer state is partitioned across ranks: its checkpoints keep weights,
            # schedule and data position, and a resumed run restarts the Adam moments.
            try:
                save_checkpoint(checkpoints, step_now, accelerator.unwrap_model(module),
                                None if uses_deepspeed(accelerator) else optimizer.optimizer,
                                trainer_state, keep=t.keep_checkpoints, state_dict=full_state)
            except CheckpointWriteError:
                progress.close()  # the bar's last redraw before the error, not after it
                raise
        accelerator.wait_for_everyone()

    parts = len(task.part_names)
    progress = tqdm(total=total_steps, initial=step, desc=f"training {task.name}", disable=not main)
    window = {"loss": 0.0, "parts": torch.zeros(parts), "micro": 0, "samples": 0, "tokens": 0, "t0": time.time()}
    batches = micro_batches(len(train_examples), t, accelerator.num_processes, accelerator.process_index,
                            micro_start)
    module.train()
    run_start, run_samples, run_tokens = time.time(), 0, 0
    while step < total_steps:
        micro_index, indices = next(batches)
        batch = {k: v.to(accelerator.device)
                 for k, v in pad_batch([train_examples[i] for i in indices], tokenizer.pad_token_id).items()}
        with accelerator.accumulate(module):
            with accelerator.autocast():
                loss, per_part = task.loss(module, base, batch, indices, step)
            if not torch.isfinite(loss):
                last = latest_checkpoint(checkpoints)
                accelerator.print(f"non-finite loss ({loss.item()}) at step {step}, micro-batch {micro_index}; "
                                  f"stopping. Last good checkpoint: {last or 'none'}")
                accelerator.end_training()
                raise SystemExit(1)
            accelerator.backward(loss)
            if accelerator.sync_gradients and t.max_grad_norm and not uses_deepspeed(accelerator):  # DS clips itself
                accelerator.clip_grad_norm_(module.parameters(), t.max_grad_norm)
            optimizer.step()
            optimizer.zero_grad()
        tokens = int(batch["attention_mask"].sum()) * accelerator.num_processes
        window["loss"] += loss.item()
        window["parts"] += per_part.detach().float().cpu()
        window["micro"] += 1
        window["samples"] += len(indices) * accelerator.num_processes
        window["tokens"] += tokens
        run_samples += len(indices) * accelerator.num_processes
        run_tokens += tokens
        if not accelerator.sync_gradients:
            continue
        scheduler.step()
        step += 1
        progress.update(1)
        if step % t.log_every == 0 or step == total_steps:
            elapsed = time.time() - window["t0"]
            logs = {"train/loss": window["loss"] / window["micro"], "lr": scheduler.get_last_lr()[0],
                    "train/samples_per_s": window["samples"] / elapsed, "train/tokens_per_s": window["tokens"] / elapsed}
            logs.update({f"train/loss_{name}": v / window["micro"]
                         for name, v in zip(task.part_names, window["parts"].tolist())})
            accelerator.log(logs, step=step)
            progress.set_postfix(loss=f"{logs['train/loss']:.3f}", samples_s=f"{logs['train/samples_per_s']:.2f}")
            window.update(loss=0.0, parts=torch.zeros(parts), micro=0, samples=0, tokens=0, t0=time.time())
        if t.eval_every and step % t.eval_every == 0 and step < total_steps:
            result = task.evaluate(module, base, heldout_examples, tokenizer.pad_token_id, t.batch_size, accelerator)
            accelerator.log(task.eval_logs(result), step=step)
        if step % t.save_every == 0 or step == total_steps:
            save(step, micro_index + 1)
    progress.close()
    train_seconds = time.time() - run_start

    result = task.evaluate(module, base, heldout_examples, tokenizer.pad_token_id, t.batch_size, accelerator)
    accelerator.log(task.eval_logs(result), step=step)
    if run_samples:  # throughput of this process run (a resumed run counts only its own part)
        result["throughput"] = {"samples_per_s": run_samples / train_seconds, "tokens_per_s": run_tokens / train_seconds,
                                "seconds": train_seconds, "samples": run_samples, "processes": accelerator.num_processes}
    result["rank_checksums"] = rank_checksums(accelerator, module)
    full_state = gathered_state_dict(accelerator, module)
    if main:
        extra = {**task.final_extra(result), FINGERPRINT: fingerprint}
        accelerator.unwrap_model(module).save_pretrained(out / "heads", extra=extra, state_dict=full_state)
        write_text(out / "eval.json", json.dumps(result, indent=2))
        print(f"held-out accuracy of the {task.name} draft (assistant tokens):")
        print(task.format_result(result))
        if "throughput" in result:
            tp = result["throughput"]
            print(f"training throughput: {tp['samples_per_s']:.2f} samples/s, {tp['tokens_per_s']:.0f} tokens/s "
                  f"({tp['samples']} samples in {tp['seconds']:.0f} s)")
        print(f"saved to {out / 'heads'}")
    accelerator.end_training()
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()  # else a second rank can abort at interpreter exit
    return result


def train_main(config_class, make_task, argv, description: str) -> int:
    """The command line of a trainer: --config FILE [--resume] [section.key=value ...]."""
    import argparse
    import os
    import sys

    # Each step allocates and frees GB-sized logits. Faulted in 4 KB pages, the kernel's page handling took most of
    # the CPU time (2-core Xeon, fp32, demo Medusa steps: 0.44 samples/s, 1.06 with this). With this PyTorch's CPU
    # allocator asks for transparent huge pages for allocations of 2 MB and more (Linux; read at its first large
    # allocation, so before the model loads).
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

    from specheads.train.config import ConfigError, load_config

    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="YAML config (see configs/)")
    parser.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in output_dir")
    parser.add_argument("overrides", nargs="*", help="section.key=value, e.g. train.lr=3e-4")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        cfg = load_config(config_class, args.config, args.overrides)
    except ConfigError as err:
        print(f"config error: {err}", file=sys.stderr)
        return 2
    from specheads.data.sharegpt import DataFileError

    try:
        run_training(cfg, make_task(cfg), resume=args.resume)
    except (CheckpointWriteError, DataFileError, FileNotFoundError) as err:  # each names its file (and line)
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0

"""The training run every draft-head trainer shares (Medusa-1, Medusa-2, EAGLE), in named phases.

    Trainer(cfg, make_task, resume).run():
        resume()         which checkpoint to continue from, checked against the config before any model loads
        setup()          seed, tokenizer, frozen base model (and its fingerprint)
        per stage (a run without a `schedule` is one stage):
          setup_stage()  the stage's task, its data, the module (built, or carried over from the stage before),
                         a fresh optimizer and lr schedule, the checkpoint's state when resuming into this stage
          step()         one micro-batch: forward, backward, an update when the accumulation is complete
          log()          every train.log_every updates: losses, lr, throughput
          evaluate()     every train.eval_every updates and at the end of the stage (each in evaluations.jsonl)
          save()         every train.save_every updates and at the end of the stage: an atomic checkpoint
          finish_stage() the stage's held-out evaluation (and, with a schedule, its heads in stages/NN-name/)
        finish()         the run's heads, eval.json, the summary

A trainer supplies `make_task(cfg)` -> Task (train/task.py): build, loss, evaluate; a trainer that needs more
subclasses Trainer and overrides a phase. The main process holds train.output_dir's lock for the whole run.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from specheads.data.models import load_base_model, load_tokenizer
from specheads.data.tokenization import pad_batch
from specheads.heads.files import CHAT_TEMPLATE, write_text
from specheads.heads.fingerprint import KEY as FINGERPRINT
from specheads.heads.fingerprint import base_fingerprint
from specheads.train.checkpoint import CheckpointWriteError, latest_checkpoint, load_checkpoint, save_checkpoint
from specheads.train.config import ConfigError, RunError, config_to_dict
from specheads.train.data_order import load_examples, micro_batches
from specheads.train.distributed import (accelerator_settings, gathered_state_dict, load_engine_state, rank_checksums,
                                         rank_rng_states, resolve_mixed_precision, save_engine_state, uses_deepspeed,
                                         zero_stage)
from specheads.train.resume import (apply_config_hyperparameters, changed_optimizer_settings, check_same_run,
                                    flat_config, resume_point)
from specheads.train.run_dir import OutputDirLock
from specheads.train.schedule import Stage, check_inputs, check_output_dirs, stage_tree, stages


class Trainer:
    def __init__(self, cfg, make_task, resume: bool = False):
        self.cfg, self.make_task, self.resuming = cfg, make_task, resume
        self.stages: list[Stage] = stages(cfg)
        self.scheduled = self.stages[0].name is not None
        self.out = Path(cfg.train.output_dir)
        self.checkpoints = self.out / "checkpoints"
        self.module = self.optimizer = self.data = None
        self.stage_start = 0  # updates of the stages before this one (checkpoints are numbered by run-wide update)
        self.run_seconds, self.run_samples, self.run_tokens = 0.0, 0, 0
        self.train_seconds = 0.0  # time in training steps over the whole run, resumes included (evaluations.jsonl)
        self.best = None  # train.best_by: {"by", "value", "step"} of the evaluation whose heads are in heads-best/

    def run(self) -> dict:
        """Train per the config (sections model, data, train, the task's own, schedule); return the evaluation."""
        from accelerate import Accelerator

        t = self.cfg.train
        self.accelerator = Accelerator(**accelerator_settings(), gradient_accumulation_steps=t.grad_accum,
                                       mixed_precision=resolve_mixed_precision(t.mixed_precision),
                                       log_with="tensorboard", project_dir=str(self.out / "logs"))
        self.main = self.accelerator.is_main_process
        check_output_dirs(self.stages)  # before the lock folder is made: nothing written into an input
        lock = OutputDirLock(self.out) if self.main else None
        if lock is not None:
            lock.acquire()
        try:
            self.resume()
            check_inputs(self.stages[self.first_stage:])  # before any model loads, not when a late stage starts
            self.setup()
            for stage in self.stages[self.first_stage:]:
                self.setup_stage(stage)
                self.train_stage()
                result = self.finish_stage()
            return self.finish(result)
        finally:
            if lock is not None:
                lock.release()

    # ---- phases ---------------------------------------------------------------------------------

    def resume(self) -> None:
        """The checkpoint to continue from (self.latest, self.saved_state), checked before any model loads: a fresh
        run refuses a folder with checkpoints, a resumed one a checkpoint of other settings."""
        accelerator = self.accelerator
        if self.scheduled and len(self.stages) > 1 and uses_deepspeed(accelerator):
            raise ConfigError("schedule: each stage starts a fresh optimizer, which a DeepSpeed engine cannot take: "
                             "run the schedule without DeepSpeed, or its stages as separate runs")
        if not self.resuming and latest_checkpoint(self.checkpoints) is not None:
            raise RunError(f"{self.checkpoints} already holds checkpoints: pass --resume to continue that run, "
                             "or set train.output_dir to a new folder (nothing was overwritten)")
        self.latest, self.saved_state, self.first_stage = None, {}, 0
        if not self.resuming:
            return
        if self.main:
            recover_best_folder(self.out)

        def warn(line):
            if self.main:
                print(line, file=sys.stderr)

        self.latest, self.saved_state = resume_point(self.checkpoints, warn)
        if self.latest is None:
            accelerator.print(f"--resume: no checkpoint under {self.checkpoints}; starting fresh")
            return
        saved = self.saved_state.get("config", {})
        if self.scheduled:
            saved = {"schedule": [], **saved}  # a checkpoint from before schedules had none
        check_same_run(saved, config_to_dict(self.cfg), self.latest, self.saved_state.get("processes"),
                       accelerator.num_processes, (self.saved_state.get("deepspeed") or {}).get("zero_stage"),
                       zero_stage(accelerator))
        self.first_stage = self.saved_state.get("stage", 0)
        self.stage_start = self.saved_state.get("stage_start_step", 0)
        self.best = self.saved_state.get("best")
        self.train_seconds = self.saved_state.get("train_seconds", 0.0)

    def setup(self) -> None:
        """What every stage shares: the seeded generators, the tokenizer, the frozen base and its fingerprint."""
        from accelerate.utils import set_seed

        set_seed(self.cfg.train.seed)
        self.tokenizer = load_tokenizer(self.cfg.model.name, self.cfg.data.chat_template, option="data.chat_template")
        self.base = load_base_model(self.cfg.model.name, self.cfg.model.dtype, self.accelerator.device)
        self.fingerprint = base_fingerprint(self.base)  # before DeepSpeed may partition it; saved with the heads
        self.base.requires_grad_(False)

    def setup_stage(self, stage: Stage) -> None:
        """The stage's task and data; the module (built by the first stage, then carried over); a fresh optimizer
        and warm-up + cosine schedule; the checkpoint's weights, optimizer, schedule and data position when the run
        resumes inside this stage."""
        from accelerate.utils import set_seed
        from transformers import get_cosine_schedule_with_warmup

        accelerator, t = self.accelerator, stage.cfg.train
        first = self.module is None
        if not first:  # as a separate run from the last stage's weights would start
            set_seed(t.seed)
        self.stage, self.task = stage, self.make_task(stage.cfg)
        if self.data is None or self.data[0] != stage.cfg.data:
            with self.accelerator.main_process_first():  # the others read its tokenised cache
                self.data = (stage.cfg.data, *load_examples(stage.cfg, self.tokenizer))
        _, self.train_examples, self.heldout_examples = self.data

        module = self.task.build(self.base, self.tokenizer, self.train_examples) if first else \
            accelerator.unwrap_model(self.module)
        optimizer = torch.optim.AdamW(self.task.param_groups(module, t.lr), lr=t.lr, weight_decay=t.weight_decay,
                                      betas=tuple(t.adam_betas or (0.9, 0.999)))
        self.per_update = t.batch_size * accelerator.num_processes * t.grad_accum
        self.total_steps = t.max_steps or max(1, math.ceil(t.epochs * len(self.train_examples) / self.per_update))
        self.scheduler = get_cosine_schedule_with_warmup(optimizer, int(t.warmup_ratio * self.total_steps),
                                                         self.total_steps)
        self.updates, self.micro_start = 0, 0
        resuming_here = self.latest is not None and stage.index == self.first_stage
        if resuming_here:
            self.restore(module, optimizer)
        if first:
            if uses_deepspeed(accelerator):  # no dataloader goes through prepare, so DeepSpeed is told the batch size
                ds_config = accelerator.state.deepspeed_plugin.deepspeed_config
                if ds_config.get("gradient_accumulation_steps", t.grad_accum) not in ("auto", t.grad_accum):
                    raise ConfigError(f"the DeepSpeed config accumulates {ds_config['gradient_accumulation_steps']} "
                                     f"micro-batches but train.grad_accum is {t.grad_accum}: make them equal")
                ds_config.update(train_micro_batch_size_per_gpu=t.batch_size, gradient_accumulation_steps=t.grad_accum,
                                 train_batch_size=self.per_update)
            self.module, self.optimizer = accelerator.prepare(module, optimizer)
            if resuming_here and uses_deepspeed(accelerator):
                self.restore_engine(optimizer)
            self.start_logging()
        else:
            self.optimizer.optimizer.state.clear()  # the last stage's Adam moments: accelerate keeps a reference
            self.optimizer = accelerator.prepare(optimizer)
        accelerator.print((f"{self.stage.label}: " if self.scheduled else "") + f"{len(self.train_examples)} training / {len(self.heldout_examples)} held-out conversations; "
                          f"{self.total_steps} updates of {self.per_update} sequences; mixed precision "
                          f"{accelerator.mixed_precision}; {accelerator.num_processes} process(es), "
                          f"{accelerator.distributed_type.value}")

    def restore(self, module, optimizer) -> None:
        """Resume inside this stage: the checkpoint's weights, optimizer, RNG, schedule and data position, the
        optimizer hyperparameters as the config now says (and which of them changed)."""
        accelerator, latest, step_total = self.accelerator, self.latest, self.total_steps
        fresh_groups = [dict(group) for group in optimizer.param_groups]  # as the config builds them
        self.task.restore(module, latest / "heads", self.base)
        try:  # under DeepSpeed the engine restores the optimizer once prepared (restore_engine)
            state = load_checkpoint(latest, None if uses_deepspeed(accelerator) else optimizer,
                                    accelerator.process_index)
        except ValueError as err:
            raise RunError(f"--resume: {err}") from None
        self.scheduler.load_state_dict(state["scheduler"])
        apply_config_hyperparameters(optimizer, self.scheduler, fresh_groups)
        self.fresh_groups = fresh_groups
        self.updates, self.micro_start = state["step"], state["micro_batches_done"]
        where = f" of {self.stage.label}" if self.scheduled else ""
        accelerator.print(f"resumed from {latest} at step {self.updates}{where}")
        saved, now = self.saved_state.get("config", {}), config_to_dict(self.cfg)
        if self.scheduled:
            saved, now = stage_tree(saved, self.stage.index), stage_tree(now, self.stage.index)
        changed = changed_optimizer_settings(saved, now)
        if changed:
            lr_note = (f" (lr: the schedule's value at step {self.updates} of {step_total} for the new lr)"
                       if any(c.startswith("train.lr:") for c in changed) else "")
            accelerator.print(f"--resume: changed since {latest.name}: {'; '.join(changed)}. The run continues with "
                              f"the new value{'s' if len(changed) > 1 else ''}{lr_note}")

    def restore_engine(self, optimizer) -> None:
        """Under DeepSpeed, once prepared: the ZeRO optimizer state (every rank its partition of Adam's moments
        and of the fp32 master weights) from the checkpoint's deepspeed/ folder; then the config's hyperparameters
        at the resumed step again, over the saved ones DeepSpeed put back into `optimizer` (its base optimizer)."""
        record = self.saved_state.get("deepspeed")
        if record is None:  # saved without DeepSpeed, or by a version that kept no DeepSpeed optimizer state
            self.accelerator.print(f"--resume: {self.latest.name} holds no DeepSpeed optimizer state; the optimizer "
                                   f"starts fresh moments at step {self.updates} (weights, schedule and data position "
                                   "are restored)")
            return
        load_engine_state(self.module, self.latest, record)
        apply_config_hyperparameters(optimizer, self.scheduler, self.fresh_groups)
        self.accelerator.print(f"restored DeepSpeed ZeRO-{record['zero_stage']} optimizer state from "
                               f"{self.latest / record['folder']}")

    def start_logging(self) -> None:
        """train_config.json and the TensorBoard run (once the first stage's module is ready)."""
        if self.main:
            self.out.mkdir(parents=True, exist_ok=True)
            write_text(self.out / "train_config.json", json.dumps(config_to_dict(self.cfg), indent=2))
        hparams = {k: (v if isinstance(v, (int, float, str, bool)) else str(v))
                   for k, v in flat_config(config_to_dict(self.cfg)).items()}
        self.accelerator.init_trackers(self.task.name, config=hparams)

    def train_stage(self) -> None:
        """Micro-batches until the stage's updates are done; log, evaluate and save on their schedule."""
        accelerator, t = self.accelerator, self.stage.cfg.train
        desc = f"training {self.task.name}" + (f" [{self.stage.label}]" if self.scheduled else "")
        self.progress = tqdm(total=self.total_steps, initial=self.updates, desc=desc, disable=not self.main)
        self.reset_window()
        batches = micro_batches(len(self.train_examples), t, accelerator.num_processes, accelerator.process_index,
                                self.micro_start)
        self.module.train()
        start = time.time()
        while self.updates < self.total_steps:
            micro_index, indices = next(batches)
            step_start = time.time()
            stepped = self.step(micro_index, indices)
            self.train_seconds += time.time() - step_start
            if not stepped:
                continue
            if self.updates % t.log_every == 0 or self.updates == self.total_steps:
                self.log()
            if t.eval_every and self.updates % t.eval_every == 0 and self.updates < self.total_steps:
                self.evaluate()
            if self.updates % t.save_every == 0 or self.updates == self.total_steps:
                self.save(micro_index + 1)
        self.progress.close()
        self.run_seconds += time.time() - start

    def step(self, micro_index: int, indices: list[int]) -> bool:
        """One micro-batch; True when it completed an update (the optimizer stepped)."""
        accelerator, t = self.accelerator, self.stage.cfg.train
        batch = {k: v.to(accelerator.device) for k, v in
                 pad_batch([self.train_examples[i] for i in indices], self.tokenizer.pad_token_id).items()}
        with accelerator.accumulate(self.module):
            with accelerator.autocast():
                loss, per_part = self.task.loss(self.module, self.base, batch, indices, self.updates)
            if not torch.isfinite(loss):
                last = latest_checkpoint(self.checkpoints)
                accelerator.end_training()
                raise RunError(f"non-finite loss ({loss.item()}) at step {self.updates}, micro-batch {micro_index}; "
                               f"stopping. Last good checkpoint: {last or 'none'}")
            accelerator.backward(loss)
            if accelerator.sync_gradients and t.max_grad_norm and not uses_deepspeed(accelerator):  # DS clips itself
                accelerator.clip_grad_norm_(self.module.parameters(), t.max_grad_norm)
            self.optimizer.step()
            self.optimizer.zero_grad()
        samples = len(indices) * accelerator.num_processes
        tokens = int(batch["attention_mask"].sum()) * accelerator.num_processes
        window = self.window
        window["loss"] += loss.item()
        window["parts"] += per_part.detach().float().cpu()
        window["micro"] += 1
        window["samples"] += samples
        window["tokens"] += tokens
        self.run_samples += samples
        self.run_tokens += tokens
        if not accelerator.sync_gradients:
            return False
        self.scheduler.step()
        self.updates += 1
        self.progress.update(1)
        return True

    def reset_window(self) -> None:
        self.window = {"loss": 0.0, "parts": torch.zeros(len(self.task.part_names)), "micro": 0, "samples": 0,
                       "tokens": 0, "t0": time.time()}

    @property
    def global_step(self) -> int:
        """Updates since the run began (stages before this one included): TensorBoard's x axis, checkpoint names."""
        return self.stage_start + self.updates

    def log(self) -> None:
        window = self.window
        elapsed = time.time() - window["t0"]
        logs = {"train/loss": window["loss"] / window["micro"], "lr": self.scheduler.get_last_lr()[0],
                "train/samples_per_s": window["samples"] / elapsed, "train/tokens_per_s": window["tokens"] / elapsed}
        logs.update({f"train/loss_{name}": v / window["micro"]
                     for name, v in zip(self.task.part_names, window["parts"].tolist())})
        if self.scheduled:
            logs["train/stage"] = self.stage.index + 1
        self.accelerator.log(logs, step=self.global_step)
        self.progress.set_postfix(loss=f"{logs['train/loss']:.3f}", samples_s=f"{logs['train/samples_per_s']:.2f}")
        self.reset_window()

    def evaluate(self) -> dict:
        """The task's held-out evaluation, logged."""
        result = self.task.evaluate(self.module, self.base, self.heldout_examples, self.tokenizer.pad_token_id,
                                    self.stage.cfg.train.batch_size, self.accelerator)
        self.accelerator.log(self.task.eval_logs(result), step=self.global_step)
        if self.main:
            self.record_evaluation(result)
        self.keep_best(result)
        return result

    def record_evaluation(self, result: dict) -> None:
        """evaluations.jsonl in the run folder: one line per held-out evaluation (its update, the training seconds
        spent so far over the whole run, its numbers), so τ against updates and time reads back from one file. An
        evaluation repeated after a resume replaces the one of the same update."""
        path = self.out / "evaluations.jsonl"
        kept = [line for line in (path.read_text().splitlines() if path.exists() else [])
                if line.strip() and json.loads(line).get("step") != self.global_step]
        record = {"step": self.global_step, "train_seconds": round(self.train_seconds, 1), **result}
        write_text(path, "\n".join([*kept, json.dumps(record)]) + "\n")

    def keep_best(self, result: dict) -> None:
        """train.best_by: when this evaluation beats the best so far, its heads replace heads-best/ (written
        aside, then swapped in by renames; recover_best_folder finishes a swap a crash interrupted)."""
        by = self.cfg.train.best_by
        if by is not None and by not in result:
            raise ConfigError(f"train.best_by: the {self.task.name} evaluation does not measure {by} (it gives "
                             f"{', '.join(k for k, v in result.items() if isinstance(v, float))})")
        if by is None or (self.best is not None and not result[by] > self.best["value"]):
            return
        self.best = {"by": by, "value": result[by], "step": self.global_step}
        full_state = gathered_state_dict(self.accelerator, self.module)
        if self.main:
            final, fresh, old = best_folders(self.out)
            shutil.rmtree(fresh, ignore_errors=True)
            extra = {**self.task.final_extra(result), FINGERPRINT: self.fingerprint,
                     CHAT_TEMPLATE: self.tokenizer.chat_template, "best": self.best}
            self.accelerator.unwrap_model(self.module).save_pretrained(fresh, extra=extra, state_dict=full_state)
            if final.exists():
                os.replace(final, old)
            os.replace(fresh, final)
            shutil.rmtree(old, ignore_errors=True)

    def save(self, micro_done: int) -> None:
        """An atomic checkpoint: weights, optimizer (under DeepSpeed its engine's checkpoint, every rank writing its
        ZeRO partition into the staging folder first), every rank's RNG, schedule, data position (and stage)."""
        accelerator = self.accelerator
        full_state = gathered_state_dict(accelerator, self.module)
        rank_rng = rank_rng_states(accelerator)  # collectives, every rank: the main process writes the files
        engine = (save_engine_state(accelerator, self.module, self.checkpoints, self.global_step)
                  if uses_deepspeed(accelerator) else None)
        if self.main:
            trainer_state = {"step": self.updates, "micro_batches_done": micro_done,
                             "processes": accelerator.num_processes, "scheduler": self.scheduler.state_dict(),
                             "config": config_to_dict(self.cfg), "train_seconds": self.train_seconds}
            if self.best is not None:
                trainer_state["best"] = self.best
            if self.scheduled:
                trainer_state.update(stage=self.stage.index, stage_name=self.stage.name,
                                     stage_start_step=self.stage_start)
            # Under DeepSpeed the optimizer state is ZeRO's, partitioned across ranks: every rank has just written
            # its partition into the staging folder with the engine's own checkpoint (save_engine_state).
            try:
                save_checkpoint(self.checkpoints, self.global_step, accelerator.unwrap_model(self.module),
                                None if engine is not None else self.optimizer.optimizer,
                                trainer_state, keep=self.cfg.train.keep_checkpoints, state_dict=full_state,
                                engine=engine, rank_rng=rank_rng)
            except CheckpointWriteError:
                self.progress.close()  # the bar's last redraw before the error, not after it
                raise
        accelerator.wait_for_everyone()

    def finish_stage(self) -> dict:
        """The stage's held-out evaluation; with a schedule, its heads and eval.json in stages/NN-name/."""
        result = self.evaluate()
        if self.scheduled:
            self.save_heads(self.out / "stages" / self.stage.folder, result)
            self.stage_start += self.total_steps
        return result

    def save_heads(self, directory: Path, result: dict) -> None:
        full_state = gathered_state_dict(self.accelerator, self.module)
        if self.main:
            extra = {**self.task.final_extra(result), FINGERPRINT: self.fingerprint,
                     CHAT_TEMPLATE: self.tokenizer.chat_template}
            self.accelerator.unwrap_model(self.module).save_pretrained(directory / "heads", extra=extra,
                                                                       state_dict=full_state)
            write_text(directory / "eval.json", json.dumps(result, indent=2))

    def finish(self, result: dict) -> dict:
        """The run's heads and eval.json (the last stage's evaluation, this process's throughput), the summary."""
        accelerator, task = self.accelerator, self.task
        result = dict(result)
        if self.run_samples:  # throughput of this process run (a resumed run counts only its own part)
            result["throughput"] = {"samples_per_s": self.run_samples / self.run_seconds,
                                    "tokens_per_s": self.run_tokens / self.run_seconds, "seconds": self.run_seconds,
                                    "samples": self.run_samples, "processes": accelerator.num_processes}
        result["rank_checksums"] = rank_checksums(accelerator, self.module)
        if self.best is not None:
            result["best"] = {**self.best, "heads": "heads-best"}
        self.save_heads(self.out, result)
        if self.main:
            print(f"held-out accuracy of the {task.name} draft (assistant tokens):")
            print(task.format_result(result))
            if "throughput" in result:
                tp = result["throughput"]
                print(f"training throughput: {tp['samples_per_s']:.2f} samples/s, {tp['tokens_per_s']:.0f} tokens/s "
                      f"({tp['samples']} samples in {tp['seconds']:.0f} s)")
            print(f"saved to {self.out / 'heads'}")
        # every rank at the same point before the process group goes: a rank that tore it down while the main one
        # was still saving aborted at exit under load ("terminate called without an active exception", SIGABRT)
        accelerator.wait_for_everyone()
        accelerator.end_training()
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()  # else a second rank can abort at interpreter exit
        return result


def best_folders(out: Path) -> tuple[Path, Path, Path]:
    """heads-best/, the new copy being written, the copy being replaced."""
    return out / "heads-best", out / ".heads-best.new", out / ".heads-best.old"


def recover_best_folder(out: Path) -> None:
    """A crash between heads-best's two renames leaves the last complete copy as .heads-best.old: put it back;
    a half-written new copy is dropped."""
    final, fresh, old = best_folders(out)
    if not final.exists() and old.exists():
        os.replace(old, final)
    shutil.rmtree(fresh, ignore_errors=True)
    shutil.rmtree(old, ignore_errors=True)


def run_training(cfg, make_task, resume: bool = False, trainer_class=Trainer) -> dict:
    """Train per cfg with the tasks make_task(stage config) gives; return the last evaluation."""
    return trainer_class(cfg, make_task, resume).run()

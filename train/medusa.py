"""Train Medusa heads: on a frozen base (Medusa-1) or jointly with a LoRA adapter on the base (Medusa-2).

    accelerate launch train/medusa.py --config configs/smollm2-135m.yaml [section.key=value ...] [--resume]
    python train/medusa.py --config configs/smollm2-135m-medusa2.yaml

mode: medusa1 — Σ_k 0.8^k · CE(head_k(h_t), x_{t+k+1}) over assistant tokens; the base is frozen.
mode: medusa2 — L_base + λ(t)·Σ_k 0.8^k L_k with peft LoRA on the base (section `lora`) and the schedule,
heads learning-rate multiplier and base loss of section `joint`: L_base is the LM loss on the labels, or
with `joint.base_loss: distill_kl` KL(base without LoRA ‖ adapted base), for self-distilled data.
Two-stage recipe: train Medusa-1 heads first, then `joint.init_heads: <their folder>`.
The held-out LM loss of the base without and with the adapter is reported (quality guard).
The run, checkpoints and logging are train/trainer.py's; a `schedule` trains in stages (train/schedule.py).
"""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass, field
from typing import ClassVar, Literal

import torch
import torch.nn.functional as F

from specheads.data.tokenization import IGNORE_INDEX, frequent_tokens
from specheads.heads import MedusaConfig, MedusaHeads
from specheads.heads.joint import MedusaWithLoRA, lora_config
from specheads.train.features import FeatureSource, feature_cache_dir
from specheads.train.losses import (chunked_medusa_loss, head_positions, heads_weight_at, medusa2_loss,
                                    medusa_loss, next_token_positions, select_trained_positions, topk_hits,
                                    total_variation)
from specheads.train.cli import train_main
from specheads.train.acceptance import (accuracy_logs, accuracy_result, along_chain, chain_starts, chunked_chain_counts,
                                        format_accuracy, heldout_acceptance)
from specheads.train.config import ConfigError, DataSection, ModelSection, TrainSection, check_draft_loss
from specheads.train.data_order import heldout_batches
from specheads.train.schedule import stages
from specheads.train.task import DraftTask


@dataclass
class HeadsSection:
    num_heads: int = 4
    num_layers: int = 1
    own_lm_head: bool = False
    draft_vocab_size: int = 0  # > 0: project onto the most frequent answer tokens only (heads/medusa.py)
    loss_chunk: int = 0  # positions per chunk of the heads' loss (K × chunk × V logits at once); 0: all at once
    cache_hidden_states: bool = False  # medusa1: store the frozen base's states once, later epochs skip its forward
    cache_dir: str = ""  # default: <specheads cache>/features
    loss: str = "ce"  # ce | tv | ce+tv: per head, CE on the label, TV to the base's softmax (1 − T=1 acceptance), or CE + tv_weight·TV
    tv_weight: float = 1.0  # the TV term's weight in ce+tv

    def validate(self):
        check_draft_loss("heads", self.loss, self.tv_weight)
        if self.num_heads < 1:
            raise ValueError(f"heads.num_heads must be >= 1, got {self.num_heads}")
        if self.num_layers < 0:
            raise ValueError(f"heads.num_layers must be >= 0, got {self.num_layers}")
        if self.loss_chunk < 0:
            raise ValueError(f"heads.loss_chunk must be >= 0, got {self.loss_chunk}")
        if self.draft_vocab_size < 0:
            raise ValueError(f"heads.draft_vocab_size must be >= 0, got {self.draft_vocab_size}")


@dataclass
class LoraSection:
    """peft LoRA on the base (medusa2 mode). Defaults: Medusa-2's r=32, α=16, dropout 0.05, attention + MLP."""
    r: int = 32
    alpha: int = 16
    dropout: float = 0.05
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj",
                                                               "gate_proj", "up_proj", "down_proj"])

    def validate(self):
        if self.r < 1 or self.alpha < 1:
            raise ValueError(f"lora.r and lora.alpha must be >= 1, got r={self.r}, alpha={self.alpha}")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"lora.dropout must be in [0, 1), got {self.dropout}")
        if not self.target_modules:
            raise ValueError("lora.target_modules must name at least one module")


@dataclass
class JointSection:
    """The joint loss of medusa2 mode: L_base + λ(t)·Σ_k decay^k L_k."""
    heads_weight: float = 0.2  # λ0: 0.2 on ground-truth answers, 0.01 with self-distillation (Medusa-2)
    heads_weight_warmup_steps: int = 0  # λ rises from 0 to λ0 over these updates
    heads_weight_schedule: Literal["sine", "linear", "constant"] = "sine"
    heads_lr_multiplier: float = 4.0  # heads learn at lr × this; LoRA at lr
    base_loss: Literal["lm", "distill_kl"] = "lm"  # distill_kl: KL(base without LoRA ‖ adapted base)
    init_heads: str | None = None  # stage 2 of the two-stage recipe: start from these Medusa-1 heads

    def validate(self):
        if self.heads_weight < 0 or self.heads_weight_warmup_steps < 0:
            raise ValueError("joint.heads_weight and joint.heads_weight_warmup_steps must be >= 0")
        if self.heads_lr_multiplier <= 0:
            raise ValueError(f"joint.heads_lr_multiplier must be > 0, got {self.heads_lr_multiplier}")


@dataclass
class MedusaTrainConfig:
    mode: Literal["medusa1", "medusa2"] = "medusa1"
    model: ModelSection = field(default_factory=ModelSection)
    data: DataSection = field(default_factory=DataSection)
    heads: HeadsSection = field(default_factory=HeadsSection)
    train: TrainSection = field(default_factory=TrainSection)
    lora: LoraSection = field(default_factory=LoraSection)  # medusa2 only
    joint: JointSection = field(default_factory=JointSection)  # medusa2 only
    schedule: list[dict] = field(default_factory=list)  # stages (train/schedule.py); empty: one run of this config
    # what a stage may set besides data.* and the train keys of schedule.STAGE_TRAIN_KEYS
    stage_keys: ClassVar[dict] = {"joint": ("heads_weight", "heads_weight_warmup_steps", "heads_weight_schedule",
                                            "heads_lr_multiplier", "base_loss")}

    def validate(self):
        stages(self)
        if self.mode == "medusa2" and self.heads.cache_hidden_states:
            raise ValueError("heads.cache_hidden_states needs a frozen base (mode medusa1): LoRA changes the states")
        if self.mode == "medusa2" and self.heads.draft_vocab_size:
            raise ValueError("heads.draft_vocab_size is supported in mode medusa1 only")
        if self.heads.loss != "ce" and (self.mode == "medusa2" or self.heads.loss_chunk):
            raise ValueError(f"heads.loss: {self.heads.loss} is supported in mode medusa1 without heads.loss_chunk "
                             "only (use ce)")


def base_hidden_states(base, batch):
    """The frozen base's last hidden state (lm_head input), without building a graph."""
    with torch.no_grad():
        out = base.get_decoder()(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    return out.last_hidden_state


@torch.no_grad()
def base_distributions(states: torch.Tensor, labels: torch.Tensor, lm_head, draft_ids: torch.Tensor | None,
                       chunk: int = 1024) -> torch.Tensor:
    """The base's softmax [B, T, V] (only the draft vocabulary's columns when draft_ids is given) at the positions
    whose next token is an assistant label, zeros elsewhere: computed once per position, shared by every head that
    drafts for it (a slice of positions at a time: the whole-vocabulary logits are the large part)."""
    where, _ = next_token_positions(labels)
    rows = states[where]
    probs = []
    for lo in range(0, rows.shape[0], chunk):
        p = torch.softmax(lm_head(rows[lo:lo + chunk]).float(), -1)
        probs.append(p if draft_ids is None else p[:, draft_ids])
    width = lm_head.weight.shape[0] if draft_ids is None else draft_ids.numel()
    out = torch.zeros((*labels.shape, width), dtype=torch.float32, device=states.device)
    if probs:
        out[where] = torch.cat(probs)
    return out


@torch.no_grad()
def rollout_counts(heads, unwrapped: MedusaHeads, states: torch.Tensor, labels: torch.Tensor, lm_head) -> torch.Tensor:
    """Chain acceptance of the heads on these held-out answers (train/acceptance.chain_counts): from each answer
    position t, head k reads the base's state at t and proposes x_{t+k+1}, as the chain decoder's drafts do;
    the base's logits there come from its state at t+k."""
    k = unwrapped.config.num_heads
    starts = chain_starts(labels, k)
    hidden = states[starts]
    base_states = torch.stack([along_chain(states, starts, i + 1) for i in range(k)])
    draft_ids = unwrapped.draft_ids if unwrapped.config.draft_vocab_size else None
    return chunked_chain_counts(k, hidden.shape[0], lambda lo, hi: (heads(hidden[lo:hi], lm_head),
                                                                     lm_head(base_states[:, lo:hi])),
                                draft_ids, states.device)


class MedusaTask(DraftTask):
    name = "medusa"

    def __init__(self, cfg: MedusaTrainConfig):
        self.cfg = cfg
        self.part_names = [f"head{k + 1}" for k in range(cfg.heads.num_heads)]
        self.sources = {}  # split -> FeatureSource (cached base states)

    def build(self, base, tokenizer, examples):
        h = self.cfg.heads
        config = MedusaConfig.for_base(base.config, self.cfg.model.name, num_heads=h.num_heads,
                                       num_layers=h.num_layers, own_lm_head=h.own_lm_head,
                                       draft_vocab_size=h.draft_vocab_size)
        heads = MedusaHeads(config)
        if config.draft_vocab_size:
            heads.set_draft_vocabulary(frequent_tokens(examples, config.vocab_size, config.draft_vocab_size))
        if config.own_lm_head:
            heads.init_from_base_lm_head(base.get_output_embeddings())
        return heads

    def load(self, directory, base):
        return MedusaHeads.from_pretrained(directory, base)

    def hidden_states(self, base, batch, indices, split: str) -> torch.Tensor:
        """The base's last hidden state for these examples: from the cache when enabled, else a forward."""
        h = self.cfg.heads
        if not h.cache_hidden_states:
            return base_hidden_states(base, batch)
        if split not in self.sources:
            self.sources[split] = FeatureSource(base, self.cfg.model.name, asdict(self.cfg.data), [], split,
                                                feature_cache_dir(h.cache_dir))
        return self.sources[split](batch, indices)[1]

    def loss(self, heads, base, batch, indices, step):
        states = self.hidden_states(base, batch, indices, "train")
        hidden, targets = select_trained_positions(states, batch["labels"], self.cfg.heads.num_heads)
        lm_head, decay, chunk = base.get_output_embeddings(), self.cfg.train.head_loss_decay, self.cfg.heads.loss_chunk
        unwrapped = getattr(heads, "module", heads)  # DDP / DeepSpeed wrap the heads
        targets = unwrapped.token_to_draft(targets, missing=IGNORE_INDEX)  # no loss where the draft cannot hit
        if chunk:
            return chunked_medusa_loss(heads(hidden, lm_head, project=False),
                                       lambda x: unwrapped.project(x, lm_head), targets, decay, chunk)
        logits = heads(hidden, lm_head)
        if self.cfg.heads.loss == "ce":
            return medusa_loss(logits, targets, decay)
        return self._acceptance_loss(unwrapped, logits, targets, states, batch["labels"], lm_head, decay)

    def _acceptance_loss(self, heads, logits, targets, states, labels, lm_head, decay):
        """heads.loss tv / ce+tv: per head the total-variation distance between its softmax and the base's at the
        place it drafts for (head k at t: the base's distribution of x_{t+k+1}, from its state at t+k), over the
        positions with an assistant target, plus (ce+tv) the label cross-entropy."""
        h = self.cfg.heads
        keep, labelled = head_positions(labels, h.num_heads)
        base_probs = base_distributions(states, labels, lm_head, heads.draft_ids if heads.config.draft_vocab_size
                                        else None)
        tv = []
        for k in range(h.num_heads):
            rows = labelled[k] != IGNORE_INDEX
            target = along_chain(base_probs, keep, k + 1)[rows]
            tv.append(total_variation(logits[k][rows], target).mean() if rows.any() else logits.sum() * 0)
        per_head = torch.stack(tv)
        if h.loss == "ce+tv":
            per_head = medusa_loss(logits, targets, decay)[1] + h.tv_weight * per_head
        weights = decay ** torch.arange(1, h.num_heads + 1, dtype=per_head.dtype, device=per_head.device)
        return (weights * per_head).sum(), per_head

    @torch.no_grad()
    def evaluate(self, heads, base, examples, pad_token_id, batch_size, accelerator) -> dict:
        """Per-head top-1/top-5 accuracy on held-out assistant tokens, summed over ranks."""
        heads.eval()
        num_heads = self.cfg.heads.num_heads
        counts = torch.zeros(num_heads, 3, dtype=torch.float64, device=accelerator.device)
        unwrapped = getattr(heads, "module", heads)  # DDP / DeepSpeed wrap the heads
        for indices, batch in heldout_batches(examples, pad_token_id, batch_size, accelerator):
            hidden, targets = select_trained_positions(self.hidden_states(base, batch, indices, "heldout"),
                                                       batch["labels"], num_heads)
            targets = unwrapped.token_to_draft(targets, missing=-1)  # outside the draft vocabulary: a miss
            counts += topk_hits(heads(hidden, base.get_output_embeddings()), targets).to(counts.device)
        result = accuracy_result(accelerator.reduce(counts, reduction="sum"))
        result.update(heldout_acceptance(
            examples, self.cfg.train.accept_positions, num_heads, pad_token_id, batch_size, accelerator,
            lambda indices, batch: rollout_counts(heads, unwrapped, self.hidden_states(base, batch, indices, "heldout"),
                                                  batch["labels"], base.get_output_embeddings())))
        heads.train()
        return result


class Medusa2Task(MedusaTask):
    """Heads and a LoRA adapter on the base, trained together (the module is MedusaWithLoRA)."""

    name = "medusa2"

    def __init__(self, cfg: MedusaTrainConfig):
        super().__init__(cfg)
        self.part_names = ["base"] + self.part_names

    def build(self, base, tokenizer, examples):
        from peft import get_peft_model

        heads = super().build(base, tokenizer, examples)
        if self.cfg.joint.init_heads:
            heads.load_state_dict(MedusaHeads.from_pretrained(self.cfg.joint.init_heads, base).state_dict())
        lora = self.cfg.lora
        missing = [m for m in lora.target_modules if not any(n.endswith("." + m) for n, _ in base.named_modules())]
        if missing:
            raise ConfigError(f"lora.target_modules: {base.config.model_type} has no modules named {missing}")
        peft_base = get_peft_model(base, lora_config(lora.r, lora.alpha, lora.dropout, lora.target_modules))
        return MedusaWithLoRA(peft_base, heads)

    def restore(self, module, directory, base):
        module.load_trained(directory)

    def param_groups(self, module, lr):
        lora, heads = module.trainable_parameters()
        return [{"params": lora, "lr": lr}, {"params": heads, "lr": lr * self.cfg.joint.heads_lr_multiplier}]

    def loss(self, module, base, batch, indices, step):
        j, num_heads = self.cfg.joint, self.cfg.heads.num_heads
        lm_at, lm_targets = next_token_positions(batch["labels"])
        heads_at, head_targets = head_positions(batch["labels"], num_heads)
        out = module(batch["input_ids"], batch["attention_mask"], lm_at, heads_at, teacher=j.base_loss == "distill_kl")
        weight = heads_weight_at(step, j.heads_weight, j.heads_weight_warmup_steps, j.heads_weight_schedule)
        return medusa2_loss(out["lm_logits"], lm_targets, out["head_logits"], head_targets, weight,
                            self.cfg.train.head_loss_decay, out.get("teacher_logits"))

    @torch.no_grad()
    def evaluate(self, module, base, examples, pad_token_id, batch_size, accelerator) -> dict:
        """Per-head accuracy on the adapted base, and the held-out LM loss without / with the adapter."""
        model = accelerator.unwrap_model(module)
        model.eval()
        num_heads = self.cfg.heads.num_heads
        counts = torch.zeros(num_heads, 3, dtype=torch.float64, device=accelerator.device)
        lm = torch.zeros(3, dtype=torch.float64, device=accelerator.device)  # loss sums before, after; tokens
        lm_head = model.base.get_output_embeddings()
        for _, batch in heldout_batches(examples, pad_token_id, batch_size, accelerator):
            lm_at, lm_targets = next_token_positions(batch["labels"])
            with accelerator.autocast():
                for i, adapter in enumerate((False, True)):
                    hidden = model.hidden_states(batch["input_ids"], batch["attention_mask"], adapter=adapter)
                    lm[i] += F.cross_entropy(lm_head(hidden[lm_at]).float(), lm_targets, reduction="sum").double()
                hidden, targets = select_trained_positions(hidden, batch["labels"], num_heads)
                counts += topk_hits(model.heads(hidden, lm_head), targets).to(counts.device)
            lm[2] += lm_targets.numel()
        result = accuracy_result(accelerator.reduce(counts, reduction="sum"))
        def adapted_counts(_, batch):  # the heads on the adapted base, which is what decodes with them
            with accelerator.autocast():
                states = model.hidden_states(batch["input_ids"], batch["attention_mask"], adapter=True)
                return rollout_counts(model.heads, model.heads, states, batch["labels"], lm_head)

        result.update(heldout_acceptance(examples, self.cfg.train.accept_positions, num_heads, pad_token_id,
                                         batch_size, accelerator, adapted_counts))
        model.train()
        before, after, tokens = accelerator.reduce(lm, reduction="sum").tolist()
        result.update(lm_loss_before=before / max(tokens, 1), lm_loss_after=after / max(tokens, 1))
        return result

    @staticmethod
    def format_result(result: dict) -> str:
        return (format_accuracy(result) + f"\nheld-out LM loss of the base: {result['lm_loss_before']:.4f} without "
                f"the adapter, {result['lm_loss_after']:.4f} with it")

    @staticmethod
    def eval_logs(result: dict) -> dict:
        return {**accuracy_logs(result), "eval/lm_loss_before": result["lm_loss_before"],
                "eval/lm_loss_after": result["lm_loss_after"]}

    @staticmethod
    def final_extra(result: dict) -> dict:
        return {**MedusaTask.final_extra(result),
                "quality_guard": {"heldout_lm_loss_before": result["lm_loss_before"],
                                  "heldout_lm_loss_after": result["lm_loss_after"]}}


def make_task(cfg: MedusaTrainConfig):
    return Medusa2Task(cfg) if cfg.mode == "medusa2" else MedusaTask(cfg)


def main(argv=None) -> int:
    return train_main(MedusaTrainConfig, make_task, argv, __doc__)


if __name__ == "__main__":
    sys.exit(main())

"""Train Medusa heads on a frozen base model (Medusa-1).

    accelerate launch train/medusa.py --config configs/smollm2-135m.yaml [section.key=value ...] [--resume]
    python train/medusa.py --config configs/smollm2-135m.yaml

Loss: Σ_k 0.8^k · CE(head_k(h_t), x_{t+k+1}) over assistant tokens; the base is frozen
(eval mode, no grads). The loop, checkpoints and logging are train/loop.py's.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

import torch

from specheads.heads import MedusaConfig, MedusaHeads
from specheads.train.losses import estimated_tau, medusa_loss, select_trained_positions, topk_hits
from specheads.train.loop import DataSection, ModelSection, TrainSection, heldout_batches, train_main


@dataclass
class HeadsSection:
    num_heads: int = 4
    num_layers: int = 1
    own_lm_head: bool = False


@dataclass
class MedusaTrainConfig:
    model: ModelSection = field(default_factory=ModelSection)
    data: DataSection = field(default_factory=DataSection)
    heads: HeadsSection = field(default_factory=HeadsSection)
    train: TrainSection = field(default_factory=TrainSection)


def base_hidden_states(base, batch):
    """The frozen base's last hidden state (lm_head input), without building a graph."""
    with torch.no_grad():
        out = base.get_decoder()(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    return out.last_hidden_state


def format_accuracy(result: dict) -> str:
    lines = ["head  top-1   top-5   tokens"]
    for k, (t1, t5, n) in enumerate(zip(result["top1"], result["top5"], result["tokens"]), 1):
        lines.append(f"{k:>4}  {t1:.3f}   {t5:.3f}   {int(n)}")
    lines.append(f"estimated chain tau (1 + sum of prod top-1): {result['estimated_tau']:.3f}")
    return "\n".join(lines)


def accuracy_logs(result: dict) -> dict:
    logs = {"eval/estimated_tau": result["estimated_tau"]}
    for k, (t1, t5) in enumerate(zip(result["top1"], result["top5"]), 1):
        logs[f"eval/top1_head{k}"] = t1
        logs[f"eval/top5_head{k}"] = t5
    return logs


def accuracy_result(counts: torch.Tensor) -> dict:
    """Summed [K, 3] hit counts (top-1, top-5, tokens) -> per-head accuracies and the chain τ estimate."""
    top1 = (counts[:, 0] / counts[:, 2].clamp(min=1)).tolist()
    top5 = (counts[:, 1] / counts[:, 2].clamp(min=1)).tolist()
    return {"top1": top1, "top5": top5, "tokens": counts[:, 2].tolist(), "estimated_tau": estimated_tau(top1)}


class MedusaTask:
    name = "medusa"

    def __init__(self, cfg: MedusaTrainConfig):
        self.cfg = cfg
        self.part_names = [f"head{k + 1}" for k in range(cfg.heads.num_heads)]

    def build(self, base, tokenizer, examples):
        h = self.cfg.heads
        config = MedusaConfig.for_base(base.config, self.cfg.model.name, num_heads=h.num_heads,
                                       num_layers=h.num_layers, own_lm_head=h.own_lm_head)
        return MedusaHeads(config, base.get_output_embeddings())

    def load(self, directory, base):
        return MedusaHeads.from_pretrained(directory, base)

    def loss(self, heads, base, batch, indices):
        hidden, targets = select_trained_positions(base_hidden_states(base, batch), batch["labels"],
                                                   self.cfg.heads.num_heads)
        return medusa_loss(heads(hidden, base.get_output_embeddings()), targets, self.cfg.train.head_loss_decay)

    @torch.no_grad()
    def evaluate(self, heads, base, examples, pad_token_id, batch_size, accelerator) -> dict:
        """Per-head top-1/top-5 accuracy on held-out assistant tokens, summed over ranks."""
        heads.eval()
        num_heads = self.cfg.heads.num_heads
        counts = torch.zeros(num_heads, 3, dtype=torch.float64, device=accelerator.device)
        for batch in heldout_batches(examples, pad_token_id, batch_size, accelerator):
            hidden, targets = select_trained_positions(base_hidden_states(base, batch), batch["labels"], num_heads)
            counts += topk_hits(heads(hidden, base.get_output_embeddings()), targets).to(counts.device)
        heads.train()
        return accuracy_result(accelerator.reduce(counts, reduction="sum"))

    format_result = staticmethod(format_accuracy)
    eval_logs = staticmethod(accuracy_logs)

    @staticmethod
    def final_extra(result: dict) -> dict:
        return {"heldout_accuracy": {key: result[key] for key in ("top1", "top5", "tokens", "estimated_tau")}}


def main(argv=None) -> int:
    return train_main(MedusaTrainConfig, MedusaTask, argv, __doc__)


if __name__ == "__main__":
    sys.exit(main())

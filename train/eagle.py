"""Train an EAGLE draft head (EAGLE-1 or EAGLE-3) on a frozen base model.

    accelerate launch train/eagle.py --config configs/smollm2-135m-eagle3.yaml [section.key=value ...] [--resume]
    python train/eagle.py --config configs/smollm2-135m-eagle3-recipe.yaml --resume   (a schedule of stages)

At position t the draft reads the base's feature at t and the token x_{t+1}, and predicts the base's
next-token distribution at t+1 (and, for EAGLE-1, the feature f_{t+1} itself):
  EAGLE-1: SmoothL1(f̂, f) + 0.1 · soft-CE(lm_head(f̂), softmax(lm_head(f))), input noise U(−0.1, 0.1).
  EAGLE-3: training-time test: `ttt_steps` unrolled draft steps, step i fed the draft's own features of
           step i−1 (train/losses.unrolled_step_mask), soft-CE over the draft vocabulary weighted 0.8^i.
  Either: `greedy_target_weight` w trains on (1 − w)·p + w·one_hot(argmax p), for drafts serving greedy decoding.
The base's hidden states are computed online, or once per example into a cache keyed by model, data
and settings (eagle.cache_features) so later epochs skip the base forward.
"""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass, field, replace
from typing import ClassVar

import torch
import torch.nn.functional as F
from transformers import DynamicCache

from specheads.data.tokenization import IGNORE_INDEX, frequent_tokens
from specheads.heads.eagle import EagleConfig, EagleDraft, default_aux_layers
from specheads.train.features import FeatureSource, feature_cache_dir
from specheads.train.acceptance import accuracy_result, along_chain, chain_starts, chunked_chain_counts, heldout_acceptance
from specheads.train.losses import mix_greedy_target, soft_cross_entropy, total_variation, unrolled_step_mask
from specheads.train.cli import train_main
from specheads.train.config import ConfigError, DataSection, ModelSection, TrainSection, check_draft_loss, check_finite
from specheads.train.data_order import heldout_batches
from specheads.train.schedule import stages
from specheads.train.task import DraftTask


@dataclass
class EagleSection:
    variant: str = "eagle3"  # eagle1 | eagle3
    draft_vocab_size: int = 8192  # eagle3: the most frequent target tokens of the training answers
    aux_layer_ids: list[int] | None = None  # eagle3: default the hidden states entering layers 2, L//2, L-3
    ttt_steps: int = 4  # unrolled draft steps per position in training (1 = plain teacher forcing)
    eval_steps: int = 5  # draft steps measured on held-out data (per-step accuracy, chain τ estimate)
    feature_loss_weight: float = 0.0  # EAGLE-1: 1.0 (SmoothL1 on features)
    token_loss_weight: float = 1.0  # EAGLE-1: 0.1
    input_noise: float = 0.0  # EAGLE-1: 0.1 (uniform noise on the input features)
    greedy_target_weight: float = 0.0  # move this share of the soft-CE target onto the base's argmax token
    cache_features: bool = True  # store the base's hidden states once and reuse them across epochs
    cache_dir: str = ""  # default: <specheads cache>/features
    init_draft: str | None = None  # start from this saved draft (weights and vocabulary mapping), e.g. more epochs or data
    head_from_base: bool = False  # eagle3: start the draft's lm_head as the base's lm_head rows of its draft vocabulary
    layer: str | None = None  # llama (no attention bias: what engines load; eagle3's default) | base (eagle1's)
    fc_bias: bool = False  # eagle1: EAGLE's original fc bias (SGLang loads it; vLLM cannot)
    num_layers: int = 1  # eagle3: draft decoder layers (engines' formats hold 1; more decode with specheads only)
    # ce | tv | ce+tv: the token loss per step: soft-CE, total variation to the base (1 − T=1 acceptance), or
    # soft-CE + tv_weight·TV. ce+tv: ahead of ce at T=1 in both seeds tried, level at T=0 (docs/results.md).
    loss: str = "ce+tv"
    tv_weight: float = 1.0  # the TV term's weight in ce+tv

    def validate(self):
        check_draft_loss("eagle", self.loss, self.tv_weight)
        if self.variant not in ("eagle1", "eagle3"):
            raise ValueError(f"eagle.variant must be eagle1 or eagle3, got {self.variant!r}")
        if self.ttt_steps < 1 or self.eval_steps < 1:
            raise ValueError("eagle.ttt_steps and eagle.eval_steps must be >= 1")
        if self.layer not in (None, "llama", "base"):
            raise ValueError(f"eagle.layer must be llama or base, got {self.layer!r}")
        if not 0.0 <= self.greedy_target_weight <= 1.0:
            raise ValueError(f"eagle.greedy_target_weight must be in [0, 1], got {self.greedy_target_weight}")
        if self.draft_vocab_size < 0:
            raise ValueError(f"eagle.draft_vocab_size must be >= 0, got {self.draft_vocab_size}")
        if self.head_from_base and (self.variant != "eagle3" or self.init_draft):
            raise ValueError("eagle.head_from_base starts a new EAGLE-3 draft: it needs variant eagle3 and no "
                             "eagle.init_draft")
        if self.num_layers < 1 or (self.num_layers > 1 and self.variant != "eagle3"):
            raise ValueError(f"eagle.num_layers must be >= 1, and above 1 only for eagle3, got {self.num_layers} "
                             f"for {self.variant}")
        check_finite("eagle", self, ("feature_loss_weight", "token_loss_weight", "input_noise"), inclusive=True)


@dataclass
class EagleTrainConfig:
    model: ModelSection = field(default_factory=ModelSection)
    data: DataSection = field(default_factory=DataSection)
    eagle: EagleSection = field(default_factory=EagleSection)
    train: TrainSection = field(default_factory=TrainSection)
    schedule: list[dict] = field(default_factory=list)  # stages (train/schedule.py); empty: one run of this config
    # what a stage may set besides data.* and the train keys of schedule.STAGE_TRAIN_KEYS
    stage_keys: ClassVar[dict] = {"eagle": ("greedy_target_weight", "token_loss_weight", "feature_loss_weight",
                                            "input_noise", "ttt_steps", "eval_steps", "loss", "tv_weight")}

    def validate(self):
        stages(self)


# ---- the unrolled draft ----------------------------------------------------------------------

def unrolled_draft(draft: EagleDraft, base, batch, inputs, last, steps: int, noise: float = 0.0):
    """Run `steps` draft steps over every position at once (training-time test).

    Returns, at the N positions some step trains: the draft's outputs per step [steps, N, H], the base's
    last hidden state at t+1 (the target feature, whose lm_head gives the target distribution) [N, H], and
    which step trains which position [steps, N]."""
    ids, labels = batch["input_ids"], batch["labels"]
    length = ids.shape[1] - 1  # position t pairs the feature at t with the token x_{t+1}
    embeddings = base.get_input_embeddings()(ids[:, 1:])
    unwrapped = getattr(draft, "module", draft)  # DDP / DeepSpeed wrap the draft: its forward goes through them
    selected = [last[:, :length]] if unwrapped.config.variant == "eagle1" else list(inputs[:, :, :length])
    features = unwrapped.fuse(selected)
    if noise:
        features = features + (torch.rand_like(features) * 2 - 1) * noise
    # Trained positions: x_{t+2}, the token drafted at t, is an assistant token.
    trained = torch.zeros_like(labels[:, 1:], dtype=torch.bool)
    trained[:, :-1] = labels[:, 2:] != IGNORE_INDEX
    positions = torch.arange(length, device=ids.device)[None].expand(ids.shape[0], -1)
    cache = DynamicCache()
    outputs, valid = [], []
    for step in range(steps):
        mask = unrolled_step_mask(length, step, torch.float32, ids.device)[None, None]
        out = draft(features, embeddings, positions, mask, cache)
        outputs.append(out)
        ok = trained.clone()
        ok[:, :step] = False  # no path starts before position 0
        valid.append(ok)
        features = F.pad(out[:, :-1], (0, 0, 1, 0))  # step i+1 at t reads step i's output at t−1
    keep = torch.stack(valid).any(0)  # [B, length]
    return (torch.stack([o[keep] for o in outputs]), last[:, 1:][keep], torch.stack([v[keep] for v in valid]))


@torch.no_grad()
def rollout(draft: EagleDraft, base, batch, inputs, last, steps: int) -> list[torch.Tensor]:
    """The draft rolled out `steps` steps from every position at once, as the chain decoder drafts: step 1 at t
    reads the base's feature at t and the true token x_{t+1}; step i+1 reads step i's output feature AND the token
    step i proposed (its argmax, mapped to the base vocabulary), never the base's features or the answer's
    tokens (unrolled_draft's training-time test feeds the true tokens). -> each step's outputs [B, T-1, H]; step
    i's output at t + i - 1 is the draft's i-th proposal from t."""
    length = batch["input_ids"].shape[1] - 1
    embed, lm_head = base.get_input_embeddings(), base.get_output_embeddings()
    embeddings = embed(batch["input_ids"][:, 1:])
    unwrapped = getattr(draft, "module", draft)  # DDP / DeepSpeed wrap the draft
    selected = [last[:, :length]] if unwrapped.config.variant == "eagle1" else list(inputs[:, :, :length])
    features = unwrapped.fuse(selected)
    positions = torch.arange(length, device=embeddings.device)[None].expand(embeddings.shape[0], -1)
    cache, outputs = DynamicCache(), []
    for step in range(steps):
        mask = unrolled_step_mask(length, step, torch.float32, embeddings.device)[None, None]
        out = draft(features, embeddings, positions, mask, cache)
        outputs.append(out)
        flat = out.reshape(-1, out.shape[-1])  # the argmax a slice at a time: EAGLE-1 projects to the whole vocabulary
        proposed = torch.cat([unwrapped.logits(flat[i:i + 4096], lm_head).argmax(-1)
                              for i in range(0, flat.shape[0], 4096)]).view(out.shape[:2])
        proposed = unwrapped.draft_to_target(proposed)  # x_{t+2}, proposed from t
        embeddings = embed(F.pad(proposed[:, :-1], (1, 0)))  # step i+1 at t reads the token step i proposed at t−1
        features = F.pad(out[:, :-1], (0, 0, 1, 0))
    return outputs


@torch.no_grad()
def rollout_counts(draft, base, batch, inputs, last, steps: int) -> torch.Tensor:
    """Chain acceptance of the draft's own rollouts from every held-out answer position (train/acceptance)."""
    unwrapped = getattr(draft, "module", draft)
    lm_head = base.get_output_embeddings()
    outputs = rollout(draft, base, batch, inputs, last, steps)
    starts = chain_starts(batch["labels"], steps)
    drafted = torch.stack([along_chain(out, starts[:, :-1], i) for i, out in enumerate(outputs)])
    base_states = torch.stack([along_chain(last, starts, i + 1) for i in range(steps)])
    vocab = unwrapped.config.draft_vocab_size
    draft_ids = unwrapped.draft_to_target(torch.arange(vocab, device=last.device)) \
        if unwrapped.config.variant == "eagle3" else None
    return chunked_chain_counts(steps, drafted.shape[1], lambda lo, hi: (unwrapped.logits(drafted[:, lo:hi], lm_head),
                                                                         lm_head(base_states[:, lo:hi])),
                                draft_ids, last.device)


@torch.no_grad()
def base_targets(draft: EagleDraft, base, target_features, greedy_weight: float = 0.0):
    """The base's next-token distribution (restricted to the draft vocabulary for EAGLE-3), with
    `greedy_weight` of it moved onto the argmax, and the argmax itself."""
    logits = base.get_output_embeddings()(target_features).float()
    greedy = logits.argmax(-1)
    probs = mix_greedy_target(torch.softmax(logits, dim=-1), greedy, greedy_weight)
    if draft.config.variant == "eagle3":
        probs = probs[:, draft.draft_to_target(torch.arange(draft.config.draft_vocab_size, device=probs.device))]
    return probs, greedy


class EagleTask(DraftTask):
    def __init__(self, cfg: EagleTrainConfig):
        self.cfg = cfg
        self.name = cfg.eagle.variant
        self.part_names = [f"step{i + 1}" for i in range(cfg.eagle.ttt_steps)]
        self.sources = {}

    def _layers(self, base) -> list[int]:
        if self.cfg.eagle.variant == "eagle1":
            return []
        return self.cfg.eagle.aux_layer_ids or default_aux_layers(base.config.num_hidden_layers)

    def _features(self, base, split):
        if split not in self.sources:
            e = self.cfg.eagle
            cache = feature_cache_dir(e.cache_dir) if e.cache_features else None
            self.sources[split] = FeatureSource(base, self.cfg.model.name, asdict(self.cfg.data), self._layers(base),
                                                split, cache)
        return self.sources[split]

    def build(self, base, tokenizer, examples):
        e = self.cfg.eagle
        config = EagleConfig.for_base(base.config, self.cfg.model.name, variant=e.variant,
                                      draft_vocab_size=e.draft_vocab_size, aux_layer_ids=self._layers(base) or None,
                                      layer=e.layer, fc_bias=e.fc_bias)
        config = replace(config, num_layers=e.num_layers)
        if e.init_draft:
            return self._initial_draft(config, base)
        draft = EagleDraft(config)
        if e.variant == "eagle3":
            draft.set_vocab_mapping(frequent_tokens(examples, config.vocab_size, config.draft_vocab_size))
            if e.head_from_base:
                draft.head_from_base(base)
        return draft

    def _initial_draft(self, config: EagleConfig, base) -> EagleDraft:
        """The draft named by eagle.init_draft, refused unless its shape is the one this config would build
        (from_pretrained already refuses a draft whose sizes do not fit the base)."""
        source = self.cfg.eagle.init_draft
        draft = EagleDraft.from_pretrained(source, base)
        theirs = draft.config
        for name in ("variant", "draft_vocab_size", "aux_layer_ids", "num_layers"):
            if getattr(theirs, name) != getattr(config, name):
                raise ConfigError(f"eagle.init_draft: {source} has {name}={getattr(theirs, name)!r}, "
                                 f"this config builds {name}={getattr(config, name)!r}")
        return draft

    def load(self, directory, base):
        return EagleDraft.from_pretrained(directory, base)

    def _losses(self, draft, base, batch, inputs, last, steps, noise):
        e = self.cfg.eagle
        outputs, target_features, valid = unrolled_draft(draft, base, batch, inputs, last, steps, noise)
        draft = getattr(draft, "module", draft)  # its own methods below, not the DDP / DeepSpeed wrapper's
        probs, greedy = base_targets(draft, base, target_features, e.greedy_target_weight)
        per_step, hits = [], []
        for step in range(steps):
            rows = valid[step]
            logits = draft.logits(outputs[step][rows], base.get_output_embeddings())
            loss = e.token_loss_weight * self._token_loss(logits, probs[rows])
            if e.feature_loss_weight:
                loss = loss + e.feature_loss_weight * F.smooth_l1_loss(outputs[step][rows].float(),
                                                                       target_features[rows].float())
            per_step.append(loss)
            with torch.no_grad():
                top = draft.draft_to_target(logits.topk(5, dim=-1).indices)
                match = top == greedy[rows, None]
                hits.append(torch.stack([match[:, :1].any(-1).sum(), match.any(-1).sum()]).double()
                            .tolist() + [float(rows.sum())])
        return torch.stack(per_step), torch.tensor(hits, dtype=torch.float64)

    def _token_loss(self, logits, target_probs):
        e = self.cfg.eagle
        if e.loss == "ce":
            return soft_cross_entropy(logits, target_probs).mean()
        tv = total_variation(logits, target_probs).mean()
        return tv if e.loss == "tv" else soft_cross_entropy(logits, target_probs).mean() + e.tv_weight * tv

    def loss(self, draft, base, batch, indices, step):
        inputs, last = self._features(base, "train")(batch, indices)
        per_step, _ = self._losses(draft, base, batch, inputs, last, self.cfg.eagle.ttt_steps, self.cfg.eagle.input_noise)
        weights = self.cfg.train.head_loss_decay ** torch.arange(len(per_step), dtype=per_step.dtype)
        return (weights.to(per_step.device) * per_step).sum(), per_step

    @torch.no_grad()
    def evaluate(self, draft, base, examples, pad_token_id, batch_size, accelerator) -> dict:
        """Per draft step: how often the draft's top-1 / top-5 holds the base's greedy token (own features fed back)."""
        draft.eval()
        steps = self.cfg.eagle.eval_steps
        counts = torch.zeros(steps, 3, dtype=torch.float64, device=accelerator.device)
        source = self._features(base, "heldout")
        for indices, batch in heldout_batches(examples, pad_token_id, batch_size, accelerator):
            inputs, last = source(batch, indices)
            with accelerator.autocast():
                _, hits = self._losses(draft, base, batch, inputs, last, steps, 0.0)
            counts += hits.to(counts.device)
        result = accuracy_result(accelerator.reduce(counts, reduction="sum"))
        def draft_counts(indices, batch):
            inputs, last = source(batch, indices)
            with accelerator.autocast():
                return rollout_counts(draft, base, batch, inputs, last, steps)

        result.update(heldout_acceptance(examples, self.cfg.train.accept_positions, steps, pad_token_id, batch_size,
                                         accelerator, draft_counts))
        draft.train()
        return result


def main(argv=None) -> int:
    return train_main(EagleTrainConfig, EagleTask, argv, __doc__)


if __name__ == "__main__":
    sys.exit(main())

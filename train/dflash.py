"""Train a DFlash block drafter (heads/dflash.py) on a frozen base model.

    python train/dflash.py --config configs/smollm2-135m-dflash.yaml [section.key=value ...] [--resume]

Teacher forcing from the true context: in each sequence `dflash.anchors` anchor positions a are drawn among those
whose next token is an answer token. A block is [x_a, mask, ..., mask] at positions a .. a+block_size-1; it attends
to the base's fused features at positions < a (the context vLLM's drafter would hold after verifying x_a's
predecessor) and to its own block, all blocks of a sequence in one forward (one mask). Block position j is trained
with cross-entropy against the answer token x_{a+j}, weighted train.head_loss_decay^(j-1), only where x_{a+j} is
an answer token. The base's hidden states come from the same cache as the EAGLE trainers' (train/features.py):
a DFlash run whose target layers are an EAGLE-3 run's (configs/smollm2-135m-dflash.yaml sets them; the default is
the published rule, heads/dflash.default_target_layer_ids) reads that run's cache on the same data.
"""

from __future__ import annotations

import sys
import warnings
from dataclasses import asdict, dataclass, field
from typing import ClassVar

import torch
import torch.nn.functional as F

from specheads.data.tokenization import IGNORE_INDEX
from specheads.heads.dflash import DFlashConfig, DFlashDraft
from specheads.train.acceptance import accuracy_result, chunked_chain_counts, heldout_acceptance
from specheads.train.cli import train_main
from specheads.train.config import ConfigError, DataSection, ModelSection, TrainSection
from specheads.train.data_order import heldout_batches
from specheads.train.features import FeatureSource, feature_cache_dir
from specheads.train.schedule import stages
from specheads.train.task import DraftTask


@dataclass
class DFlashSection:
    block_size: int = 8  # the anchor + the tokens one forward drafts (vLLM: num_speculative_tokens = block_size - 1)
    num_layers: int = 1  # draft decoder layers
    target_layer_ids: list[int] | None = None  # DFlash indexing (output of layer i); default the published rule
    # (heads/dflash.default_target_layer_ids: one per draft layer, spread over 1 .. L - 3)
    mask_token_id: int | None = None  # default: the last id of the base's vocabulary
    causal: bool = False  # attention inside the block: false = the whole block (DFlash)
    anchors: int = 16  # blocks trained per sequence per step (fewer where the sequence has fewer answer positions)
    cache_features: bool = True  # store the base's hidden states once and reuse them across epochs
    cache_dir: str = ""  # default: <specheads cache>/features
    init_draft: str | None = None  # start from this saved drafter (same shape)

    def validate(self):
        if self.block_size < 2:
            raise ValueError(f"dflash.block_size must be >= 2 (the anchor and one drafted token), got {self.block_size}")
        if self.num_layers < 1 or self.anchors < 1:
            raise ValueError("dflash.num_layers and dflash.anchors must be >= 1")
        if self.target_layer_ids is not None and (not self.target_layer_ids or min(self.target_layer_ids) < 0):
            raise ValueError(f"dflash.target_layer_ids must name base layers (>= 0), got {self.target_layer_ids}")


@dataclass
class DFlashTrainConfig:
    model: ModelSection = field(default_factory=ModelSection)
    data: DataSection = field(default_factory=DataSection)
    dflash: DFlashSection = field(default_factory=DFlashSection)
    train: TrainSection = field(default_factory=TrainSection)
    schedule: list[dict] = field(default_factory=list)
    stage_keys: ClassVar[dict] = {"dflash": ("anchors",)}

    def validate(self):
        stages(self)


# ---- blocks from a batch ---------------------------------------------------------------------

def choose_anchors(labels: torch.Tensor, count: int, generator: torch.Generator | None) -> torch.Tensor:
    """[B, count] anchor positions a (>= 1, so the context is not empty) whose next token x_{a+1} is an answer
    token; drawn without replacement (generator) or spread evenly over the answer (None); -1 where a row has
    fewer."""
    b, t = labels.shape
    eligible = torch.zeros(b, t, dtype=torch.bool, device=labels.device)
    eligible[:, 1:-1] = labels[:, 2:] != IGNORE_INDEX
    anchors = torch.full((b, count), -1, dtype=torch.long, device=labels.device)
    for row in range(b):
        positions = eligible[row].nonzero().flatten()
        if positions.numel() > count:
            if generator is not None:
                order = torch.randperm(positions.numel(), generator=generator)[:count].sort().values
            else:
                order = torch.linspace(0, positions.numel() - 1, count).round().long().unique()
            positions = positions[order.to(positions.device)]
        positions = positions[:count]
        anchors[row, : positions.numel()] = positions
    return anchors


def block_logits(draft: DFlashDraft, base, batch, inputs: torch.Tensor, anchors: torch.Tensor):
    """Every block of the batch in one drafter forward.

    inputs: the base's states at draft.config.feature_layers [n, B, T, H]; anchors [B, N] (-1: none).
    Returns logits [B, N, K, V] for block positions 1..K (K = block_size - 1), their target tokens [B, N, K] and
    which of them train [B, N, K] (x_{a+j} exists and is an answer token)."""
    ids, labels = batch["input_ids"], batch["labels"]
    b, t = ids.shape
    n, size = anchors.shape[1], draft.config.block_size
    device = ids.device
    context = draft.fuse(list(inputs))
    context_kv = draft.context_kv(context, torch.arange(t, device=device)[None].expand(b, -1))
    valid_anchor = anchors >= 0
    start = anchors.clamp(min=0)
    offsets = torch.arange(size, device=device)
    positions = start[:, :, None] + offsets  # [B, N, size]
    block_ids = torch.full((b, n, size), draft.config.mask_token_id, dtype=torch.long, device=device)
    block_ids[:, :, 0] = ids.gather(1, start)
    # keys: the T context positions (visible below the block's anchor), then the N blocks (each sees itself)
    sees_context = (torch.arange(t, device=device)[None, None] < start[:, :, None]) & valid_anchor[:, :, None]
    inside = torch.ones(size, size, dtype=torch.bool, device=device)
    if draft.config.causal:
        inside = inside.tril()
    own_block = torch.block_diag(*[inside] * n)  # [N*size, N*size]
    mask = torch.cat([sees_context[:, :, None, :].expand(b, n, size, t).reshape(b, n * size, t),
                      own_block.expand(b, -1, -1)], dim=-1)[:, None]
    embeddings = base.get_input_embeddings()(block_ids.view(b, n * size))
    out = draft(embeddings, positions.view(b, n * size), context_kv, mask).view(b, n, size, -1)
    logits = base.get_output_embeddings()(out[:, :, 1:])
    target_positions = positions[:, :, 1:]
    in_range = target_positions < t
    gather = target_positions.clamp(max=t - 1).view(b, -1)
    targets = ids.gather(1, gather).view(b, n, size - 1)
    trained = in_range & valid_anchor[:, :, None] & (labels.gather(1, gather).view(b, n, size - 1) != IGNORE_INDEX)
    return logits, targets, trained


def position_losses(logits, targets, trained):
    """Per block position: mean cross-entropy over its trained tokens [K], and hit counts [K, 3] (top-1,
    top-5, tokens)."""
    losses, hits = [], []
    for j in range(logits.shape[2]):
        rows = trained[:, :, j]
        chosen = logits[:, :, j][rows].float()
        answer = targets[:, :, j][rows]
        losses.append(F.cross_entropy(chosen, answer) if answer.numel() else chosen.sum() * 0.0)
        with torch.no_grad():
            top = chosen.topk(min(5, chosen.shape[-1]), dim=-1).indices if answer.numel() else answer[:, None]
            match = top == answer[:, None]
            hits.append([float(match[:, :1].any(-1).sum()), float(match.any(-1).sum()), float(answer.numel())])
    return torch.stack(losses), torch.tensor(hits, dtype=torch.float64)


@torch.no_grad()
def block_acceptance(draft: DFlashDraft, base, batch, inputs, last, anchors) -> torch.Tensor:
    """Chain acceptance of whole drafted blocks (train/acceptance.chain_counts): for every anchor a whose block
    positions all lie in the answer, the drafter's logits for x_{a+j} against the base's at a+j-1 (its `last`
    states), j = 1..K. A block is drafted in one forward from the verified context, so this is what the decoder
    sees; the base side is teacher-path, as for the other tasks."""
    logits, _, trained = block_logits(draft, base, batch, inputs, anchors)
    rows, cols = trained.all(-1).nonzero(as_tuple=True)
    k = logits.shape[2]
    drafted = logits[rows, cols].transpose(0, 1)  # [K, n, V]
    places = anchors[rows, cols][:, None] + torch.arange(k, device=anchors.device)  # a + j - 1
    base_states = last[rows[:, None], places].transpose(0, 1)  # [K, n, H]
    lm_head = base.get_output_embeddings()
    return chunked_chain_counts(k, drafted.shape[1], lambda lo, hi: (drafted[:, lo:hi], lm_head(base_states[:, lo:hi])),
                                None, last.device)


def warn_if_mask_is_in_the_answers(mask_token_id: int, tokenizer, examples, configured: int | None) -> None:
    """A mask token the training text itself contains makes a masked slot look like that token (published drafters
    use a padded row or an unused special token, REFERENCE §4b): warn, naming the id, its count and the setting."""
    count = sum(example.input_ids.count(mask_token_id) for example in examples)
    if count:
        where = "dflash.mask_token_id" if configured is not None else "the default dflash.mask_token_id (the last id)"
        warnings.warn(f"{where} {mask_token_id} ({tokenizer.convert_ids_to_tokens(mask_token_id)!r}) occurs "
                      f"{count} time{'s' if count != 1 else ''} in the training examples: set dflash.mask_token_id to "
                      "an id they never use, e.g. an unused special token or a padded row of the embedding", stacklevel=2)


class DFlashTask(DraftTask):
    name = "dflash"

    def __init__(self, cfg: DFlashTrainConfig):
        self.cfg = cfg
        self.part_names = [f"pos{j + 1}" for j in range(cfg.dflash.block_size - 1)]
        self.sources = {}

    def _config(self, base) -> DFlashConfig:
        d = self.cfg.dflash
        return DFlashConfig.for_base(base.config, self.cfg.model.name, block_size=d.block_size,
                                     num_layers=d.num_layers, target_layer_ids=d.target_layer_ids,
                                     mask_token_id=d.mask_token_id, causal=d.causal)

    def _features(self, base, split):
        if split not in self.sources:
            d = self.cfg.dflash
            cache = feature_cache_dir(d.cache_dir) if d.cache_features else None
            self.sources[split] = FeatureSource(base, self.cfg.model.name, asdict(self.cfg.data),
                                                self._config(base).feature_layers, split, cache)
        return self.sources[split]

    def build(self, base, tokenizer, examples):
        config = self._config(base)
        warn_if_mask_is_in_the_answers(config.mask_token_id, tokenizer, examples, self.cfg.dflash.mask_token_id)
        source = self.cfg.dflash.init_draft
        if not source:
            return DFlashDraft(config)
        draft = DFlashDraft.from_pretrained(source, base)
        for name in ("block_size", "num_layers", "target_layer_ids", "mask_token_id", "causal"):
            if getattr(draft.config, name) != getattr(config, name):
                raise ConfigError(f"dflash.init_draft: {source} has {name}={getattr(draft.config, name)!r}, "
                                 f"this config builds {name}={getattr(config, name)!r}")
        return draft

    def load(self, directory, base):
        return DFlashDraft.from_pretrained(directory, base)

    def loss(self, draft, base, batch, indices, step):
        inputs, _ = self._features(base, "train")(batch, indices)
        # anchors drawn from (seed, update, examples): the same blocks again after --resume
        generator = torch.Generator().manual_seed(hash((self.cfg.train.seed, step, *indices)) % 2**63)
        anchors = choose_anchors(batch["labels"], self.cfg.dflash.anchors, generator)
        per_position, _ = position_losses(*block_logits(draft, base, batch, inputs, anchors))
        weights = self.cfg.train.head_loss_decay ** torch.arange(len(per_position), dtype=per_position.dtype)
        return (weights.to(per_position.device) * per_position).sum(), per_position

    @torch.no_grad()
    def evaluate(self, draft, base, examples, pad_token_id, batch_size, accelerator) -> dict:
        """Per block position: how often the drafter's top-1 / top-5 is the answer token, over `anchors` anchors
        spread evenly over each held-out answer (the same every time); with train.accept_positions, the chain
        acceptance of those blocks at T=0 and T=1 (block_acceptance)."""
        draft.eval()
        counts = torch.zeros(self.cfg.dflash.block_size - 1, 3, dtype=torch.float64, device=accelerator.device)
        source = self._features(base, "heldout")
        for indices, batch in heldout_batches(examples, pad_token_id, batch_size, accelerator):
            inputs, _ = source(batch, indices)
            anchors = choose_anchors(batch["labels"], self.cfg.dflash.anchors, None)
            with accelerator.autocast():
                _, hits = position_losses(*block_logits(draft, base, batch, inputs, anchors))
            counts += hits.to(counts.device)
        result = accuracy_result(accelerator.reduce(counts, reduction="sum"))
        def block_counts(indices, batch):
            inputs, last = source(batch, indices)
            anchors = choose_anchors(batch["labels"], self.cfg.dflash.anchors, None)
            with accelerator.autocast():
                return block_acceptance(draft, base, batch, inputs, last, anchors)

        result.update(heldout_acceptance(examples, self.cfg.train.accept_positions, self.cfg.dflash.block_size - 1,
                                         pad_token_id, batch_size, accelerator, block_counts))
        draft.train()
        return result


def main(argv=None) -> int:
    return train_main(DFlashTrainConfig, DFlashTask, argv, __doc__)


if __name__ == "__main__":
    sys.exit(main())

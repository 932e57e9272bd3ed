"""What a run trains on, and in which order.

The training examples and the held-out ones come from the config's data section (a fixed held-out split). The
order of each epoch is a pure function of the seed and the epoch number, so a checkpoint's data position
(micro-batches done) says exactly where a resumed run continues, on any number of processes that divides it.
"""

from __future__ import annotations

import random

from specheads.data.sharegpt import load_mixture
from specheads.data.models import cache_root
from specheads.data.tokenization import pad_batch, tokenize_all
from specheads.train.config import TrainSection


def build_examples(conversations, tokenizer, max_length: int, desc: str):
    """The conversations tokenised (data/tokenization.tokenize_all: through datasets.map, cached under
    <specheads cache>/tokens, so a rerun or another process of the run reads them), those with no answer token
    left out."""
    examples = tokenize_all(conversations, tokenizer, max_length, cache_root() / "tokens", desc=f"tokenising {desc}")
    return [example for example in examples if example.num_labels > 0]


def load_examples(cfg, tokenizer):
    """(training examples, held-out examples) as the config's data section describes them."""
    train_convs, heldout_convs = load_mixture(cfg.data.dataset, cfg.data.heldout_size, cfg.data.split_seed,
                                              split=cfg.data.split)
    train_convs = train_convs[: cfg.data.max_train_conversations]
    heldout_convs = heldout_convs[: cfg.data.max_heldout_eval]
    return (build_examples(train_convs, tokenizer, cfg.data.max_length, "train"),
            build_examples(heldout_convs, tokenizer, cfg.data.max_length, "held-out"))


class TooFewExamples(ValueError):
    """Fewer training examples than one batch takes."""


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
        raise TooFewExamples(f"{num_examples} training examples cannot fill one batch of {per_step} (train.batch_size "
                             f"{cfg.batch_size} x {world} process(es)): lower train.batch_size, or give data.dataset "
                             f"more conversations (data.max_length and data.heldout_size decide how many are left)")
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

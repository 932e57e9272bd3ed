"""Give trained Medusa heads a draft vocabulary: they then propose only the most frequent answer tokens.

    python scripts/draft_vocab.py --heads runs/smollm2-135m-medusa1/heads --size 8192

Heads trained over the whole vocabulary (heads.draft_vocab_size: 0) project every decode step through the
full lm_head once per head: on SmolLM2 that is 49k rows per head, ~10% of a step. Restricted to the `size`
most frequent assistant tokens of their own training data (the run's train_config.json, or --config) they
propose the same tokens wherever the best one is inside that vocabulary, at a fraction of the cost; output
is unchanged because the base verifies every draft. Prints how much of the held-out answers the vocabulary
covers. The heads folder is replaced as a whole (other files in it are kept), so an interruption leaves
either the old heads or the new. Medusa-2 heads (with a LoRA adapter) are refused: their training refuses
a draft vocabulary too.
Run build_tree.py afterwards: the heads' cost, and so the best tree, changed.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import torch

from specheads.data.models import load_tokenizer
from specheads.data.tokenization import IGNORE_INDEX, frequent_tokens
from specheads.heads.joint import adapter_of
from specheads.heads.loading import load_medusa_heads
from specheads.train.config import load_config
from specheads.train.data_order import load_examples
from specheads.train.medusa import MedusaTrainConfig


def coverage(examples, token_ids: torch.Tensor) -> float:
    """Fraction of the examples' assistant tokens that are in `token_ids`."""
    inside = total = 0
    allowed = set(token_ids.tolist())
    for example in examples:
        labels = [label for label in example.labels if label != IGNORE_INDEX]
        inside += sum(label in allowed for label in labels)
        total += len(labels)
    return inside / max(total, 1)


def replace_folder(new: Path, target: Path) -> None:
    """Move `new` into `target`'s place; the old folder is kept aside until the new one is in place."""
    old = target.with_name(target.name + ".replaced")
    shutil.rmtree(old, ignore_errors=True)
    target.rename(old)
    new.rename(target)
    shutil.rmtree(old)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--heads", required=True, help="a heads folder written by train/medusa.py")
    parser.add_argument("--size", type=int, required=True, help="tokens in the draft vocabulary")
    parser.add_argument("--config", default=None, help="the training config (default: the run's train_config.json)")
    args = parser.parse_args(argv)
    heads_dir = Path(args.heads)
    config_path = Path(args.config) if args.config else heads_dir.parent / "train_config.json"
    if adapter_of(heads_dir) is not None:
        raise SystemExit(f"{heads_dir}: Medusa-2 heads (with a LoRA adapter) cannot take a draft vocabulary")
    heads = load_medusa_heads(heads_dir)
    if heads.config.draft_vocab_size:
        if heads.config.draft_vocab_size != args.size:
            raise SystemExit(f"{heads_dir}: the heads already have a draft vocabulary of "
                             f"{heads.config.draft_vocab_size} tokens (asked for {args.size})")
        print(f"{heads_dir}: already a draft vocabulary of {args.size} tokens")
        return {"size": args.size, "changed": False}
    if not 0 < args.size <= heads.config.vocab_size:
        parser.error(f"--size must be in 1..{heads.config.vocab_size} (the vocabulary), got {args.size}")
    if not config_path.is_file():
        raise SystemExit(f"{config_path} not found: pass --config, the config the heads were trained with")
    cfg = load_config(MedusaTrainConfig, config_path)
    train, heldout = load_examples(cfg, load_tokenizer(cfg.model.name))
    token_ids = frequent_tokens(train, heads.config.vocab_size, args.size)
    covered = coverage(heldout, token_ids)
    restricted = heads.with_draft_vocabulary(token_ids)
    staging = heads_dir.with_name(heads_dir.name + ".staging")
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(heads_dir, staging)  # keeps a model card or any other file next to the heads
    restricted.save_pretrained(staging, extra={**restricted.metadata, "draft_vocab_heldout_coverage": covered})
    replace_folder(staging, heads_dir)
    print(f"{heads_dir}: draft vocabulary of the {args.size} most frequent answer tokens of {len(train)} training "
          f"conversations; it covers {covered:.1%} of the held-out answer tokens")
    return {"size": args.size, "changed": True, "heldout_coverage": covered}


if __name__ == "__main__":
    main()

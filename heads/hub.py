"""Publish a heads folder on the Hugging Face Hub with a generated model card.

The upload is staged: the heads' config.json and model.safetensors plus the card go into a
folder, and that folder is what `upload_folder` sends. A dry run writes the same staging folder
where asked and stops, so it shows exactly what would be uploaded. The heads folder is only read:
a failed upload (no network, offline mode, bad token) leaves every local file as it was.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from .export import prepare_out_dir
from .medusa import CONFIG_NAME, WEIGHTS_NAME, MedusaHeads
from .model_card import render_model_card

UPLOADED_FILES = (CONFIG_NAME, WEIGHTS_NAME)  # plus the generated README.md
DEFAULT_COMMIT_MESSAGE = "Upload Medusa heads (specheads)"


class HubUploadError(RuntimeError):
    """The Hub could not be reached or refused the upload; nothing local was changed."""


def hub_endpoint() -> str:
    """HF_ENDPOINT as set now (huggingface_hub reads it once, at import)."""
    from huggingface_hub import constants

    return (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")


def hub_offline() -> bool:
    from huggingface_hub import constants

    return constants.HF_HUB_OFFLINE or os.environ.get("HF_HUB_OFFLINE", "").upper() in {"1", "ON", "YES", "TRUE"}


def stage(heads_dir: Path, target: Path, card: str, link: bool) -> list[Path]:
    """Put the files to upload into `target`: hard links (or copies) of the heads' files, and README.md."""
    staged = []
    for name in UPLOADED_FILES:
        source, dest = heads_dir / name, target / name
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


def push_to_hub(heads_dir: str | Path, repo_id: str, private: bool = False, revision: str | None = None,
                token: str | None = None, dry_run_dir: str | Path | None = None,
                commit_message: str = DEFAULT_COMMIT_MESSAGE, train_config: str | Path | None = None,
                bench_results: str | Path | None = None) -> str:
    """Upload `heads_dir` (specheads format) and its model card to `repo_id`; returns the commit URL.

    With `dry_run_dir`, write the files that would be uploaded there instead and return that folder.
    `train_config` / `bench_results` default to the run's files next to the heads (see model_card)."""
    heads_dir = Path(heads_dir)
    MedusaHeads.read_config(heads_dir)  # our format only: foreign folders go through scripts/export.py first
    MedusaHeads.from_pretrained(heads_dir)  # never publish weights that do not load
    card = render_model_card(heads_dir, repo_id=repo_id, train_config=train_config, bench_results=bench_results)
    if dry_run_dir is not None:
        out = prepare_out_dir(dry_run_dir, heads_dir)
        stage(heads_dir, out, card, link=False)
        return str(out)

    endpoint = hub_endpoint()
    where = f"{repo_id} on {endpoint}"
    if hub_offline():
        raise HubUploadError(f"cannot push {heads_dir} to {where}: HF_HUB_OFFLINE is set. Nothing was uploaded "
                             f"and no local file changed; `--dry-run DIR` writes the files that would be uploaded")
    from huggingface_hub import HfApi

    api = HfApi(endpoint=endpoint, token=token)
    with tempfile.TemporaryDirectory(prefix="specheads-upload-") as staging:
        stage(heads_dir, Path(staging), card, link=True)
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

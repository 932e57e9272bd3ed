"""Hub ids wherever a folder is taken (heads/remote.py), tested offline through huggingface_hub's own cache layout:
models--ORG--NAME/{blobs, refs/main, snapshots/COMMIT} with each file a link to its blob, as `snapshot_download`
writes it. No network is used: offline mode reads the cache; an unreachable Hub is a closed local port or a
socket that accepts and never answers."""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from specheads.heads import remote
from specheads.heads.remote import HubNotFoundError, HubUnreachableError, parse_hub_ref, resolve_heads

REPO = Path(__file__).resolve().parent.parent
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def cache_repo(cache: Path, repo_id: str, folder: Path, commit: str = COMMIT, tag: str | None = None) -> Path:
    """Put `folder`'s files in the cache as snapshot_download leaves them; -> the snapshot folder."""
    root = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = root / "snapshots" / commit
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        data = path.read_bytes()
        blob = root / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = snapshot / path.relative_to(folder)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (root / "refs").mkdir(parents=True, exist_ok=True)
    (root / "refs" / "main").write_text(commit)
    if tag:
        (root / "refs" / tag).write_text(commit)
    return snapshot


@pytest.fixture()
def hub_cache(tmp_path, monkeypatch):
    cache = tmp_path / "hf" / "hub"
    cache.mkdir(parents=True)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    remote._FETCHED.clear()
    remote._ask_hub.cache_clear()
    return cache


@pytest.fixture(scope="module")
def medusa_dir(tmp_path_factory, tiny_llama_dir):
    from transformers import AutoConfig

    from specheads.heads import MedusaConfig, MedusaHeads

    torch.manual_seed(0)
    heads = MedusaHeads(MedusaConfig.for_base(AutoConfig.from_pretrained(tiny_llama_dir), str(tiny_llama_dir),
                                              num_heads=2))
    path = tmp_path_factory.mktemp("medusa")
    heads.save_pretrained(path, extra={"tree": [[0], [1], [0, 0]]})
    return path


def test_ref_syntax_is_huggingface_hubs():
    assert parse_hub_ref("you/heads") == ("you/heads", None, None)
    assert parse_hub_ref("you/heads@v1") == ("you/heads", "v1", None)
    assert parse_hub_ref("you/heads@refs%2Fpr%2F1/specheads") == ("you/heads", "refs/pr/1", "specheads")
    assert parse_hub_ref("you/heads/sub/dir") == ("you/heads", None, "sub/dir")
    for not_an_id in ("heads", "/abs/path", "you/../etc", "a/b/../../c"):
        assert parse_hub_ref(not_an_id) is None, not_an_id


def test_heads_by_id_and_revision_from_the_cache_decode_as_the_folder(hub_cache, medusa_dir, tiny_llama_dir):
    from specheads.heads import load_heads
    from specheads.inference.generate import SpeculativeGenerator

    snapshot = cache_repo(hub_cache, "you/tiny-medusa", medusa_dir, tag="v1")
    assert resolve_heads("you/tiny-medusa") == snapshot
    assert resolve_heads("you/tiny-medusa@v1") == snapshot
    assert resolve_heads("you/tiny-medusa", revision=COMMIT) == snapshot
    heads = load_heads("you/tiny-medusa")
    assert heads.config.num_heads == 2
    prompt = torch.tensor([[1, 5, 9, 14, 3]])
    by_folder = SpeculativeGenerator.from_pretrained(str(tiny_llama_dir), str(medusa_dir), dtype="float32",
                                                     device="cpu", cpu_tuning=False)
    by_id = SpeculativeGenerator.from_pretrained(str(tiny_llama_dir), "you/tiny-medusa", dtype="float32",
                                                 device="cpu", cpu_tuning=False)
    first = [t for step in by_folder.stream_ids(prompt, 24) for t in step]
    assert [t for step in by_id.stream_ids(prompt, 24) for t in step] == first
    plain = by_folder.model.generate(prompt, max_new_tokens=len(first), do_sample=False)[0, prompt.shape[1]:].tolist()
    assert first == plain[:len(first)]


def test_a_pushed_repo_is_read_from_its_specheads_folder(hub_cache, medusa_dir, tmp_path):
    repo = tmp_path / "repo"
    (repo / "specheads").mkdir(parents=True)
    (repo / "config.json").write_text('{"architectures": ["MedusaModel"]}')  # the engine's export at the root
    for path in medusa_dir.iterdir():
        shutil.copy(path, repo / "specheads" / path.name)
    snapshot = cache_repo(hub_cache, "you/pushed", repo)
    assert resolve_heads("you/pushed") == snapshot / "specheads"
    assert resolve_heads(repo) == repo / "specheads"  # a local copy of such a repo, too


def test_a_local_folder_wins_and_takes_no_revision(hub_cache, medusa_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "you").mkdir()
    shutil.copytree(medusa_dir, tmp_path / "you" / "heads")
    cache_repo(hub_cache, "you/heads", tmp_path / "you" / "heads", commit="f" * 40)
    assert resolve_heads("you/heads") == Path("you/heads")
    with pytest.raises(ValueError, match="local folder"):
        resolve_heads("you/heads", revision="v1")


def test_offline_and_not_cached_names_the_id_and_a_local_folder(hub_cache):
    with pytest.raises(HubUnreachableError, match=r"you/nothing.*HF_HUB_OFFLINE.*--local-dir"):
        resolve_heads("you/nothing")
    from specheads.data.models import resolve_model

    with pytest.raises(HubUnreachableError, match=r"model 'org/base'.*--model DIR"):
        resolve_model("org/base")


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture()
def silent_hub():
    """A Hub that accepts connections and never answers (a captive network, a dead proxy): its URL."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    held, stop = [], threading.Event()

    def accept():
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                pass

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    server.close()


@pytest.mark.parametrize("hub", ["refused", "silent"])
def test_an_unreachable_hub_fails_within_seconds(hub_cache, monkeypatch, silent_hub, hub, medusa_dir):
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{closed_port()}" if hub == "refused" else silent_hub)
    monkeypatch.setenv("HF_HUB_ETAG_TIMEOUT", "3")
    start = time.monotonic()
    with pytest.raises(HubUnreachableError, match=r"'you/nothing'.*cannot be reached.*--local-dir DIR"):
        resolve_heads("you/nothing")
    assert time.monotonic() - start < 30
    # the cached copy is used when the Hub cannot answer
    snapshot = cache_repo(hub_cache, "you/cached", medusa_dir)
    with pytest.warns(UserWarning, match="using the cached you/cached"):
        assert resolve_heads("you/cached") == snapshot


def test_chat_with_an_unreachable_model_id_is_one_line(tmp_path):
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path), "HF_ENDPOINT": f"http://127.0.0.1:{closed_port()}",
           "HF_HUB_ETAG_TIMEOUT": "3", "PYTHONWARNINGS": "ignore"}
    env.pop("HF_HUB_OFFLINE", None)
    start = time.monotonic()
    done = subprocess.run([sys.executable, str(REPO / "inference" / "chat.py"), "--model", "lmsys/vicuna-7b-v1.3",
                           "--heads", "you/vicuna-7b-medusa", "--prompt", "hi"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert time.monotonic() - start < 30
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert "you/vicuna-7b-medusa" in lines[0] and "--local-dir" in lines[0]


def test_a_repo_the_hub_does_not_have_is_not_found(hub_cache, monkeypatch):
    def not_found(endpoint, repo_id, revision):
        raise HubNotFoundError(f"no repo {repo_id} on {endpoint}")

    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(remote, "_ask_hub", not_found)
    with pytest.raises(HubNotFoundError, match="you/typo"):
        resolve_heads("you/typo")

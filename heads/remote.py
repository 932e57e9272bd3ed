"""Hub ids wherever a folder is expected: `resolve_heads` for draft heads, `resolve_hub_model` for base models.

A heads argument is a local folder, or a Hub repo in huggingface_hub's own path syntax (the one `HfFileSystem` and
`hf://` URLs use): `org/name`, `org/name@revision` (a branch, tag or commit; `refs/pr/1` written `refs%2Fpr%2F1`),
optionally followed by `/subfolder`. An existing local folder always wins. A repo is fetched with
`snapshot_download` into the Hugging Face cache (HF_HOME / HF_HUB_CACHE), and offline mode (HF_HUB_OFFLINE=1)
reads the cache only.

A repo written by heads/hub.py holds the engine's export at its root (what vLLM reads by id) and specheads' own
folder in `specheads/`; both here and for a local copy of such a repo, `specheads/` is what is loaded (the tree,
EAGLE tree, fingerprint and chat template live there), and only that subfolder is downloaded.

The Hub is asked first with a short timeout (huggingface_hub's HF_HUB_ETAG_TIMEOUT, 10 s by default), because its
client waits forever on a host that accepts and never answers, and transformers retries a name it cannot resolve
for about 50 s: an id that cannot be fetched is a HubUnreachableError within seconds, naming the id and how to use
a local folder instead. When the Hub is unreachable but the cache holds the repo, the cached copy is used.
"""

from __future__ import annotations

import os
import re
import warnings
from functools import lru_cache
from pathlib import Path
from urllib.parse import unquote

from .files import CONFIG_NAME

SPECHEADS_FOLDER = "specheads"  # specheads' own folder inside a pushed repo (its root: the engine's export)
# org/name, then @revision, then /subfolder (huggingface_hub's HfFileSystem path syntax)
HUB_REF = re.compile(r"(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?:@(?P<revision>[^/]+))?(?:/(?P<subfolder>.+))?")


class HubUnreachableError(FileNotFoundError):
    """A Hub id could not be fetched (no network, a Hub that does not answer, or offline mode) and the Hugging Face
    cache does not hold it. A FileNotFoundError: what was asked for is not here, and command lines say so."""


class HubNotFoundError(FileNotFoundError):
    """Neither a local folder nor a repo (or revision) the Hub has, or one this token may not read."""


def hub_endpoint() -> str:
    """HF_ENDPOINT as set now (huggingface_hub reads it once, at import)."""
    from huggingface_hub import constants

    return (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")


def hub_offline() -> bool:
    from huggingface_hub import constants

    return constants.HF_HUB_OFFLINE or os.environ.get("HF_HUB_OFFLINE", "").upper() in {"1", "ON", "YES", "TRUE"}


def hub_cache() -> Path:
    """The Hugging Face cache as set now (HF_HUB_CACHE, else HF_HOME/hub, else huggingface_hub's default)."""
    from huggingface_hub import constants

    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]) / "hub"
    return Path(constants.HF_HUB_CACHE)


def probe_timeout() -> float:
    """Seconds to wait for the Hub's first answer: huggingface_hub's HF_HUB_ETAG_TIMEOUT (default 10)."""
    from huggingface_hub import constants

    try:
        return float(os.environ.get("HF_HUB_ETAG_TIMEOUT") or constants.HF_HUB_ETAG_TIMEOUT)
    except ValueError:
        return float(constants.DEFAULT_ETAG_TIMEOUT)


def parse_hub_ref(name: str) -> tuple[str, str | None, str | None] | None:
    """(repo id, revision, subfolder) of `org/name[@revision][/subfolder]`; None for anything else."""
    match = HUB_REF.fullmatch(str(name))
    if match is None or ".." in match["repo"] or (match["subfolder"] and ".." in match["subfolder"].split("/")):
        return None
    revision = unquote(match["revision"]) if match["revision"] else None
    return match["repo"], revision, match["subfolder"].strip("/") if match["subfolder"] else None


def _local_hint(repo_id: str, option: str) -> str:
    return (f"to use a local folder instead, download it where the Hub is reachable (`hf download {repo_id} "
            f"--local-dir DIR`) and pass {option} DIR")


@lru_cache(maxsize=64)
def _ask_hub(endpoint: str, repo_id: str, revision: str | None) -> tuple[str | None, str]:
    """(the commit `revision` points to, "") when the Hub answers; (None, why) when it cannot be reached. A repo or
    revision the Hub does not have is a HubNotFoundError. Asked once per process."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError

    try:
        info = HfApi(endpoint=endpoint).repo_info(repo_id, revision=revision, timeout=probe_timeout())
    except RevisionNotFoundError as err:
        raise HubNotFoundError(f"{repo_id} on {endpoint} has no revision {revision!r}") from err
    except RepositoryNotFoundError as err:
        raise HubNotFoundError(f"no repo {repo_id} on {endpoint} (or it is private or gated: log in with `hf auth "
                               f"login` or set HF_TOKEN)") from err
    except HfHubHTTPError as err:
        status = getattr(getattr(err, "response", None), "status_code", None)
        if status is not None and status < 500:
            raise HubNotFoundError(f"{repo_id} on {endpoint}: HTTP {status}") from err
        return None, f"the Hub answered HTTP {status}"
    except Exception as err:  # connection refused, DNS, timeouts, proxies: the Hub is not reachable from here
        return None, f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
    return info.sha, ""


def _cached_snapshot(repo_id: str, revision: str | None) -> Path | None:
    """The cached snapshot of `revision` (default main), as huggingface_hub reads it offline; None if absent."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(snapshot_download(repo_id, revision=revision, cache_dir=hub_cache(), local_files_only=True))
    except (LocalEntryNotFoundError, FileNotFoundError, OSError, ValueError):
        return None


def _unreachable(what: str, name: str, repo_id: str, option: str, why: str) -> HubUnreachableError:
    if why == "offline":
        reason = "HF_HUB_OFFLINE is set"
    else:
        reason = f"the Hub ({hub_endpoint()}) cannot be reached: {why}"
    return HubUnreachableError(f"cannot fetch {what} {name!r}: {reason}, and the Hugging Face cache "
                               f"({hub_cache()}) does not hold it; {_local_hint(repo_id, option)}")


def _snapshot(name: str, repo_id: str, revision: str | None, subfolder: str | None, option: str) -> Path:
    """The folder of `repo_id` at `revision` in the cache, fetched where needed: only `subfolder/*` when given,
    else only specheads/ when the repo has it, else the whole repo."""
    from huggingface_hub import snapshot_download

    where = f"{repo_id}@{revision}" if revision else repo_id
    if hub_offline():
        cached = _cached_snapshot(repo_id, revision)
        if cached is None:
            raise _unreachable("heads", name, repo_id, option, "offline")
        return cached
    sha, why = _ask_hub(hub_endpoint(), repo_id, revision)
    if sha is None:
        cached = _cached_snapshot(repo_id, revision)
        if cached is None:
            raise _unreachable("heads", name, repo_id, option, why)
        warnings.warn(f"the Hub cannot be reached ({why}): using the cached {where} ({cached})", stacklevel=3)
        return cached
    from huggingface_hub import constants

    options = dict(repo_id=repo_id, revision=revision, cache_dir=hub_cache(), endpoint=hub_endpoint(),
                   etag_timeout=probe_timeout() or constants.DEFAULT_ETAG_TIMEOUT)
    try:
        patterns = [f"{subfolder}/*"] if subfolder else [f"{SPECHEADS_FOLDER}/*"]
        root = Path(snapshot_download(allow_patterns=patterns, **options))
        if subfolder or (root / SPECHEADS_FOLDER / CONFIG_NAME).is_file():
            return root
        return Path(snapshot_download(**options))
    except Exception as err:  # the Hub answered, then failed mid-download
        raise HubUnreachableError(f"cannot fetch heads {name!r} from {hub_endpoint()}: {type(err).__name__}: {err}; "
                                  f"{_local_hint(repo_id, option)}") from err


_FETCHED: dict[tuple, Path] = {}


def own_folder(path: Path) -> Path:
    """A pushed repo's specheads/ subfolder when `path` has one, else `path`."""
    inner = path / SPECHEADS_FOLDER
    return inner if (inner / CONFIG_NAME).is_file() else path


def resolve_heads(name_or_path: str | Path, revision: str | None = None, option: str = "--heads") -> Path:
    """The local folder of a heads argument: an existing folder as it is (a pushed repo's copy: its specheads/),
    else a Hub id `org/name[@revision][/subfolder]` fetched into the Hugging Face cache (`revision` here is the same
    as `@revision` there). Anything else comes back as a Path, for the loader to name what is missing.

    Errors: HubUnreachableError (no Hub, or offline, and not cached), HubNotFoundError (no such repo or revision);
    both FileNotFoundErrors naming the id and, for the first, how to use a local folder (`option`: the flag)."""
    path = Path(name_or_path)
    if path.is_dir():
        if revision is not None:
            raise ValueError(f"{path} is a local folder: a revision ({revision!r}) applies to Hub ids only")
        return own_folder(path)
    ref = parse_hub_ref(str(name_or_path)) if not path.is_absolute() else None
    if ref is None or path.exists():
        return path
    repo_id, in_name, subfolder = ref
    if revision is not None and in_name is not None and revision != in_name:
        raise ValueError(f"{name_or_path}: names revision {in_name!r} and revision={revision!r} was passed too")
    revision = revision or in_name
    key = (repo_id, revision, subfolder, hub_endpoint(), hub_offline(), str(hub_cache()))
    if key in _FETCHED and _FETCHED[key].is_dir():  # one fetch per process: every loader of a command asks
        return _FETCHED[key]
    root = _snapshot(str(name_or_path), repo_id, revision, subfolder, option)
    folder = root / subfolder if subfolder else root
    if not folder.is_dir():
        raise HubNotFoundError(f"{name_or_path}: {repo_id} has no folder {subfolder!r}")
    _FETCHED[key] = own_folder(folder)
    return _FETCHED[key]


def resolve_hub_model(name: str) -> str:
    """A base model's name for `from_pretrained`: a local path, or anything that is not `org/name`, as it is; a Hub
    id checked within seconds (HubUnreachableError / HubNotFoundError otherwise), or, when the Hub cannot be
    reached but the cache holds the model, its cached snapshot folder."""
    if Path(name).exists() or HUB_REF.fullmatch(name) is None or "@" in name or name.count("/") != 1:
        return name
    if hub_offline():
        if _cached_snapshot(name, None) is None:
            raise _unreachable("model", name, name, "--model", "offline")
        return name
    sha, why = _ask_hub(hub_endpoint(), name, None)
    if sha is not None:
        return name
    cached = _cached_snapshot(name, None)
    if cached is None:
        raise _unreachable("model", name, name, "--model", why)
    warnings.warn(f"the Hub cannot be reached ({why}): using the cached {name} ({cached})", stacklevel=3)
    return str(cached)

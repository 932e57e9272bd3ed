"""External formats of draft heads: the layouts the serving engines and other projects load, both directions.

One module per format (or per engine loader family), each holding its export and its import:

| format            | module             | holds                  | read by                              |
|-------------------|--------------------|------------------------|--------------------------------------|
| `vllm-medusa`     | vllm_medusa.py     | Medusa heads           | vLLM <= 0.32 (`method: medusa`)      |
| `faster-decoding` | faster_decoding.py | Medusa heads           | FasterDecoding/Medusa v0.1, TGI      |
| `vllm-eagle`      | vllm_eagle.py      | EAGLE-1 draft          | vLLM (`method: eagle`)               |
| `vllm-eagle3`     | speculators.py     | EAGLE-3 draft          | vLLM (`method: eagle3`), speculators |
| `sglang-eagle`    | sglang.py          | EAGLE-1 draft          | SGLang (`EAGLE`)                     |
| `sglang-eagle3`   | sglang.py          | EAGLE-3 draft          | SGLang (`EAGLE3`)                    |
| `vllm-dflash`     | vllm_dflash.py     | DFlash block drafter   | vLLM (`method: dflash`)              |
| `merged`          | merged.py          | Medusa-2 base + heads  | anything that loads an HF model      |
| `eagle-repo`      | eagle_repo.py      | EAGLE-1 draft (read)   | the EAGLE authors' code (yuhuili/EAGLE-*)  |
| `eagle3-repo`     | eagle_repo.py      | EAGLE-3 draft (read)   | the EAGLE authors' code (yuhuili/EAGLE3-*) |

Published drafts import through these readers too (docs/formats.md): FasterDecoding's medusa_lm_head.pt, the EAGLE
authors' pytorch_model.bin folders (eagle_repo), SpecForge's LlamaForCausalLMEagle3 output (sglang-eagle3),
speculators' eagle3 folders (vllm-eagle3) and z-lab's DFlash drafters (vllm-dflash). A format with `WRITES = False`
is read only: heads.export.EXPORTS leaves it out.

`FORMATS` is the registry; every entry satisfies `Format`. The models (heads/medusa.py, heads/eagle.py) never
import this package; heads/loading.py and heads/export.py are its users.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol, runtime_checkable

from . import eagle_repo, faster_decoding, merged, sglang, speculators, vllm_dflash, vllm_eagle, vllm_medusa


@runtime_checkable
class Format(Protocol):
    """An external format: a name, the kind of draft it carries ("medusa", "eagle1", "eagle3", "dflash"), how to recognise
    its config.json, how to write a specheads folder as it, and how to read it back (None: not readable)."""

    NAME: str
    KIND: str

    def detect(self, raw: dict) -> bool: ...

    def export(self, heads_dir: str | Path, out_dir: str | Path, *, model: str | None = None,
               overwrite: bool = False) -> Path: ...


class _Module:
    """A format written as a module of functions (NAME, KIND, detect, export, load)."""

    def __init__(self, module):
        self.NAME, self.KIND = module.NAME, module.KIND
        self.detect, self.export = module.detect, module.export
        self.load = getattr(module, "load", None)


FORMATS: dict[str, Format] = {
    fmt.NAME: fmt for fmt in (
        _Module(vllm_medusa), _Module(faster_decoding), *eagle_repo.FORMATS, vllm_eagle.FORMAT, speculators.FORMAT,
        *sglang.FORMATS, _Module(merged), _Module(vllm_dflash))}
# EAGLE format -> the draft variant it carries
EAGLE_FORMATS = {name: fmt.KIND for name, fmt in FORMATS.items() if fmt.KIND.startswith("eagle")}


def detect(raw: dict) -> str | None:
    """The format whose config.json `raw` is (None: none of them)."""
    for name, fmt in FORMATS.items():
        if fmt.detect(raw):
            return name
    return None


__all__ = ["EAGLE_FORMATS", "FORMATS", "Format", "detect"]

"""The house is layered (tests/test_heads_layout.py does the same inside heads/): a module imports only from its
own layer or the ones below, lazy imports inside functions included.

    heads' file primitives (atomic writes, safe loading, fingerprints, Hub ids)   0
    data/      conversations, tokenisation, models, self-distillation          1
    heads/     the draft modules, formats, loading, export, serving, Hub       2
    inference/ the decoder, methods, engines, the benchmark                    3
    train/     the trainers                                                    4
    scripts/   command lines                                                   5
"""

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = {"data": 1, "heads": 2, "inference": 3, "train": 4, "scripts": 5}
PRIMITIVES = {"heads.files", "heads.remote", "heads.weights", "heads.fingerprint"}  # layer 0


def layer(module: str) -> int:
    """module: 'heads.files', 'data.distill', ... (without the specheads prefix)."""
    if any(module == p or module.startswith(p + ".") for p in PRIMITIVES):
        return 0
    return PACKAGES[module.split(".")[0]]


def imports(path: Path, package: tuple) -> list[tuple[int, str]]:
    """(line, module) of every specheads import in `path` (a module of `package`, e.g. ('heads', 'formats')),
    absolute or relative, anywhere in the file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(["specheads", *package[:len(package) - node.level + 1]])
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module
            names = [module] + [f"{module}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            parts = (name or "").split(".")
            if parts[0] == "specheads" and len(parts) > 1 and parts[1] in PACKAGES:
                found.append((node.lineno, ".".join(parts[1:])))
    return found


def upward(path: Path, own: str) -> list[str]:
    """The imports of module `own` (at `path`) from a layer above its own."""
    mine = layer(own)
    return [f"line {line}: {module} (layer {layer(module)})" for line, module in imports(path, tuple(own.split(".")[:-1]))
            if layer(module) > mine]


MODULES = sorted(p for top in PACKAGES for p in (REPO / top).rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(REPO)))
def test_no_import_reaches_up_a_layer(path):
    own = ".".join(path.relative_to(REPO).with_suffix("").parts)
    found = upward(path, own)
    assert not found, f"{own} (layer {layer(own)}) imports from above: {found}"


def test_the_check_sees_an_upward_import(tmp_path):
    """A test that cannot fail is a defect: data/ importing the decoder is caught, lazily inside a function too, and
    a file primitive importing a draft module by a relative import."""
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    from specheads.inference.decoder import TreeDecoder\n")
    assert upward(probe, "data.probe") == ["line 2: inference.decoder (layer 3)",
                                           "line 2: inference.decoder.TreeDecoder (layer 3)"]
    probe.write_text("from .medusa import MedusaHeads\n")
    assert upward(probe, "heads.files")[0] == "line 1: heads.medusa (layer 2)"
    assert upward(probe, "heads.export") == []

"""heads/ is layered: files and weights, then the models, then the external formats, then loading/export, then
serving and publishing. A module imports only from its own layer or the ones below (lazy imports inside functions
count too), and no import cycle exists among heads' modules: a model never imports a format or the Hub."""

import ast
from pathlib import Path

import pytest

HEADS = Path(__file__).resolve().parents[1] / "heads"
LAYERS = {
    "files": 0, "weights": 0, "fingerprint": 0, "remote": 0, "module": 0,
    "medusa": 1, "eagle": 1, "dflash": 1, "joint": 1,
    "formats": 2, "kinds": 2,
    "loading": 3, "export": 3,
    "serving": 4, "model_card": 4, "hub": 4, "__init__": 4,
}


def module_name(path: Path) -> str:
    """heads/formats/sglang.py -> formats.sglang; heads/medusa.py -> medusa."""
    parts = path.relative_to(HEADS).with_suffix("").parts
    return ".".join(p for p in parts if p != "__init__") or "__init__"


def layer(name: str) -> int:
    return LAYERS[name.split(".")[0]]


def heads_imports(path: Path) -> set[str]:
    """The heads modules `path` imports, anywhere in it (module level or inside a function)."""
    package = module_name(path).split(".")[:-1] if path.name != "__init__.py" else module_name(path).split(".")
    if path.name == "__init__.py" and path.parent == HEADS:
        package = []
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            base = package[:len(package) - (node.level - 1)] if node.level > 1 else package
            target = base + (node.module.split(".") if node.module else [])
        elif (node.module or "").startswith("specheads.heads"):
            target = node.module.split(".")[2:]
        else:
            continue
        if not target:  # `from . import x` / `from specheads.heads import x`: the names are modules or the package
            target = ["__init__"] if not package else package
            names = [a.name for a in node.names if (HEADS.joinpath(*package, a.name + ".py")).exists()]
            found.update(".".join(package + [n]) for n in names)
            if names:
                continue
        found.add(".".join(target))
    return found


MODULES = {module_name(p): p for p in sorted(HEADS.rglob("*.py"))}


@pytest.mark.parametrize("name", sorted(MODULES))
def test_imports_go_down_the_layers(name):
    upward = sorted(t for t in heads_imports(MODULES[name]) if layer(t) > layer(name))
    assert not upward, f"heads/{name} imports {upward}, which sit above it"


def test_no_import_cycle():
    graph = {name: {t for t in heads_imports(path) if t in MODULES and t != name} for name, path in MODULES.items()}
    done, on_path = set(), []

    def visit(node):
        if node in on_path:
            raise AssertionError("import cycle: " + " -> ".join(on_path[on_path.index(node):] + [node]))
        if node in done:
            return
        on_path.append(node)
        for nxt in graph[node]:
            visit(nxt)
        on_path.pop()
        done.add(node)

    for node in graph:
        visit(node)


def test_the_check_sees_a_lazy_upward_import(tmp_path, monkeypatch):
    """The checker itself: a model importing the Hub inside a method is caught."""
    fake = tmp_path / "medusa.py"
    fake.write_text("def push(self):\n    from .hub import push_to_hub\n")
    monkeypatch.setattr(f"{__name__}.HEADS", tmp_path)
    assert heads_imports(fake) == {"hub"} and layer("hub") > layer("medusa")

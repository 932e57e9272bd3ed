"""heads/kinds.py is the one place a draft's kind is decided: every kind is complete (a decoding method, a chain for
the engine tests, an engine format, a model card, a loader), and nothing else in the package dispatches on the draft
classes with isinstance."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from specheads.heads.export import EXPORTS
from specheads.heads.kinds import DRAFT_MODULES, KINDS, kind_of
from specheads.heads.loading import OWN
from specheads.heads.model_card import DESCRIPTIONS
from specheads.heads.serving import VLLM_METHODS
from specheads.inference.methods import METHODS

REPO = Path(__file__).resolve().parents[1]
PACKAGE = ["heads", "inference", "train", "data", "scripts"]
DRAFT_CLASSES = {module.__name__ for module in DRAFT_MODULES}


@pytest.mark.parametrize("name", sorted(KINDS))
def test_every_kind_is_complete(name):
    kind = KINDS[name]
    assert kind.method in METHODS and METHODS[kind.method].draft == name, "its decoding method drafts with it"
    assert f"{kind.method}_pld" in METHODS, "and has a prompt-lookup variant"
    assert kind.chain in ("static", "dynamic") and (kind.chain == "dynamic") == (kind.chain_limit is None)
    assert kind.vllm_format in EXPORTS and kind.vllm_format in VLLM_METHODS, "an engine serves it"
    assert name in DESCRIPTIONS, "a model card describes it"
    assert OWN[kind.model_type] is kind.module, "its folders load"
    assert kind.trained_with.startswith("`train/")


def test_kind_of_tells_the_eagle_variants_apart_and_refuses_anything_else(tiny_llama_dir):
    from transformers import AutoConfig

    from specheads.heads import EagleConfig, EagleDraft, MedusaConfig, MedusaHeads

    base = AutoConfig.from_pretrained(tiny_llama_dir)
    assert kind_of(MedusaHeads(MedusaConfig.for_base(base, "tiny", num_heads=2))).name == "medusa"
    for variant in ("eagle1", "eagle3"):
        assert kind_of(EagleDraft(EagleConfig.for_base(base, "tiny", variant=variant))).name == variant
    with pytest.raises(TypeError, match="not a draft: str"):
        kind_of("heads")


def isinstance_dispatch(path: Path) -> list[int]:
    """Lines of `isinstance(x, DraftClass)` calls (or a tuple of them) in a file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance" and len(node.args) == 2:
            classes = node.args[1].elts if isinstance(node.args[1], ast.Tuple) else [node.args[1]]
            names = {getattr(c, "id", getattr(c, "attr", None)) for c in classes}
            if names & DRAFT_CLASSES:
                found.append(node.lineno)
    return found


def test_no_isinstance_dispatch_on_draft_classes_outside_kinds():
    found = [f"{path.relative_to(REPO)}:{line}" for folder in PACKAGE for path in sorted((REPO / folder).rglob("*.py"))
             if path.name != "kinds.py" for line in isinstance_dispatch(path)]
    assert found == [], "ask heads.kinds (kind_of, is_draft) instead: " + ", ".join(found)


def test_the_scan_finds_a_dispatch(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("def f(d):\n    return isinstance(d, (int, heads.EagleDraft))\n")
    assert isinstance_dispatch(sample) == [2]

"""A plain `pip install .` installs what pyproject.toml lists: every package folder must be listed there."""

import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_every_package_folder_is_listed():
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    found = set()
    for name, folder in config["package-dir"].items():
        for init in (REPO / folder).rglob("__init__.py"):
            relative = init.parent.relative_to(REPO / folder)
            found.add(".".join([name, *relative.parts]))
    assert found - listed == set(), f"package folders missing from pyproject.toml's packages: {sorted(found - listed)}"

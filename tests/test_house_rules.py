"""The house rules that a reviewer would otherwise check by hand (docs/architecture.md)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import megatron_ext
from tests.conftest import REPO

pytestmark = pytest.mark.unit

PACKAGE = REPO / "megatron_ext"
MAX_LINES = 700


def test_no_module_is_over_700_lines() -> None:
    """A module past this length holds more than one idea: split it along a seam, named for what each holds."""
    long = {
        str(path.relative_to(REPO)): n
        for path in sorted(PACKAGE.rglob("*.py"))
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert not long, f"modules over {MAX_LINES} lines: {long}"


def test_every_subpackage_is_a_package_with_a_docstring_and_the_map_names_it() -> None:
    subpackages = sorted(p.name for p in PACKAGE.iterdir() if p.is_dir() and any(p.glob("*.py")))
    architecture = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    for name in subpackages:
        init = PACKAGE / name / "__init__.py"
        assert init.is_file(), f"megatron_ext/{name}/ has no __init__.py"
        assert ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))), f"megatron_ext/{name}: no docstring"
        assert f"``{name}``" in (megatron_ext.__doc__ or ""), f"the package docstring does not describe {name}/"
        assert f"`megatron_ext/{name}/`" in architecture, f"docs/architecture.md does not place {name}/ on a floor"


def test_the_floors_in_the_map_are_the_checked_ones() -> None:
    """docs/architecture.md shows the layers contract that the gates run (pyproject.toml [tool.importlinter])."""
    import tomllib

    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    layers = next(c["layers"] for c in contracts if c["type"] == "layers")
    architecture = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    for floor in layers:
        names = [n.strip().removeprefix("megatron_ext.") for n in floor.split("|")]
        assert all(f"megatron_ext/{n}" in architecture for n in names), (
            f"docs/architecture.md does not list floor {floor}"
        )
    assert Path(REPO / "scripts" / "test.sh").read_text().count("lint-imports") == 1

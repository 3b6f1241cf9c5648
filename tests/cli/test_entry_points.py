"""The tools as users call them: Megatron-LM's tools/*.py paths and this package's console scripts."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.waits import QUICK_S

pytestmark = pytest.mark.unit

SCRIPTS: dict[str, str] = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]


def test_every_console_script_names_a_main_and_has_a_tools_path() -> None:
    imported = (re.search(r"^from (\S+) import main$", p.read_text(), re.M) for p in (REPO / "tools").glob("*.py"))
    shims = {found[1] for found in imported if found}
    for name, target in SCRIPTS.items():
        module, function = target.split(":")
        assert callable(getattr(importlib.import_module(module), function)), name
        assert module in shims, f"{name}: no tools/*.py shim (Megatron-LM's path) imports {module}"


def test_a_console_script_runs_after_setup() -> None:
    """scripts/setup.sh installs the package (pip install -e .): its scripts sit beside the interpreter."""
    script = Path(sys.executable).parent / "mcore-layout"
    if not script.exists():
        pytest.skip("the package is not installed in this interpreter (bash scripts/setup.sh installs it)")
    proc = subprocess.run(
        [str(script), "--gpus", "8", "--model", "gpt3-126m", "--json"], capture_output=True, text=True, timeout=QUICK_S
    )
    assert proc.returncode == 0, proc.stderr
    assert '"fitting_layouts"' in proc.stdout

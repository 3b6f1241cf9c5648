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


def error_prints(source: str) -> list[int]:
    """Lines of ``source`` that print a refusal themselves (``print("error: …")``, ``print(f"checkpoint error: …")``)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (
            isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print" and node.args
        ):
            continue
        first = node.args[0]
        while isinstance(first, ast.BinOp):  # "error: " + ...
            first = first.left
        head = first.values[0] if isinstance(first, ast.JoinedStr) and first.values else first
        if isinstance(head, ast.Constant) and isinstance(head.value, str) and "error: " in head.value.split("\n")[0]:
            found.append(node.lineno)
    return found


def test_the_error_print_finder_finds_them() -> None:
    source = (
        'print(f"error: {exc}", file=err)\n'
        'print("note: x")\n'
        'print(f"[recipe] error: {exc}")\n'
        'print("x", "error: y")\n'
        'print("error: " + "; ".join(missing))\n'
    )
    assert error_prints(source) == [1, 3, 5]


def test_every_refusal_is_said_by_fail() -> None:
    """A command that stops says why in one way: ``return fail(message, ExitCode.X)`` (``config/exit_codes.py``),
    not a ``print("error: …")`` of its own beside a ``return``."""
    own = [
        f"{path.relative_to(REPO)}:{line}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path != PACKAGE / "config" / "exit_codes.py"
        for line in error_prints(path.read_text(encoding="utf-8"))
    ]
    assert not own, "error lines printed outside exit_codes.fail: " + ", ".join(own)


TESTS = REPO / "tests"
SUBPROCESS_WAITS = frozenset({"run", "check_output", "check_call", "call"})
"""``subprocess`` functions that wait for the command to end."""
METHOD_WAITS = frozenset({"wait", "communicate", "wait_procs"})
"""Waits on anything: ``Popen.wait``/``.communicate``, ``psutil.Process.wait``, ``psutil.wait_procs``."""


def unbounded_waits(source: str) -> list[tuple[int, str]]:
    """(line, call) of each wait in ``source`` that has no ``timeout=`` keyword."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        name, owner = node.func.attr, node.func.value
        is_wait = name in METHOD_WAITS or (
            name in SUBPROCESS_WAITS and isinstance(owner, ast.Name) and owner.id == "subprocess"
        )
        if is_wait and not any(k.arg == "timeout" for k in node.keywords):
            found.append((node.lineno, f"{ast.unparse(node.func)}(...)"))
    return sorted(found)


def test_the_unbounded_wait_finder_finds_them() -> None:
    source = (
        "subprocess.run(cmd, check=True)\n"
        "subprocess.run(\n    cmd,\n    capture_output=True,\n    timeout=QUICK_S,\n)\n"
        "out = subprocess.check_output(cmd)\n"
        "proc.wait()\n"
        "ranks[0].wait(timeout=STOP_S)\n"
        "proc.communicate(input)\n"
        "psutil.wait_procs(procs)\n"
        "waits.run(cmd, timeout=RUN_S)\n"
        "runner.run(cmd)\n"
    )
    assert unbounded_waits(source) == [
        (1, "subprocess.run(...)"),
        (7, "subprocess.check_output(...)"),
        (8, "proc.wait(...)"),
        (10, "proc.communicate(...)"),
        (11, "psutil.wait_procs(...)"),
    ]


def test_every_wait_in_the_tests_is_bounded() -> None:
    """A test on a busy machine may be slow, never stuck: every subprocess call, ``.wait`` and ``.communicate``
    in tests/ names its ``timeout=``, one of tests/waits.py's bounds (a command killed at its bound fails the
    test with what it waited for, instead of hanging the suite)."""
    unbounded = [
        f"{path.relative_to(REPO)}:{line}: {call}"
        for path in sorted(TESTS.rglob("*.py"))
        for line, call in unbounded_waits(path.read_text(encoding="utf-8"))
    ]
    assert not unbounded, "waits without timeout= (bound them with a constant of tests/waits.py):\n" + "\n".join(
        unbounded
    )

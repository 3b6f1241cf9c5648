"""tools/*.py, Megatron-LM's paths: each is one way into a console script, and nothing in tools/ or bench/ edits sys.path.

Every shim has one form (a docstring naming its console script, the import of that script's ``main``, and
``raise SystemExit(main())``), so ``python tools/X.py`` and ``mcore-X`` are the same program. They find
``megatron_ext`` as an installed package (``pip install -e .`` in scripts/setup.sh), so they are run here
with no PYTHONPATH and from a directory outside the repository.
"""

from __future__ import annotations

import ast
import importlib.metadata
import os
import re
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.waits import RUN_S, STOP_S

pytestmark = pytest.mark.unit

TOOLS = sorted((REPO / "tools").glob("*.py"))
SCRIPTS: dict[str, str] = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
"""Console script name → ``module:function``."""

NOT_SHIMS = {
    "record_schedule.py": "trains with the checkout's pretrain_gpt.py (a script, loaded from its path) under "
    "torchrun and records each rank's pipeline order for plot_schedule.py --trace; no megatron_ext.cli module",
}
"""tools/*.py that are not shims of a console script, and why."""

HELP_ARGS = {"record_schedule.py": ["--schedule-trace", "trace"]}
"""What a tool needs before ``--help`` (record_schedule.py passes ``--help`` on to pretrain_gpt.py's parser)."""

SHIM_GUARD = ast.unparse(ast.parse('if __name__ == "__main__":\n    raise SystemExit(main())'))
SYS_PATH_EDIT = re.compile(r"sys\.path\s*(\.\s*(insert|append|extend|remove)\s*\(|\+?=|\[[^\]]*\]\s*=)")


@dataclass
class Help:
    returncode: int | None  # None: still running at the deadline, RUN_S after the start (then killed)
    stdout: str
    stderr: str
    cwd: Path  # an empty directory of its own

    def report(self, cmd: str) -> str:
        code = "timed out" if self.returncode is None else f"exited {self.returncode}"
        return f"{cmd} {code}\n--- stdout ---\n{self.stdout[-4000:]}\n--- stderr ---\n{self.stderr[-4000:]}"


def _installed() -> bool:
    try:
        importlib.metadata.distribution("megatron-recipes")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


@pytest.fixture(scope="module")
def helps(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Help]]:
    """Every tool's ``--help``, all started at once (one interpreter start-up's wall time, not one per tool)."""
    if not _installed():
        pytest.skip("the package is not installed in this interpreter (bash scripts/setup.sh installs it)")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {
        "OMP_NUM_THREADS": "1",
    }
    root = tmp_path_factory.mktemp("shims")
    procs: dict[str, tuple[subprocess.Popen[bytes], Path]] = {}
    try:
        for tool in TOOLS:
            cwd = root / tool.stem
            cwd.mkdir()
            with open(root / f"{tool.stem}.out", "wb") as out, open(root / f"{tool.stem}.err", "wb") as err:
                cmd = [sys.executable, str(tool), *HELP_ARGS.get(tool.name, []), "--help"]
                procs[tool.name] = (subprocess.Popen(cmd, stdout=out, stderr=err, env=env, cwd=cwd), cwd)
        # Every tool's interpreter at once on the machine's cores: a run's bound, not a short command's.
        deadline = time.monotonic() + RUN_S
        results = {}
        for name, (proc, cwd) in procs.items():
            try:
                code: int | None = proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=STOP_S)
                code = None
            stdout, stderr = ((root / f"{cwd.name}.{s}").read_text(errors="replace") for s in ("out", "err"))
            results[name] = Help(code, stdout, stderr, cwd)
        yield results
    finally:
        for proc, _ in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=STOP_S)


@pytest.mark.parametrize("tool", TOOLS, ids=lambda p: p.name)
def test_help_exits_0_with_usage_and_writes_nothing(tool: Path, helps: dict[str, Help]) -> None:
    result = helps[tool.name]
    cmd = " ".join(["python", f"tools/{tool.name}", *HELP_ARGS.get(tool.name, []), "--help"])
    assert result.returncode == 0, result.report(cmd)
    assert "usage:" in result.stdout, result.report(cmd)
    assert not any(result.cwd.iterdir()), f"{cmd} wrote {sorted(p.name for p in result.cwd.iterdir())}"


SHIMS = [tool for tool in TOOLS if tool.name not in NOT_SHIMS]


@pytest.mark.parametrize("tool", SHIMS, ids=lambda p: p.name)
def test_a_shim_is_its_console_scripts_main_and_nothing_else(tool: Path) -> None:
    text = tool.read_text()
    where = f"tools/{tool.name}"
    assert "sys.path" not in text, f"{where} edits sys.path: the package is installed (scripts/setup.sh)"
    tree = ast.parse(text)
    form = 'a docstring, `from megatron_ext.cli.<module> import main`, `if __name__ == "__main__": raise SystemExit(main())`'
    assert len(tree.body) == 3, f"{where} is not a shim ({form}); if it is not meant to be one, list it in NOT_SHIMS"
    _, imp, guard = tree.body
    docstring = ast.get_docstring(tree)
    assert docstring, f"{where}: no docstring ({form})"
    assert isinstance(imp, ast.ImportFrom) and imp.level == 0 and imp.module, f"{where}: second statement ({form})"
    assert imp.module.startswith("megatron_ext.cli."), f"{where} imports {imp.module}, not a megatron_ext.cli module"
    assert [(a.name, a.asname) for a in imp.names] == [("main", None)], f"{where} must import exactly `main`"
    assert ast.unparse(guard) == SHIM_GUARD, (
        f"{where}: last statement is not `raise SystemExit(main())` under the guard"
    )
    scripts = [name for name, target in SCRIPTS.items() if target == f"{imp.module}:main"]
    assert scripts, f"{where} calls {imp.module}:main, which no [project.scripts] entry of pyproject.toml names"
    assert any(f"``{name}``" in docstring for name in scripts), f"{where}'s docstring names none of {scripts}"
    # One name per tool: tools/NAME.py, megatron_ext/cli/NAME.py and mcore-NAME (dashes for underscores).
    assert imp.module == f"megatron_ext.cli.{tool.stem}", f"{where} runs {imp.module}: name them alike"
    script = f"mcore-{tool.stem.replace('_', '-')}"
    assert script in scripts, f"{where}'s console script is {scripts}, not {script}: name them alike"


def test_every_non_shim_is_still_there() -> None:
    names = {tool.name for tool in TOOLS}
    assert set(NOT_SHIMS) <= names, f"NOT_SHIMS lists tools that are gone: {set(NOT_SHIMS) - names}"


@pytest.mark.parametrize(
    "path",
    sorted([*(REPO / "tools").rglob("*.py"), *(REPO / "bench").rglob("*.py")]),
    ids=lambda p: str(p.relative_to(REPO)),
)
def test_no_sys_path_edits_in_tools_or_bench(path: Path) -> None:
    edits = [line.strip() for line in path.read_text().splitlines() if SYS_PATH_EDIT.search(line)]
    assert not edits, f"{path.relative_to(REPO)} edits sys.path (the package is installed): {edits}"

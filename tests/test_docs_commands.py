"""The README and docs/ as a newcomer uses them: every shell command they show runs as written, or says why not
and names the test that runs it instead; every path, link, test and flag they cite exists.

Each fenced block of README.md and docs/*.md names its language. A shell block (``bash``, ``sh``, ``shell``,
``console``) runs from a scratch copy of the repository root: every entry of the checkout linked in, except
``runs/``, where the commands write. The blocks of one page run in order in one copy, so a page's commands build
on each other as a reader's do. The project's environment comes first on the PATH, as after
``source .venv/bin/activate``. A ``console`` block shows commands after ``$ `` and what they print; every printed
line it shows (``...`` stands for lines left out) must be printed. An HTML comment right above a block changes this:

    <!-- doc-test: not run: WHY; covered by tests/PATH.py::TEST[, ...] -->   not run here: the tests named must
                                                                            exist (or a file, e.g. .ci/run)
    <!-- doc-test: exit N -->                                               its commands exit N, not 0

A command that is not run still has its paths checked and, for this repository's Python tools, its flags checked
against the tool's ``--help``. Commands that train or take minutes are left to the tests named, so that this module
costs the suite about 40 s of CPU time (the cheap commands: ``--help``, ``--dry-run``, the calculator, the data
tools on a 1 MB corpus, the example scripts and recipes with ``DRY_RUN=1``).
"""

from __future__ import annotations

import ast
import functools
import os
import re
import shlex
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests import waits
from tests.conftest import REPO
from tests.waits import QUICK_S

pytestmark = pytest.mark.unit

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SHELL = frozenset({"bash", "sh", "shell", "console"})
FENCE = re.compile(r"^(?P<indent> *)(?P<fence>```+)(?P<lang>[^`\s]*)\s*$")
DIRECTIVE = re.compile(r"^\s*<!--\s*doc-test:\s*(?P<what>.*?)\s*-->\s*$")
NOT_RUN = re.compile(r"^not run: (?P<why>[^;]+); covered by (?P<refs>.+)$")
EXIT = re.compile(r"^exit (?P<code>\d+)$")
CONTROL = frozenset({"&&", "||", ";", "|", "&"})
SKIPPED_ENTRIES = frozenset({"runs", ".git", "__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache"})


@dataclass(frozen=True)
class Block:
    """A fenced block of a page: its language, text (the fence's indentation removed) and the doc-test comment
    right above it."""

    page: Path
    line: int
    lang: str
    text: str
    directive: str | None

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"

    @property
    def expected_exit(self) -> int:
        found = EXIT.match(self.directive or "")
        return int(found["code"]) if found else 0

    @property
    def not_run(self) -> re.Match[str] | None:
        return NOT_RUN.match(self.directive) if self.directive and self.directive.startswith("not run") else None


def blocks(page: Path, text: str | None = None) -> list[Block]:
    """The fenced blocks of ``page`` (or of ``text``, read as that page)."""
    lines = (page.read_text(encoding="utf-8") if text is None else text).splitlines()
    found, i = [], 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, fence = len(opening["indent"]), opening["fence"]
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == fence), len(lines))
        above = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        directive = DIRECTIVE.match(above)
        body = "\n".join(line[indent:] if not line[:indent].strip() else line.lstrip() for line in lines[i + 1 : end])
        found.append(Block(page, i + 1, opening["lang"], body, directive["what"] if directive else None))
        i = end + 1
    return found


def logical_lines(script: str) -> list[str]:
    """The commands of a shell script, one a line: continuation lines joined, comments and blank lines left out."""
    found: list[str] = []
    pending = ""
    for line in script.splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        pending += line.strip()
        if pending.endswith("\\"):
            pending = pending[:-1].rstrip() + " "
            continue
        found.append(pending)
        pending = ""
    return [*found, *([pending.strip()] if pending.strip() else [])]


def console_commands(block: str) -> list[tuple[str, list[str]]]:
    """(command, the lines it is shown to print) for each ``$ `` command of a console block."""
    found: list[tuple[str, list[str]]] = []
    lines = block.splitlines()
    i = 0
    while i < len(lines):
        if not lines[i].startswith("$ "):
            if not found:
                raise ValueError(f"console output before any command: {lines[i]!r}")
            found[-1][1].append(lines[i])
            i += 1
            continue
        command = lines[i][2:]
        while command.endswith("\\") and i + 1 < len(lines):
            i += 1
            command = command[:-1].rstrip() + " " + lines[i].strip()
        found.append((command, []))
        i += 1
    return found


def commands(block: Block) -> list[str]:
    if block.lang == "console":
        return [command for command, _ in console_commands(block.text)]
    return logical_lines(block.text)


def missing_output(shown: list[str], printed: str) -> list[str]:
    """The lines of ``shown`` that no line of ``printed`` contains (stripped; ``...`` stands for any text, and a
    line of ``...`` alone for lines left out)."""
    missing = []
    for line in (s.strip() for s in shown):
        if line in ("", "..."):
            continue
        pattern = ".*".join(re.escape(part) for part in line.split("..."))
        if not re.search(pattern, printed):  # '.' stops at a line's end: the parts are found on one line
            missing.append(line)
    return missing


# ------------------------------------------------------------------ running a page
def _scratch_checkout(root: Path) -> Path:
    """``root`` as the repository root: every entry of the checkout linked, ``runs/`` its own; ``python`` on the
    PATH is this interpreter (the project's environment, as after ``source .venv/bin/activate``)."""
    work = root / "checkout"
    work.mkdir()
    for entry in REPO.iterdir():
        if entry.name not in SKIPPED_ENTRIES:
            (work / entry.name).symlink_to(entry)
    (root / "bin").mkdir()
    for name in ("python", "python3"):
        # A script, not a link: a venv's interpreter finds its environment from the path it is started by.
        (root / "bin" / name).write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} "$@"\n')
        (root / "bin" / name).chmod(0o755)
    return work


def _environment(root: Path) -> dict[str, str]:
    path = os.pathsep.join([str(root / "bin"), str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    return {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")} | {
        "PATH": path,
        # This checkout's package, not another checkout's editable install.
        "PYTHONPATH": str(REPO),
        "OMP_NUM_THREADS": "1",
    }


def _run(command: str, block: Block, work: Path, env: dict[str, str]) -> str:
    proc = waits.run(["bash", "-e", "-o", "pipefail", "-c", command], timeout=QUICK_S, cwd=work, env=env)
    printed = proc.stdout + proc.stderr
    assert proc.returncode == block.expected_exit, (
        f"{block.where}: exited {proc.returncode}, the page says {block.expected_exit}:\n{command}\n"
        f"--- output ---\n{waits.tail(printed)}"
    )
    return printed


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(REPO)) for p in PAGES])
def test_the_commands_of_each_page_run_as_written(page: Path, tmp_path: Path) -> None:
    work = _scratch_checkout(tmp_path)
    env = _environment(tmp_path)
    for block in blocks(page):
        if block.lang not in SHELL or block.not_run:
            continue
        if block.lang == "console":
            for command, shown in console_commands(block.text):
                printed = _run(command, block, work, env)
                missing = missing_output(shown, printed)
                assert not missing, (
                    f"{block.where}: {command}\ndoes not print:\n"
                    + "\n".join(missing)
                    + (f"\n--- it printed ---\n{waits.tail(printed)}")
                )
        else:
            _run(block.text, block, work, env)


# ------------------------------------------------------------------ what a page cites
def _all_blocks() -> Iterator[Block]:
    for page in PAGES:
        yield from blocks(page)


def test_every_block_names_its_language() -> None:
    unnamed = [b.where for b in _all_blocks() if not b.lang]
    assert not unnamed, "fenced blocks without a language (bash, console, text, json, ...): " + ", ".join(unnamed)


def test_every_doc_test_comment_is_understood() -> None:
    bad = [
        f"{b.where}: {b.directive}"
        for b in _all_blocks()
        if b.directive is not None and not (b.not_run or EXIT.match(b.directive))
    ]
    assert not bad, "doc-test comments that are neither 'not run: WHY; covered by TESTS' nor 'exit N':\n" + "\n".join(
        bad
    )


def defines(file: Path, name: str) -> bool:
    """Whether ``file`` defines ``name`` (``test_x``, or ``Class::test_x``; a ``[parameter]`` suffix ignored)."""
    tree = ast.parse(file.read_text(encoding="utf-8"))
    *owners, function = name.split("[")[0].split("::")
    body = tree.body
    for owner in owners:
        cls = next((n for n in body if isinstance(n, ast.ClassDef) and n.name == owner), None)
        if cls is None:
            return False
        body = cls.body
    return any(isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == function for n in body)


def reference_problem(ref: str) -> str | None:
    """Why ``ref`` (``tests/x.py::test_y``, or a file of the repository) names nothing, or None."""
    path, _, name = ref.partition("::")
    file = REPO / path
    if not file.is_file():
        return f"{path} does not exist"
    if name and not defines(file, name):
        return f"{path} defines no {name}"
    return None


def test_a_block_not_run_here_says_why_and_names_tests_that_exist() -> None:
    problems = []
    for block in _all_blocks():
        if not block.not_run:
            continue
        for ref in (r.strip() for r in block.not_run["refs"].split(",")):
            problem = reference_problem(ref)
            if problem:
                problems.append(f"{block.where}: {problem}")
    assert not problems, "\n".join(problems)


def test_only_shell_blocks_carry_doc_test_comments() -> None:
    """A comment above an output block would be a command the test never sees."""
    stray = [b.where for b in _all_blocks() if b.directive is not None and b.lang not in SHELL]
    assert not stray, "doc-test comments above blocks that are not shell: " + ", ".join(stray)


# ------------------------------------------------------------------ paths and flags of the commands
TOP = frozenset(entry.name for entry in REPO.iterdir() if entry.name not in SKIPPED_ENTRIES)
PYTHONS = frozenset({"python", "python3", ".venv/bin/python"})
LAUNCHERS = frozenset({"torchrun", "megatron_ext.cli.launch", "torch.distributed.run"})
PRETRAIN_FLAGS_TOO = frozenset({"tools/record_schedule.py"})
"""Tools that take pretrain_gpt.py's flags besides their own."""


def repository_path(token: str) -> Path | None:
    """The path of the checkout ``token`` names (``tools/layout.py``, ``docs/data.md#anchor``), or None when it
    names none (a flag, an output under runs/, an absolute path)."""
    token = token.split("#")[0].rstrip(".,:;)")
    if not token or token.startswith(("/", "-", "$", "~")) or any(c in token for c in "=<>{}*?["):
        return None  # not a path, or a pattern of paths (tools/<name>.py)
    first = token.split("/")[0]
    if first in TOP and first != ".venv":
        return REPO / token
    return None


def _split(command: str) -> list[list[str]]:
    """The simple commands of ``command`` (split at ``&&``, ``|``, ``;``), each without its leading
    ``NAME=value`` assignments."""
    tokens = shlex.split(command, comments=True)
    parts: list[list[str]] = [[]]
    for token in tokens:
        if token in CONTROL:
            parts.append([])
        else:
            parts[-1].append(token)
    return [
        part[next((i for i, t in enumerate(part) if not re.match(r"^[A-Z_][A-Z0-9_]*=", t)), len(part)) :]
        for part in parts
        if part
    ]


@functools.cache
def known_flags(tool: str, subcommand: str = "") -> frozenset[str]:
    """The flags ``tool`` (a script of the checkout, or ``-m module``) lists in its ``--help``; pretrain_gpt.py's
    also the Megatron-LM flags it accepts without listing them."""
    if tool in PRETRAIN_FLAGS_TOO:  # it passes what it does not know on to pretrain_gpt.py's parser
        own = re.findall(r"[\"'](--[A-Za-z][\w-]*)[\"']", (REPO / tool).read_text(encoding="utf-8"))
        return frozenset(own) | known_flags("pretrain_gpt.py")
    program = tool.split() if tool.startswith("-m ") else [str(REPO / tool)]
    proc = waits.run(
        [sys.executable, *program, *([subcommand] if subcommand else []), "--help"],
        timeout=QUICK_S,
        cwd=REPO,
        env=os.environ | {"PYTHONPATH": str(REPO)},
    )
    assert proc.returncode == 0, f"{tool} {subcommand} --help exited {proc.returncode}: {waits.tail(proc.stderr)}"
    flags = set(re.findall(r"(?<![\w-])--[A-Za-z][\w-]*", proc.stdout))
    if tool == "pretrain_gpt.py":
        from megatron_ext.config import megatron_lm
        from megatron_ext.config.megatron_lm_accepted import ACCEPTED

        flags |= set(ACCEPTED) | set(megatron_lm.ALREADY)
    return frozenset(flags)


def _flags(tokens: list[str]) -> list[str]:
    return [t.split("=")[0] for t in tokens if t.startswith("--") and len(t) > 2]


def command_problems(command: str) -> list[str]:
    """What ``command`` cites that does not exist: a path of the checkout, or a flag its tool does not take."""
    problems = []
    for part in _split(command):
        for token in part:
            path = repository_path(token)
            if path is not None and not path.exists():
                problems.append(f"no such path: {token}")
        if not part or part[0] not in PYTHONS | {"torchrun"}:
            continue
        args = part[1:]
        if part[0] == "torchrun":
            args = ["-m", "torch.distributed.run", *args]
        tool = args[0] if args and not args[0].startswith("-") else ""
        rest = args[1:]
        if args[:1] == ["-m"] and len(args) > 1:
            tool, rest = f"-m {args[1]}", args[2:]
        if not tool:
            continue
        if tool.removeprefix("-m ") in LAUNCHERS:
            script = next((i for i, t in enumerate(rest) if t.endswith(".py")), None)
            launcher_flags = rest if script is None else rest[:script]
            problems += [f"{tool}: no flag {f}" for f in _flags(launcher_flags) if f not in known_flags(tool)]
            if script is None:
                continue
            tool, rest = rest[script], rest[script + 1 :]
        if not tool.startswith("-m ") and (repository_path(tool) is None or not (REPO / tool).is_file()):
            continue  # not one of this repository's tools (or its path is reported above)
        subcommand = rest[0] if rest and re.fullmatch(r"[a-z][a-z-]*", rest[0]) else ""
        own, passed = (rest[: rest.index("--")], rest[rest.index("--") + 1 :]) if "--" in rest else (rest, [])
        problems += [f"{tool}: no flag {f}" for f in _flags(own) if f not in known_flags(tool, subcommand)]
        problems += [f"pretrain_gpt.py: no flag {f}" for f in _flags(passed) if f not in known_flags("pretrain_gpt.py")]
    return problems


def test_commands_not_run_here_cite_paths_and_flags_that_exist() -> None:
    """The commands that run are checked by running; the others here, so that a renamed flag or a moved file fails
    even where the command itself cannot run."""
    problems = [
        f"{block.where}: {command}: {problem}"
        for block in _all_blocks()
        if block.lang in SHELL and block.not_run
        for command in commands(block)
        for problem in command_problems(command)
    ]
    assert not problems, "\n".join(problems)


# ------------------------------------------------------------------ what the prose cites
CODE_SPAN = re.compile(r"`([^`\n]+)`")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6} (.+)$", re.M)
PACKAGE = REPO / "megatron_ext"


def anchors(page: Path) -> set[str]:
    """GitHub's anchors of ``page``'s headings."""
    found = set()
    for heading in HEADING.findall(page.read_text(encoding="utf-8")):
        text = re.sub(r"[`*]", "", heading).strip().lower()
        found.add(re.sub(r"[^\w\- ]", "", text).replace(" ", "-"))
    return found


def _prose(page: Path) -> str:
    """``page`` without its fenced blocks."""
    kept, inside = [], None
    for line in page.read_text(encoding="utf-8").splitlines():
        fence = FENCE.match(line)
        if fence and (inside is None or fence["fence"] == inside):
            inside = None if inside else fence["fence"]
            continue
        if inside is None:
            kept.append(line)
    return "\n".join(kept)


def cited_problems(page: Path) -> list[str]:
    """The paths, tests and links ``page``'s prose cites that name nothing."""
    problems = []
    # Another repository's files, linked to it (Megatron-LM's `examples/...`), are not this checkout's.
    prose = re.sub(r"\[[^\]]*\]\((?:https?|mailto):[^)]*\)", "", _prose(page))
    last_file: str | None = None
    for span in CODE_SPAN.findall(prose):
        for token in span.split():
            if "::" in token:
                path, _, name = token.partition("::")
                if path.startswith("tests/") or path.endswith(".py"):
                    last_file = path if path.startswith("tests/") else _test_file(path) or path
                if not path and last_file is None:
                    problems.append(f"{token}: which file?")
                    continue
                problem = reference_problem(f"{last_file if not path else (_test_file(path) or path)}::{name}")
                if problem:
                    problems.append(f"{token}: {problem}")
                continue
            path = repository_path(token)
            bare = token.rstrip(".,:;)")
            if path is None and bare.endswith((".py", "/")) and bare.split("/")[0] in _subpackages():
                path = PACKAGE / bare  # estimate/memory.py: a module of the package
            if path is not None and not path.exists():
                problems.append(f"no such path: {token}")
    for target in LINK.findall(prose):
        if re.match(r"^[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        linked = (page.parent / file).resolve() if file else page
        if not linked.exists():
            problems.append(f"link to a missing file: {target}")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            problems.append(f"link to a missing heading: {target}")
    return problems


@functools.cache
def _subpackages() -> frozenset[str]:
    return frozenset(p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists())


def _test_file(name: str) -> str | None:
    """``tests/.../NAME`` when exactly one test file has that name."""
    if "/" in name:
        return None
    found = sorted(REPO.glob(f"tests/**/{name}"))
    return str(found[0].relative_to(REPO)) if len(found) == 1 else None


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(REPO)) for p in PAGES])
def test_the_paths_tests_and_links_a_page_cites_exist(page: Path) -> None:
    problems = cited_problems(page)
    assert not problems, f"{page.relative_to(REPO)}:\n" + "\n".join(problems)


def test_no_page_cites_an_issue_number() -> None:
    """Pages say what is so; the tracker's numbers mean nothing to a reader of a clone."""
    cited = [
        f"{page.relative_to(REPO)}: {m.group(0)}"
        for page in PAGES
        for m in re.finditer(r"\bissues?[ -]#?\d+|(?<![\w&])#\d+\b", page.read_text(encoding="utf-8"), re.I)
    ]
    assert not cited, "\n".join(cited)


# ------------------------------------------------------------------ the checks themselves
SAMPLE = """\
Intro.

<!-- doc-test: not run: trains; covered by tests/test_docs_commands.py::test_console_output_must_be_printed -->
```bash
python tools/layout.py --gpus 8 \\
    --no-such-flag    # a comment
```

```console
$ python tools/layout.py --gpus 8 \\
    --json
{
...
```

<!-- doc-test: exit 2 -->
   ```sh
   bash recipes/missing.sh
   ```
```text
output
```
"""


def test_the_page_reader_finds_blocks_their_language_and_comments() -> None:
    found = blocks(REPO / "README.md", SAMPLE)
    assert [(b.line, b.lang, b.directive is not None) for b in found] == [
        (4, "bash", True),
        (9, "console", False),
        (17, "sh", True),
        (20, "text", False),
    ]
    assert found[0].not_run is not None and found[0].not_run["why"] == "trains"
    assert commands(found[0]) == ["python tools/layout.py --gpus 8 --no-such-flag    # a comment"]
    assert console_commands(found[1].text) == [("python tools/layout.py --gpus 8 --json", ["{", "..."])]
    assert found[2].expected_exit == 2 and found[2].text == "bash recipes/missing.sh"


def test_drifted_flags_paths_and_tests_are_found() -> None:
    assert command_problems("python tools/layout.py --gpus 8 --no-such-flag  # comment") == [
        "tools/layout.py: no flag --no-such-flag"
    ]
    assert command_problems("DRY_RUN=1 bash recipes/no_such_recipe.sh") == ["no such path: recipes/no_such_recipe.sh"]
    assert command_problems("python tools/layout.py --gpus 8 --top 3 && echo done") == []
    assert command_problems("python bench/train_throughput.py --nproc 1 -- --bf16 --no-such-flag") == [
        "pretrain_gpt.py: no flag --no-such-flag"
    ]
    assert reference_problem("tests/test_docs_commands.py::test_no_such_test") == (
        "tests/test_docs_commands.py defines no test_no_such_test"
    )
    assert reference_problem("tests/test_docs_commands.py::test_drifted_flags_paths_and_tests_are_found") is None


def test_console_output_must_be_printed() -> None:
    printed = "  loss: 3.1 at iteration 1\nsaved to /tmp/x\n"
    assert missing_output(["  loss: 3.1 at ...", "...", "saved to ... (...)", "saved ...x"], printed) == [
        "saved to ... (...)"
    ]
    assert missing_output(["loss: ... /tmp"], printed) == ["loss: ... /tmp"]  # not across lines

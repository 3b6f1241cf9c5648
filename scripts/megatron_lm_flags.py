#!/usr/bin/env python3
"""List every flag of Megatron-LM's ``pretrain_gpt.py`` parser, with its argument group, from a checkout.

Writes ``megatron_ext/config/megatron_lm_flags.tsv`` (``--flag<TAB>group``): the names only, the
data that ``megatron_ext.config.megatron_lm`` classifies (each honoured, or refused with a reason).
Run it against the Megatron-LM release that matches the pinned ``megatron-core`` when the pin
moves; the test ``tests/config/test_megatron_lm_flags.py`` then names every new flag to classify::

    git -C Megatron-LM checkout core_v0.16.1
    python scripts/megatron_lm_flags.py --megatron-lm Megatron-LM

Only the parser is built: ``megatron.training``'s package ``__init__`` (which starts the runtime)
is skipped, the installed ``megatron.core`` is used, and optional libraries that are not
installed (``six``, ``nltk``, ``wandb``, ...) are replaced by empty modules.
"""

from __future__ import annotations

import argparse
import importlib.abc
import importlib.machinery
import importlib.util
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
OUTPUT = REPO / "megatron_ext" / "config" / "megatron_lm_flags.tsv"


class _Absent(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Empty stand-ins for optional modules that are not installed (their names resolve to dummies)."""

    def __init__(self, names: set[str]) -> None:
        self.names = names

    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name.split(".")[0] in self.names:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__getattr__ = _dummy  # type: ignore[method-assign]
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def _dummy(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    return type(name, (), {})


def flags(checkout: Path) -> list[tuple[str, str]]:
    """(flag, group title) of every ``--`` option string of Megatron-LM's parser."""
    optional = {"six", "nltk", "tiktoken", "wandb", "einops", "flask", "flask_restful"}
    sys.meta_path.insert(0, _Absent({n for n in optional if importlib.util.find_spec(n) is None}))
    sys.path.append(str(checkout))  # after site-packages: megatron.core stays the installed one
    training = types.ModuleType("megatron.training")
    training.__path__ = [str(checkout / "megatron" / "training")]
    training.__getattr__ = lambda name: _dummy(name) if name.startswith("__") else (lambda *a, **k: None)  # type: ignore[method-assign]
    sys.modules["megatron.training"] = training
    from megatron.training.arguments import add_megatron_arguments

    parser = argparse.ArgumentParser(allow_abbrev=False)
    add_megatron_arguments(parser)
    rows = {
        (option, group.title or "")
        for group in parser._action_groups
        for action in group._group_actions
        for option in action.option_strings
        if option.startswith("--") and option != "--help"
    }
    return sorted(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--megatron-lm", required=True, type=Path, help="A Megatron-LM checkout (its repository root).")
    p.add_argument("--output", type=Path, default=OUTPUT, help="Where to write the list.")
    p.add_argument("--label", help="The Megatron-LM version, for the header (default: git describe of the checkout).")
    args = p.parse_args(argv)
    label = (
        args.label
        or subprocess.run(
            ["git", "-C", str(args.megatron_lm), "describe", "--tags", "--always"], capture_output=True, text=True
        ).stdout.strip()
    )
    rows = flags(args.megatron_lm.resolve())
    tmp = args.output.with_name(f".{args.output.name}.tmp")
    header = f"# Megatron-LM {label or '(unknown version)'}: every flag of its parser and the parser's group (scripts/megatron_lm_flags.py)\n"
    tmp.write_text(header + "".join(f"{flag}\t{group}\n" for flag, group in rows))
    tmp.replace(args.output)
    print(f"wrote {len(rows)} flags to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Exit codes: one table for ``pretrain_gpt.py``, every tool and ``recipes/common.sh``.

Each code means the same thing wherever it is returned; the recipes read
this table (``python -m megatron_ext.cli.recipe``) instead of restating it.
A refusal is said one way everywhere (``fail``): one ``error: …`` line on
stderr, and the code.
"""

from __future__ import annotations

import enum
import sys
import typing


class ExitCode(enum.IntEnum):
    """What a process's exit status says."""

    OK = 0
    """Done: training finished, the layout is valid and fits, the data was written."""
    ERROR = 1
    """Failed on its input or at run time: bad data, a failed worker, a crash."""
    INVALID = 2
    """Invalid options or layout, refused before anything started (argparse's own code too)."""
    CHECKPOINT = 3
    """A checkpoint cannot be used or written: damaged, another model, tokenizer or data, checkpoints the run
    would replace, or a save that failed (disk full, read-only)."""
    NON_FINITE = 4
    """``pretrain_gpt.py``: more consecutive non-finite losses than ``--max-consecutive-skipped`` allows."""
    DOES_NOT_FIT = 5
    """``tools/layout.py``: the layout is valid but estimated not to fit in GPU memory."""
    SAVED_AND_STOPPED = 75
    """Stopped early on purpose (signal, time or iteration limit) after saving, or a preprocessing task stopped
    keeping nothing: run again to go on (``EX_TEMPFAIL``; the recipes requeue the job or the array task)."""


SIGNAL_BASE = 128
"""A tool stopped by signal N exits with ``SIGNAL_BASE + N`` (130 Ctrl-C, 143 SIGTERM), as shells report it."""


def fail(message: object, code: ExitCode, *, file: typing.TextIO | None = None, prefix: str = "error") -> ExitCode:
    """Say why a command stops, as ``PREFIX: MESSAGE`` on ``file`` (default: stderr, looked up at the call), and
    return its exit code, for ``return fail(exc, ExitCode.INVALID)`` in a ``main``."""
    print(f"{prefix}: {message}", file=sys.stderr if file is None else file)
    return code

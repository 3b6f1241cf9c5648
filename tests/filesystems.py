"""Filesystems that fail writes, for the fault tests: a full disk (``ENOSPC``) and a read-only one (``EROFS``).

Each is a real mount (tmpfs), so every layer between the code and the kernel sees the real error.
Mounting needs root; where it is refused the tests that need it skip, saying why. CI runs as root.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.waits import QUICK_S, STOP_S


def _mount(target: Path, options: str) -> None:
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(target)],
        capture_output=True,
        text=True,
        check=False,
        timeout=QUICK_S,
    )
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {proc.stderr.strip()}")


def _umount(target: Path) -> None:
    subprocess.run(["umount", "-l", str(target)], capture_output=True, check=False, timeout=STOP_S)


@contextlib.contextmanager
def small_filesystem(target: Path, *, size_kib: int) -> Iterator[Path]:
    """``target`` (created) as a filesystem of ``size_kib`` KiB: writes past that fail with ENOSPC."""
    target.mkdir(parents=True, exist_ok=True)
    _mount(target, f"size={size_kib}k")
    try:
        yield target
    finally:
        _umount(target)


@contextlib.contextmanager
def read_only_filesystem(target: Path, *, contents: dict[str, bytes] | None = None) -> Iterator[Path]:
    """``target`` (created) as a read-only filesystem holding ``contents`` (relative name -> bytes):
    every write fails with EROFS, even for root."""
    target.mkdir(parents=True, exist_ok=True)
    _mount(target, "size=64m")
    try:
        for name, data in (contents or {}).items():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            (target / name).write_bytes(data)
        subprocess.run(["mount", "-o", "remount,ro", str(target)], check=True, capture_output=True, timeout=QUICK_S)
        yield target
    finally:
        _umount(target)

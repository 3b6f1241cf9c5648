"""What a session fixture builds, built once per pytest run rather than once per xdist worker.

A session fixture is computed by every worker that runs one of its tests: under ``-n 2`` the shared training runs
(the seed checkpoint, the baselines, the saved runs) and the shared corpus and tokenizer were each built twice.
``once_per_run`` builds into a directory beside the workers' own temporary directories, under a lock: the first
worker to ask builds while the other waits (a bounded wait), and both then read the same files. The fixtures that
use it only read what was built; a test that damages or extends it works on a copy (``copy_of``).

A build that failed leaves its directory without the mark of completion: the next worker to ask removes it and
builds again, so each worker reports the failure in its own tests.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.waits import RUN_S

BUILT = ".built"
"""The file whose presence says that a directory's build finished."""


def run_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The directory shared by this run's workers: each xdist worker's base temporary directory is a child of it."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@contextlib.contextmanager
def _locked(path: Path, *, timeout: float) -> Iterator[None]:
    with path.open("a") as handle:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    pytest.fail(f"waited {timeout:g} s for another worker to build {path.stem}, in vain")
                time.sleep(0.2)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def once_per_run(tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], object]) -> Path:
    """The directory ``name`` of this run, which ``build(directory)`` filled: by this worker or by another one."""
    root = run_root(tmp_path_factory)
    directory = root / f"once-{name}"
    with _locked(root / f"once-{name}.lock", timeout=RUN_S):
        if not (directory / BUILT).exists():
            if directory.exists():
                shutil.rmtree(directory)  # a failed build's remains
            directory.mkdir()
            build(directory)
            (directory / BUILT).touch()
    return directory

"""How the data tools start their worker processes."""

from __future__ import annotations

import multiprocessing as mp
import threading
from multiprocessing.context import BaseContext


def worker_context() -> BaseContext:
    """``fork`` (the workers start at once and share what is loaded) where it is safe: this process runs one
    thread. With more (a caller's threads, a test runner's), a forked child can inherit a lock another thread held
    or an object halfway through a change, and crash or hang: then ``forkserver`` (a clean single-threaded process
    forks the workers), or ``spawn`` where neither exists."""
    methods = mp.get_all_start_methods()
    if "fork" in methods and threading.active_count() == 1:
        return mp.get_context("fork")
    return mp.get_context("forkserver" if "forkserver" in methods else "spawn")

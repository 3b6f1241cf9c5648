"""How the data tools start their worker processes."""

from __future__ import annotations

import multiprocessing as mp
import os
import threading
from multiprocessing.context import BaseContext


def _threads() -> int:
    """This process's threads, native ones included (Linux: one entry each under /proc/self/task; a library's
    thread pool, such as torch's or gloo's, is invisible to ``threading``)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


def worker_context() -> BaseContext:
    """``fork`` (the workers start at once and share what is loaded) where it is safe: this process runs one
    thread. With more (a caller's threads, a test runner's, a library's native pool), a forked child can inherit
    a lock another thread held or an object halfway through a change, and crash or hang: then ``forkserver`` (a
    clean single-threaded process forks the workers), or ``spawn`` where neither exists."""
    methods = mp.get_all_start_methods()
    if "fork" in methods and _threads() == 1:
        return mp.get_context("fork")
    return mp.get_context("forkserver" if "forkserver" in methods else "spawn")

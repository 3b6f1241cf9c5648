"""Progress of a long data job: a bar on a terminal, plain periodic lines otherwise."""

from __future__ import annotations

import sys
import time
from typing import TextIO


def _duration(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    return f"{seconds // 3600:d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class Progress:
    """Documents/s, MB/s and (when the total is known) percent and ETA.

    On a terminal one line is redrawn at most ``redraw_per_s`` times a second;
    otherwise a line is printed every ``log_interval`` documents, as
    Megatron-LM's tool does. ``quiet`` prints nothing.
    """

    def __init__(
        self,
        *,
        total_bytes: int | None,
        log_interval: int = 1000,
        quiet: bool = False,
        stream: TextIO | None = None,
        redraw_per_s: float = 5.0,
    ) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.total_bytes = total_bytes
        self.log_interval = max(1, log_interval)
        self.quiet = quiet
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.min_redraw = 1.0 / redraw_per_s
        self.start = time.perf_counter()
        self.docs = 0
        self.bytes = 0
        self.tokens = 0
        self._last_draw = 0.0
        self._next_log = self.log_interval

    def update(self, *, docs: int, nbytes: int, tokens: int, position: int | None = None) -> None:
        """Add one chunk's counts; ``position`` is the input position when it differs from bytes read."""
        self.docs += docs
        self.bytes += nbytes
        self.tokens += tokens
        if self.quiet:
            return
        now = time.perf_counter()
        if self.tty:
            if now - self._last_draw >= self.min_redraw:
                self._last_draw = now
                self.stream.write("\r" + self._line(now, position) + "\x1b[K")
                self.stream.flush()
        elif self.docs >= self._next_log:
            self._next_log = (self.docs // self.log_interval + 1) * self.log_interval
            print(self._line(now, position), file=self.stream, flush=True)

    def _line(self, now: float, position: int | None) -> str:
        elapsed = max(now - self.start, 1e-9)
        mbs = self.bytes / elapsed / 1e6
        parts = [f"{self.docs:,} docs", f"{self.docs / elapsed:,.0f} docs/s", f"{mbs:.1f} MB/s"]
        done = position if position is not None else self.bytes
        if self.total_bytes:
            frac = min(done / self.total_bytes, 1.0)
            rate = done / elapsed
            eta = (self.total_bytes - done) / rate if rate > 0 else 0.0
            if self.tty:
                width = 24
                filled = int(frac * width)
                parts.insert(0, f"[{'#' * filled}{'.' * (width - filled)}] {frac:6.1%}")
            else:
                parts.insert(0, f"{frac:6.1%}")
            parts.append(f"ETA {_duration(eta)}")
        return " | ".join(parts)

    def close(self) -> None:
        if self.quiet:
            return
        if self.tty:
            self.stream.write("\r" + self._line(time.perf_counter(), self.total_bytes) + "\x1b[K\n")
            self.stream.flush()

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.start

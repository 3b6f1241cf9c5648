"""Every forward and backward pass of every pipeline rank, timed: per-stage cost, imbalance and a timeline.

A pipeline runs at the pace of its slowest stage. ``StageTimer`` wraps the
``forward_step`` that Megatron-Core's schedule calls once per (microbatch,
model chunk) forward pass, and marks on this rank's clock:

* **forward start and end**: around ``forward_step`` (the loss included; on
  the last stage the output layer and cross entropy run inside it);
* **backward start**: a gradient hook on the chunk's output, which fires when
  the schedule starts that chunk's backward pass;
* **backward end**: a gradient hook on the chunk's input hidden states (the
  embedding output on the first stage, the received activations elsewhere),
  which fires when the gradient has gone through every layer of the chunk;
* **weight-gradient passes** of a zero-bubble schedule (``weight_pass``): W, the
  part of the backward that runs apart from its B (counted as backward time).

Marks are ``time.perf_counter()`` on CPU and CUDA events on GPU (resolved
after the step, so nothing synchronises inside it). Per step each rank sums
its forward and backward time; at every log interval the ranks gather those
sums, and for each pipeline rank (the slowest of its TP/DP ranks) the log and
the metrics file get its compute time per microbatch, its idle time, and::

    stage_imbalance = max(stage compute) / mean(stage compute) − 1

The same gather keeps every global rank's own compute time per microbatch
(``rank_compute_ms``, with its pipeline rank and host name), from which
``megatron_ext.training.stragglers`` names the ranks consistently slower than
the other ranks of their pipeline stage.

``--timeline PATH`` also keeps every pass of the last ``TIMELINE_STEPS`` steps
and writes them, from every rank, as one Chrome trace (``chrome://tracing``,
Perfetto; ``tools/plot_schedule.py --timeline`` draws it beside the
simulation). Times are relative to a barrier at start-up, so ranks on one
node line up to the clock; across nodes to within the barrier's skew.
Evaluation (no gradients) is not timed.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from megatron_ext.estimate.pipeline_schedule import PipelinePass, TimedPass
from megatron_ext.parallel.pipeline import stage_imbalance
from megatron_ext.training.chrome_trace import write_trace

TIMELINE_STEPS = 8
"""Steps kept for ``--timeline`` (the most recent ones: steady state, bounded memory)."""
HOST_BYTES_PER_VALUE = 6
"""Bytes of the host name per gathered float64 (an integer below 2**48: exact)."""
HOST_VALUES = 8
"""Gathered float64 values holding the host name: its first 48 bytes."""


def host_values(name: str) -> list[float]:
    """``name`` (UTF-8, its first ``HOST_VALUES × HOST_BYTES_PER_VALUE`` bytes) as exact float64 integers.

    The host name travels in the window's all-gather of floats, so that naming
    a straggler's host costs no collective of its own.
    """
    size = HOST_VALUES * HOST_BYTES_PER_VALUE
    data = name.encode()[:size].ljust(size, b"\0")
    step = HOST_BYTES_PER_VALUE
    return [float(int.from_bytes(data[i : i + step], "big")) for i in range(0, size, step)]


def host_name(values: list[float]) -> str:
    """The inverse of :func:`host_values` (a name cut inside a character ends with U+FFFD)."""
    data = b"".join(int(v).to_bytes(HOST_BYTES_PER_VALUE, "big") for v in values)
    return data.rstrip(b"\0").decode(errors="replace")


def this_host() -> str:
    """This machine's host name; the short one (before the first dot) when the full one does not fit."""
    name = socket.gethostname()
    if len(name.encode()) > HOST_VALUES * HOST_BYTES_PER_VALUE:
        name = name.split(".")[0]
    return name


@dataclass(frozen=True)
class StageCost:
    """Measured cost of every pipeline rank, and compute time of every global rank, over a window of steps."""

    forward_ms: tuple[float, ...]
    """Forward time per microbatch (all chunks of the rank), per pipeline rank."""
    backward_ms: tuple[float, ...]
    """Backward time per microbatch, per pipeline rank."""
    idle_ms: tuple[float, ...]
    """Per step: the rank's span from its first pass to its last, minus its compute."""
    rank_compute_ms: tuple[float, ...]
    """Forward + backward time per microbatch of every global rank, in order of global rank."""
    rank_pipeline_rank: tuple[int, ...]
    """The pipeline rank of every global rank (its peers are the ranks with the same one)."""
    rank_hosts: tuple[str, ...] = ()
    """The host name of every global rank ("" where unknown; empty: none gathered)."""

    def __post_init__(self) -> None:
        if len(self.rank_compute_ms) != len(self.rank_pipeline_rank) or (
            self.rank_hosts and len(self.rank_hosts) != len(self.rank_compute_ms)
        ):
            raise ValueError("rank_compute_ms, rank_pipeline_rank and rank_hosts need one entry per global rank")

    @property
    def compute_ms(self) -> tuple[float, ...]:
        """Forward + backward time per microbatch, per pipeline rank (the slowest of its ranks)."""
        return tuple(f + b for f, b in zip(self.forward_ms, self.backward_ms, strict=True))

    @property
    def imbalance(self) -> float:
        """Slowest stage's compute over the mean, minus 1 (0: perfectly balanced)."""
        return stage_imbalance(self.compute_ms)

    @property
    def slowest(self) -> int:
        compute = self.compute_ms
        return compute.index(max(compute))

    def as_record(self) -> dict[str, Any]:
        return {
            "stage_forward_ms": list(self.forward_ms),
            "stage_backward_ms": list(self.backward_ms),
            "stage_idle_ms": list(self.idle_ms),
            "stage_imbalance": self.imbalance,
            "rank_compute_ms": list(self.rank_compute_ms),
            "rank_pipeline_rank": list(self.rank_pipeline_rank),
        }

    def describe(self) -> str:
        per = ", ".join(
            f"{r}: {f:.1f}+{b:.1f} (idle {i:.1f})"
            for r, (f, b, i) in enumerate(zip(self.forward_ms, self.backward_ms, self.idle_ms, strict=True))
        )
        return (
            f"stages (ms per microbatch forward+backward, idle ms per step): {per}; "
            f"imbalance {self.imbalance:.1%} (slowest: pipeline rank {self.slowest})"
        )


def stage_cost(rows: list[list[float]], *, pipeline_size: int) -> StageCost | None:
    """The ``StageCost`` of one window from every rank's gathered row, in order of global rank.

    A row is ``[pipeline rank, forward s, backward s, idle s per step, microbatches, *host_values(host)]``
    (the host part may be absent). Each pipeline rank gets the slowest of its ranks (forward + backward);
    each global rank its own compute per microbatch. None when a rank timed no microbatch, or a pipeline
    rank has no row.
    """
    worst: dict[int, tuple[float, float, float]] = {}
    per_rank: list[tuple[float, int, str]] = []
    for values in rows:
        rank, f, b, i, mb = values[:5]
        if mb <= 0:
            return None
        f, b = f / mb * 1000.0, b / mb * 1000.0
        per_rank.append((f + b, int(rank), host_name(values[5:])))
        prev = worst.get(int(rank))
        if prev is None or f + b > prev[0] + prev[1]:
            worst[int(rank)] = (f, b, i * 1000.0)
    if sorted(worst) != list(range(pipeline_size)):
        return None
    ordered = [worst[r] for r in range(pipeline_size)]
    return StageCost(
        forward_ms=tuple(x[0] for x in ordered),
        backward_ms=tuple(x[1] for x in ordered),
        idle_ms=tuple(x[2] for x in ordered),
        rank_compute_ms=tuple(x[0] for x in per_rank),
        rank_pipeline_rank=tuple(x[1] for x in per_rank),
        rank_hosts=tuple(x[2] for x in per_rank),
    )


class StageTimer:
    """Times this rank's passes; ``collect`` (a collective) turns them into a ``StageCost``."""

    def __init__(self, *, device: torch.device, pipeline_rank: int, pipeline_size: int, keep_timeline: bool) -> None:
        self.device = device
        self.pipeline_rank = pipeline_rank
        self.pipeline_size = pipeline_size
        self.keep_timeline = keep_timeline
        self._cuda = device.type == "cuda"
        dist.barrier()
        if self._cuda:
            torch.cuda.synchronize(device)
            self._origin: Any = torch.cuda.Event(enable_timing=True)
            self._origin.record()
        self._origin_s = time.perf_counter()
        self._current: tuple[int, int] | None = None
        self._forwards: dict[int, int] = {}
        self._marks: list[tuple[str, int, int, str, Any]] = []
        self._window = [0.0, 0.0, 0.0, 0]  # forward s, backward s, idle s, microbatches (this rank)
        self._steps = 0
        self._host = host_values(this_host())
        self.timeline: deque[list[TimedPass]] = deque(maxlen=TIMELINE_STEPS)

    # ------------------------------------------------------------------ marks
    def _mark(self, kind: str, microbatch: int, chunk: int, edge: str) -> None:
        if self._cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self._marks.append((kind, microbatch, chunk, edge, event))
        else:
            self._marks.append((kind, microbatch, chunk, edge, time.perf_counter()))

    def instrument(self, chunks: list[Any]) -> None:
        """Hook each chunk's decoder input: its gradient marks the end of the chunk's backward pass."""
        from megatron_ext.training.model import unwrap

        for chunk in chunks:
            unwrap(chunk).decoder.register_forward_pre_hook(self._on_decoder_input, with_kwargs=True)

    def _on_decoder_input(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        current = self._current
        if current is None or not torch.is_grad_enabled():
            return  # evaluation, or a recomputation inside a backward pass
        hidden = kwargs.get("hidden_states", args[0] if args else None)
        if hidden is None:
            hidden = getattr(module, "input_tensor", None)
        if isinstance(hidden, torch.Tensor) and hidden.requires_grad:
            microbatch, chunk = current
            hidden.register_hook(lambda grad: self._mark("B", microbatch, chunk, "end"))

    @contextlib.contextmanager
    def weight_pass(self, microbatch: int, chunk: int) -> Iterator[None]:
        """Mark a zero-bubble schedule's W pass of ``microbatch`` through ``chunk`` (``zero_bubble_schedule``)."""
        self._mark("W", microbatch, chunk, "start")
        yield
        self._mark("W", microbatch, chunk, "end")

    def wrap(self, forward_step: Callable[..., Any]) -> Callable[..., Any]:
        """A forward_step that marks its own start and end and its backward pass's start."""

        def timed_forward_step(data_iterator: Any, model: torch.nn.Module) -> Any:
            if not torch.is_grad_enabled():
                return forward_step(data_iterator, model)
            from megatron_ext.training.model import unwrap

            chunk = int(unwrap(model).vp_stage or 0)
            # Every Megatron-Core schedule runs a chunk's forward passes in microbatch order.
            microbatch = self._forwards.get(chunk, 0)
            self._forwards[chunk] = microbatch + 1
            self._current = (microbatch, chunk)
            self._mark("F", microbatch, chunk, "start")
            try:
                output, loss_func = forward_step(data_iterator, model)
            finally:
                self._current = None
            self._mark("F", microbatch, chunk, "end")
            if isinstance(output, torch.Tensor) and output.requires_grad:
                output.register_hook(lambda grad: self._mark("B", microbatch, chunk, "start"))
            return output, loss_func

        return timed_forward_step

    # ------------------------------------------------------------------ steps
    def end_step(self) -> None:
        """Resolve this step's marks into passes and add them to the window."""
        marks, self._marks, self._forwards = self._marks, [], {}
        if not marks:
            return
        if self._cuda:
            marks[-1][4].synchronize()
            seconds = [self._origin.elapsed_time(m[4]) / 1000.0 for m in marks]
        else:
            seconds = [m[4] - self._origin_s for m in marks]
        starts: dict[tuple[str, int, int], float] = {}
        passes = []
        for (kind, microbatch, chunk, edge, _), t in zip(marks, seconds, strict=True):
            key = (kind, microbatch, chunk)
            if edge == "start":
                starts[key] = t
            elif key in starts:
                passes.append(TimedPass(self.pipeline_rank, PipelinePass(kind, microbatch, chunk), starts.pop(key), t))
        if not passes:
            return
        forward = sum(p.end - p.start for p in passes if p.step.kind == "F")
        backward = sum(p.end - p.start for p in passes if p.step.kind != "F")  # B, and W where split
        span = max(p.end for p in passes) - min(p.start for p in passes)
        microbatches = len({p.step.microbatch for p in passes})
        self._window[0] += forward
        self._window[1] += backward
        self._window[2] += max(span - forward - backward, 0.0)
        self._window[3] += microbatches
        self._steps += 1
        if self.keep_timeline:
            self.timeline.append(sorted(passes, key=lambda p: p.start))

    def collect(self) -> StageCost | None:
        """Every rank's window: per pipeline rank (the slowest of its ranks) and per global rank; resets the
        window. One all-gather (the host names travel in it), a collective."""
        forward, backward, idle, microbatches = self._window
        steps = max(self._steps, 1)
        mine = torch.tensor(
            [float(self.pipeline_rank), forward, backward, idle / steps, float(microbatches), *self._host],
            dtype=torch.float64,
            device=self.device,
        )
        self._window, self._steps = [0.0, 0.0, 0.0, 0], 0
        rows = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
        dist.all_gather(rows, mine)  # in order of global rank
        return stage_cost([row.tolist() for row in rows], pipeline_size=self.pipeline_size)

    def write_timeline(self, path: Path) -> None:
        """Gather every rank's kept passes to rank 0 and write one Chrome trace there (a collective)."""
        mine = {
            "rank": dist.get_rank(),
            "pipeline_rank": self.pipeline_rank,
            "steps": [
                [(p.step.kind, p.step.microbatch, p.step.chunk, p.start, p.end) for p in step] for step in self.timeline
            ],
        }
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, mine)
        if dist.get_rank() != 0:
            return
        write_trace(path, gathered)

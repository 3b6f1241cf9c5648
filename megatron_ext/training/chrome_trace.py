"""The ``--timeline`` file: every rank's forward and backward passes as a Chrome trace (no torch needed to read it).

``chrome://tracing`` and Perfetto open it; ``tools/plot_schedule.py --timeline``
reads it back with ``load_timeline``. One process per pipeline rank, one
thread per global rank, one complete event per pass with its microbatch,
chunk and step.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from megatron_ext.estimate.pipeline_schedule import PipelinePass, TimedPass


def write_trace(path: Path, ranks: list[dict[str, Any]]) -> None:
    """A Chrome trace: one process per pipeline rank, one thread per global rank, one slice per pass."""
    events: list[dict[str, Any]] = []
    for doc in ranks:
        stage, rank = doc["pipeline_rank"], doc["rank"]
        events.append({"name": "process_name", "ph": "M", "pid": stage, "args": {"name": f"pipeline rank {stage}"}})
        events.append({"name": "thread_name", "ph": "M", "pid": stage, "tid": rank, "args": {"name": f"rank {rank}"}})
        for step_index, step in enumerate(doc["steps"]):
            for kind, microbatch, chunk, start, end in step:
                events.append(
                    {
                        "name": f"{kind}{microbatch}.{chunk}",
                        "cat": CATEGORIES[kind],
                        "ph": "X",
                        "ts": start * 1e6,
                        "dur": (end - start) * 1e6,
                        "pid": stage,
                        "tid": rank,
                        "args": {"microbatch": microbatch, "chunk": chunk, "step": step_index},
                    }
                )
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    partial.write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}))
    partial.replace(path)


CATEGORIES = {"F": "forward", "B": "backward", "W": "weight-gradient"}
"""Each pass kind's trace category (read back by its first letter)."""


def load_timeline(path: Path) -> dict[int, list[list[TimedPass]]]:
    """Passes per pipeline rank and step from a trace ``write_trace`` wrote (the first rank of each stage)."""
    doc = json.loads(path.read_text())
    first_thread: dict[int, int] = {}
    steps: dict[int, dict[int, list[TimedPass]]] = {}
    for event in doc["traceEvents"]:
        if event.get("ph") != "X":
            continue
        stage, rank = int(event["pid"]), int(event["tid"])
        if first_thread.setdefault(stage, rank) != rank:
            continue
        args = event["args"]
        start, end = event["ts"] / 1e6, (event["ts"] + event["dur"]) / 1e6
        step = PipelinePass(event["cat"][0].upper(), int(args["microbatch"]), int(args["chunk"]))
        timed = TimedPass(stage, step, start, end)
        steps.setdefault(stage, {}).setdefault(int(args["step"]), []).append(timed)
    return {stage: [by_step[s] for s in sorted(by_step)] for stage, by_step in sorted(steps.items())}

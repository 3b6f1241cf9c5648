"""``--profile`` with ``--use-pytorch-profiler``: the steps Megatron-LM profiles, in a trace per rank."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from megatron_ext.config.arguments import ConfigError
from megatron_ext.config.run_args import RunArgs
from megatron_ext.training.profiling import Profiler

pytestmark = pytest.mark.unit


def _profiled_steps(tmp_path: Path, *, first: int, start: int, end: int, iterations: int, rank: int = 0) -> list[int]:
    run = RunArgs(
        profile=True,
        use_pytorch_profiler=True,
        profile_step_start=start,
        profile_step_end=end,
        profile_ranks=(0,),
        tensorboard_dir=str(tmp_path),
    )
    profiler = Profiler(run, rank=rank, is_last_rank=True, device=torch.device("cpu"), first_iteration=first)
    for done in range(first, iterations):
        profiler.before_step(done)
        with torch.profiler.record_function(f"iteration {done + 1}"):
            torch.ones(8, 8) @ torch.ones(8, 8)
        profiler.after_step(done + 1)
    profiler.close()
    traces = list(tmp_path.glob("*.pt.trace.json"))
    if not traces:
        return []
    (trace,) = traces
    names = {e.get("name", "") for e in json.loads(trace.read_text())["traceEvents"]}
    return sorted(int(n.split()[1]) for n in names if n.startswith("iteration "))


def test_it_records_the_iterations_after_the_start_up_to_the_end(tmp_path: Path) -> None:
    # Megatron-LM's defaults: 10 iterations done, then 11 and 12 are recorded.
    assert _profiled_steps(tmp_path / "a", first=0, start=10, end=12, iterations=20) == [11, 12]
    # Resumed at iteration 3: the same global steps.
    assert _profiled_steps(tmp_path / "b", first=3, start=5, end=8, iterations=20) == [6, 7, 8]
    # Resumed inside the window: what is left of it.
    assert _profiled_steps(tmp_path / "c", first=6, start=5, end=8, iterations=20) == [7, 8]
    # A run that ends inside the window still writes what it recorded.
    assert _profiled_steps(tmp_path / "d", first=0, start=2, end=8, iterations=5) == [3, 4, 5]


def test_only_the_profiled_ranks_write_a_trace(tmp_path: Path) -> None:
    assert _profiled_steps(tmp_path, first=0, start=1, end=2, iterations=3, rank=1) == []
    assert not tmp_path.exists() or not any(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"profile_step_start": 3}, "apply only with --profile"),
        ({"profile": True, "profile_step_start": 5, "profile_step_end": 5}, "must be after"),
        ({"profile": True, "use_pytorch_profiler": True}, "into --tensorboard-dir"),
        ({"profile": True, "device": "cpu"}, "add --use-pytorch-profiler"),
        ({"record_memory_history": True, "device": "cpu"}, "needs a GPU"),
        ({"memory_snapshot_path": "m.pickle"}, "only with --record-memory-history"),
    ],
)
def test_contradictions_are_named(flags: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        RunArgs(**flags)  # type: ignore[arg-type]


def test_nvtx_ranges_and_memory_history_need_a_gpu_found_at_run_time() -> None:
    for run in (RunArgs(profile=True), RunArgs(record_memory_history=True)):
        with pytest.raises(ConfigError, match="GPU"):
            Profiler(run, rank=0, is_last_rank=True, device=torch.device("cpu"), first_iteration=0)

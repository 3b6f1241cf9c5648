"""Pipeline order and timeline: against Megatron-Core's own functions, a recorded CPU run, and the bubble formula."""

from __future__ import annotations

import io
import itertools
import struct
import subprocess
import sys
import types
import xml.etree.ElementTree as ET
import zlib
from pathlib import Path

import pytest

from megatron_ext.cli.plot_schedule import main as run
from megatron_ext.estimate.pipeline_schedule import PipelinePass, schedule_order, schedule_table, simulate
from megatron_ext.estimate.schedule_plot import (
    BACKWARD_COLORS,
    FORWARD_COLORS,
    IDLE,
    LEFT,
    PngCanvas,
    geometry,
    render_png,
    render_svg,
)
from megatron_ext.parallel.layout import LayoutError
from megatron_ext.parallel.pipeline import warmup_passes
from megatron_ext.training.schedule_trace import load_trace
from tests.conftest import REPO, spawn_ranks
from tests.waits import QUICK_S, RUN_S

SHAPES = [(2, 1, 4), (4, 1, 8), (4, 1, 2), (2, 2, 4), (4, 2, 8), (4, 3, 12), (8, 2, 16), (3, 4, 9), (4, 2, 4)]


# ------------------------------------------------------------------ Megatron-Core's own helpers
@pytest.mark.unit
def test_schedule_table_is_megatron_cores() -> None:
    from megatron.core.pipeline_parallel.schedules import get_schedule_table

    for m, v, group in [(8, 2, 4), (5, 2, 3), (12, 3, 4), (16, 4, 4), (9, 4, 3), (6, 2, 6)]:
        assert schedule_table(m, v, group) == get_schedule_table(m, v, group)


@pytest.mark.unit
def test_warmup_counts_are_megatron_cores() -> None:
    from megatron.core.pipeline_parallel.schedules import get_pp_rank_microbatches

    for p, v, m in SHAPES:
        # The default microbatch group (p) and, interleaved, every larger one the schedule accepts.
        groups = [p] + ([n for n in range(p + 1, m + 1) if not 0 < m % n < p] if v > 1 else [])
        for n in groups:
            for rank in range(p):
                # Megatron-Core reads the pipeline group's size and rank from its communicator.
                group = types.SimpleNamespace(size=lambda p=p: p, rank=lambda rank=rank: rank)
                communicator = types.SimpleNamespace(
                    pp_group=group, virtual_pipeline_model_parallel_size=v if v > 1 else None
                )
                _, _, warmup, _ = get_pp_rank_microbatches(m, v, n, p2p_communicator=communicator)
                ours = warmup_passes(pp=p, vp=v, num_microbatches=m, pipeline_rank=rank, group_size=n)
                assert ours == min(warmup, m * v), (p, v, m, n, rank)


@pytest.mark.unit
@pytest.mark.parametrize(("p", "v", "m"), SHAPES)
def test_every_pass_runs_once_and_backward_after_forward(p: int, v: int, m: int) -> None:
    for rank in range(p):
        order = schedule_order(pp=p, vp=v, num_microbatches=m, pipeline_rank=rank)
        assert sorted(order, key=lambda s: (s.kind, s.microbatch, s.chunk)) == sorted(
            [PipelinePass(k, mb, c) for k in "BF" for mb in range(m) for c in range(v)],
            key=lambda s: (s.kind, s.microbatch, s.chunk),
        )
        for step in order:
            if step.kind == "B":
                assert order.index(PipelinePass("F", step.microbatch, step.chunk)) < order.index(step)


@pytest.mark.unit
def test_known_order_of_the_last_rank_of_an_interleaved_pipeline() -> None:
    """p=2, v=2, m=4 on rank 1 (warm-up (v−1)·p = 2): the order Megatron-Core's tables give by hand."""
    order = schedule_order(pp=2, vp=2, num_microbatches=4, pipeline_rank=1)
    text = " ".join(f"{s.kind}{s.microbatch}.{s.chunk}" for s in order)
    assert text == "F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 F2.0 B0.0 F3.0 B1.0 F2.1 B2.1 F3.1 B3.1 B2.0 B3.0"


@pytest.mark.unit
def test_invalid_pipelines_get_the_layout_messages() -> None:
    with pytest.raises(LayoutError, match=r"microbatches per step \(6 = .*fewer than pipeline\(4\)"):
        schedule_order(pp=4, vp=2, num_microbatches=6, pipeline_rank=0)
    with pytest.raises(LayoutError, match="needs pipeline parallelism"):
        schedule_order(pp=1, vp=2, num_microbatches=4, pipeline_rank=0)


# ------------------------------------------------------------------ timeline and bubble
@pytest.mark.unit
@pytest.mark.parametrize(("p", "v", "m"), SHAPES)
@pytest.mark.parametrize(("tf", "tb"), [(1.0, 2.0), (1.0, 1.0), (2.0, 3.0)])
def test_simulated_bubble_equals_the_formula(p: int, v: int, m: int, tf: float, tb: float) -> None:
    timeline = simulate(pp=p, vp=v, num_microbatches=m, forward_time=tf, backward_time=tb)
    assert timeline.makespan == pytest.approx((m + (p - 1) / v) * (tf + tb))
    assert timeline.bubble_of_ideal == pytest.approx((p - 1) / (v * m))
    assert timeline.bubble_of_step == pytest.approx((p - 1) / (v * m + p - 1))
    # No rank runs two passes at once, and each is as long as its kind says.
    for rank in range(p):
        passes = [t for t in timeline.passes if t.rank == rank]
        assert all(a.end <= b.start + 1e-9 for a, b in itertools.pairwise(passes))
        assert sum(t.end - t.start for t in passes) == pytest.approx(m * (tf + tb))


@pytest.mark.unit
def test_p2p_time_lengthens_the_step() -> None:
    base = simulate(pp=4, vp=2, num_microbatches=8)
    slow = simulate(pp=4, vp=2, num_microbatches=8, p2p_time=0.25)
    assert slow.makespan > base.makespan


# ------------------------------------------------------------------ pictures
def decode_png(data: bytes) -> tuple[int, int, bytes]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width, height = 8, b"", 0, 0
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        tag, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length : pos + 12 + length])
        assert crc == zlib.crc32(tag + body) & 0xFFFFFFFF
        if tag == b"IHDR":
            width, height, depth, color_type = struct.unpack(">IIBB", body[:10])
            assert (depth, color_type) == (8, 2)
        elif tag == b"IDAT":
            idat += body
        pos += 12 + length
    raw = zlib.decompress(idat)
    assert len(raw) == height * (1 + 3 * width)
    return width, height, raw


def pixel(raw: bytes, width: int, x: int, y: int) -> tuple[int, int, int]:
    start = y * (1 + 3 * width) + 1 + 3 * x
    return raw[start], raw[start + 1], raw[start + 2]


@pytest.mark.unit
def test_png_shows_passes_and_idle_time() -> None:
    timeline = simulate(pp=4, vp=2, num_microbatches=8)
    width, height, raw = decode_png(render_png(timeline, width=1000))
    geo = geometry(timeline, width=1000)
    assert (width, height) == (geo.width, geo.height)
    row = lambda rank: int(geo.y(rank) + 3)  # noqa: E731 (top of the row, above the labels)
    # At time 0 rank 0 runs the forward of microbatch 0, chunk 0; the last rank is still idle.
    assert pixel(raw, width, LEFT + 2, row(0)) == FORWARD_COLORS[0]
    assert pixel(raw, width, LEFT + 2, row(3)) == IDLE
    # At the very end rank 0 runs the last backward of chunk 0, the last rank already waits.
    end = int(geo.x(timeline.makespan)) - 3
    assert pixel(raw, width, end, row(0)) == BACKWARD_COLORS[0]
    assert pixel(raw, width, end, row(3)) == IDLE


@pytest.mark.unit
def test_svg_has_one_box_per_pass_and_the_bubble_in_the_title() -> None:
    timeline = simulate(pp=4, vp=2, num_microbatches=8)
    root = ET.fromstring(render_svg(timeline))
    ns = "{http://www.w3.org/2000/svg}"
    fills = [r.get("fill") for r in root.iter(f"{ns}rect")]
    boxes = [f for f in fills if f in {f"rgb{c}" for c in FORWARD_COLORS + BACKWARD_COLORS}]
    assert len(boxes) == 2 * 4 * 2 * 8 + 2 * 2  # every pass on every rank, plus the legend swatches
    title = next(root.iter(f"{ns}text")).text or ""
    assert "(p-1)/(v*m) = 3/(2*8) = 18.75% of ideal" in title and "timeline 18.75% of ideal" in title


@pytest.mark.unit
def test_png_font_draws_text() -> None:
    canvas = PngCanvas(40, 20)
    canvas.text(2, 2, "F0")
    assert any(canvas.pixel(x, y) != (255, 255, 255) for x in range(40) for y in range(20))


@pytest.mark.unit
def test_plot_schedule_cli(tmp_path: Path) -> None:
    out, err = io.StringIO(), io.StringIO()
    stem = tmp_path / "p4v2m8"
    assert (
        run(["--pp", "4", "--vp", "2", "-m", "8", "--output", str(stem), "--print-order"], stdout=out, stderr=err) == 0
    )
    text = out.getvalue()
    assert "bubble: formula (p-1)/(v*m) = 3/(2*8) = 18.75% of the ideal time; timeline: 18.75% of the ideal" in text
    assert "rank 3: F0.0 F1.0 F2.0 F3.0 F0.1 B0.1" in text
    decode_png(stem.with_suffix(".png").read_bytes())
    ET.fromstring(stem.with_suffix(".svg").read_text())
    assert run(["--pp", "4", "--vp", "2", "-m", "6"], stdout=out, stderr=err) == 2
    assert "fewer than pipeline(4)" in err.getvalue()
    # The script itself, as a user runs it.
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "tools" / "plot_schedule.py"),
            "--pp",
            "2",
            "-m",
            "3",
            "--output",
            str(tmp_path / "s"),
        ],
        capture_output=True,
        text=True,
        timeout=QUICK_S,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr
    assert "bubble: formula (p-1)/(v*m) = 1/(1*3) = 33.33% of the ideal time" in proc.stdout
    assert (tmp_path / "s.png").exists() and (tmp_path / "s.svg").exists()


# ------------------------------------------------------------------ against a recorded run of the real schedule
def record(tmp_path: Path, *, pp: int, vp: int, microbatches: int) -> dict[int, list[PipelinePass]]:
    """Train one step on ``pp`` CPU processes (gloo) with Megatron-Core's schedule, recording each rank's passes."""
    trace = tmp_path / "trace"
    args = [
        "--schedule-trace", str(trace), "--mock-data", "--device", "cpu", "--num-layers", str(pp * vp),
        "--hidden-size", "32", "--num-attention-heads", "2", "--seq-length", "16", "--vocab-size", "63",
        "--pipeline-model-parallel-size", str(pp), "--micro-batch-size", "1",
        "--global-batch-size", str(microbatches), "--train-iters", "1",
    ]  # fmt: skip
    if vp > 1:
        args += ["--num-layers-per-virtual-pipeline-stage", "1"]
    proc = spawn_ranks(args, nproc=pp, timeout=RUN_S, script=REPO / "tools" / "record_schedule.py")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return load_trace(trace)


@pytest.mark.distributed
@pytest.mark.parametrize(("p", "v", "m"), [(4, 2, 8), (3, 1, 5)], ids=["interleaved-p4-v2-m8", "1f1b-p3-m5"])
def test_order_matches_a_recorded_cpu_run_of_megatron_cores_schedule(tmp_path: Path, p: int, v: int, m: int) -> None:
    recorded = record(tmp_path, pp=p, vp=v, microbatches=m)
    assert sorted(recorded) == list(range(p))
    for rank in range(p):
        assert recorded[rank] == schedule_order(pp=p, vp=v, num_microbatches=m, pipeline_rank=rank), f"rank {rank}"
    # The recorded order, placed on the timeline, has the formula's bubble too.
    timeline = simulate(pp=p, vp=v, num_microbatches=m, orders=[recorded[r] for r in range(p)])
    assert timeline.bubble_of_ideal == pytest.approx((p - 1) / (v * m))


@pytest.mark.unit
def test_the_slowest_stage_sets_the_pace() -> None:
    """Per-chunk times (uneven or measured stages): the step is at least m times the slowest stage's work."""
    even = simulate(pp=4, vp=1, num_microbatches=8)
    slow_last = [[(1.0, 2.0)]] * 3 + [[(2.0, 4.0)]]
    timeline = simulate(pp=4, vp=1, num_microbatches=8, chunk_times=slow_last)
    assert timeline.ideal == 8 * 6.0  # the slowest stage's busy time
    assert timeline.makespan >= timeline.ideal > even.makespan
    # A faster stage does not help: the others wait for the slowest.
    fast_first = [[(0.5, 1.0)]] + [[(1.0, 2.0)]] * 3
    assert simulate(pp=4, vp=1, num_microbatches=8, chunk_times=fast_first).makespan == pytest.approx(
        even.makespan, rel=0.1
    )
    with pytest.raises(ValueError, match="4 ranks × 2 chunks"):
        simulate(pp=4, vp=2, num_microbatches=8, chunk_times=slow_last)


@pytest.mark.unit
def test_a_broken_order_is_refused() -> None:
    """A recorded or hand-written order that names a pass outside the step, or waits for a pass no rank runs,
    is an error, not a timeline (the sweep would otherwise wait forever)."""
    orders = [schedule_order(pp=2, vp=1, num_microbatches=4, pipeline_rank=r) for r in range(2)]
    with pytest.raises(ValueError, match="outside m=4, v=1"):
        simulate(pp=2, vp=1, num_microbatches=4, orders=[orders[0] + [PipelinePass("F", 4, 0)], orders[1]])
    missing = [step for step in orders[1] if step != PipelinePass("B", 2, 0)]
    with pytest.raises(RuntimeError, match="deadlocks"):
        simulate(pp=2, vp=1, num_microbatches=4, orders=[orders[0], missing])
    # The same orders, whole, place.
    assert simulate(pp=2, vp=1, num_microbatches=4, orders=orders).makespan == pytest.approx(4 * 3 + 3)

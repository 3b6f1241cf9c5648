"""Command line of ``tools/plot_metrics.py``: the training curves of one or more ``--metrics-file``s, as one PNG.

One panel above the other, sharing the iteration axis:

* the loss: training (``lm_loss``, a line) and validation where the run evaluated (``valid_loss``, dashed, with
  markers);
* the throughput: tokens/s (``tokens_per_sec``), or TFLOP/s per GPU (``tflops_per_gpu``) where no file has
  tokens/s (``--throughput`` chooses);
* where the runs timed their pipeline stages (``stage_forward_ms``, ``stage_backward_ms``), the forward +
  backward time of one microbatch through each stage.

One colour per file, named in the legend by ``--label`` or by the file's name. After resumes only the run that
continued is drawn (``estimate.metrics_file``): the rows a resume superseded are left out, or drawn faint as
crosses with ``--show-superseded``; each later start's resume iteration is a dotted vertical line.

Drawn with matplotlib's Agg canvas (no display), rendered in memory and written to ``--output`` by a rename:
nothing is left at that path unless the whole picture is.
"""

from __future__ import annotations

import argparse
import io
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from megatron_ext.config.exit_codes import ExitCode, fail
from megatron_ext.data.atomic_files import WriteError, replace_file
from megatron_ext.estimate.metrics_file import (
    TRAINING_LOSS,
    VALIDATION_LOSS,
    MetricsFile,
    MetricsFileError,
    Row,
    read_metrics_file,
)

THROUGHPUTS = {
    "tokens": ("tokens_per_sec", "tokens/s"),
    "tflops": ("tflops_per_gpu", "TFLOP/s per GPU"),
}
"""``--throughput`` choice: (the rows' key, the axis label)."""

DPI = 100
"""Pixels per inch of the picture: ``--width`` and ``--height`` are pixels."""
SMALLEST = (300, 200)
LARGEST = 10_000
STAGE_STYLES = ("-", "--", ":", "-.")
"""Line styles of the pipeline stages, in turn (the colour is the file's)."""

Points = list[tuple[int, float]]


class PlotError(Exception):
    """Input that cannot be drawn, or a missing matplotlib; the message says what and how to fix it."""

    def __init__(self, message: str, code: ExitCode = ExitCode.ERROR) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, kw_only=True)
class Curves:
    """What one metrics file contributes to the picture: (iteration, value) points of each curve."""

    label: str
    training: Points
    validation: Points
    throughput: Points
    stages: list[Points]
    """Forward + backward ms per microbatch of each pipeline stage (empty: not recorded)."""
    superseded_training: Points
    superseded_throughput: Points
    resumes: list[int]
    """The resume iteration of each start after the first."""


def build_parser() -> argparse.ArgumentParser:
    """The tool's options (``--help``)."""
    parser = argparse.ArgumentParser(
        prog="tools/plot_metrics.py",
        description="Draw the loss, throughput and pipeline stage times of pretrain_gpt.py --metrics-file runs "
        "(one or more; one line each) to a PNG. After resumes only the run that continued is drawn.",
        allow_abbrev=False,
    )
    parser.add_argument("metrics", nargs="+", type=Path, metavar="METRICS", help="A --metrics-file (JSON Lines).")
    parser.add_argument("--output", type=Path, required=True, metavar="FILE.png", help="The PNG to write.")
    parser.add_argument(
        "--label",
        action="append",
        default=[],
        help="The legend's name of each file, in the order of the files (default: the file's name).",
    )
    parser.add_argument(
        "--throughput",
        choices=["auto", *THROUGHPUTS],
        default="auto",
        help="tokens/s or TFLOP/s per GPU (default auto: tokens/s where any file has it).",
    )
    parser.add_argument(
        "--show-superseded",
        action="store_true",
        help="Also draw, faint, the rows an earlier start logged past the iteration a later one resumed from.",
    )
    parser.add_argument("--width", type=int, default=1200, help="Picture width in pixels (default 1200).")
    parser.add_argument("--height", type=int, default=900, help="Picture height in pixels (default 900).")
    return parser


def main(argv: Sequence[str] | None = None, *, stdout: TextIO | None = None, stderr: TextIO | None = None) -> int:
    """Read the files, draw, write the PNG and say what was drawn; the exit code (``config.exit_codes``)."""
    out, err = stdout or sys.stdout, stderr or sys.stderr
    args = build_parser().parse_args(argv)
    try:
        _check_options(args)
        files = [read_metrics_file(path) for path in args.metrics]
        key = _throughput_key(args.throughput, files)
        labels = args.label or _default_labels(args.metrics)
        curves = [
            curves_of(f, label=label, throughput_key=key, superseded=args.show_superseded)
            for f, label in zip(files, labels, strict=True)
        ]
        png = draw(curves, throughput_key=key, width=args.width, height=args.height)
        _publish(args.output, png)
    except (MetricsFileError, PlotError, WriteError) as exc:
        return fail(exc, exc.code if isinstance(exc, PlotError) else ExitCode.ERROR, file=err)
    print(f"wrote {args.output}", file=out)
    for f, c in zip(files, curves, strict=True):
        print(f"  {c.label}: {_summary(f, c)}", file=out)
    return ExitCode.OK


def _check_options(args: argparse.Namespace) -> None:
    """The options that need no file read (PlotError with ExitCode.INVALID)."""
    if args.label and len(args.label) != len(args.metrics):
        raise PlotError(
            f"{len(args.label)} --label for {len(args.metrics)} metrics file(s): give one per file, in order, or none",
            ExitCode.INVALID,
        )
    if args.output.suffix.lower() != ".png":
        raise PlotError(f"--output {args.output}: name it FILE.png (the picture is a PNG)", ExitCode.INVALID)
    if not args.output.parent.is_dir():
        raise PlotError(f"--output {args.output}: the directory {args.output.parent} does not exist", ExitCode.INVALID)
    for name, value, smallest in (("--width", args.width, SMALLEST[0]), ("--height", args.height, SMALLEST[1])):
        if not smallest <= value <= LARGEST:
            raise PlotError(f"{name} {value}: give {smallest} to {LARGEST} pixels", ExitCode.INVALID)


def _default_labels(paths: Sequence[Path]) -> list[str]:
    """Each file's name, or the path as given where two files share a name."""
    names = [p.name for p in paths]
    return [p.name if names.count(p.name) == 1 else str(p) for p in paths]


def _throughput_key(choice: str, files: Sequence[MetricsFile]) -> str | None:
    """The rows' key of the throughput panel (None: no file has any throughput)."""
    if choice != "auto":
        return THROUGHPUTS[choice][0]
    for key, _ in THROUGHPUTS.values():
        if any(key in row.values for f in files for row in f.all_rows):
            return key
    return None


def curves_of(metrics: MetricsFile, *, label: str, throughput_key: str | None, superseded: bool) -> Curves:
    """The curves of one file; ``superseded``: keep the superseded rows' loss and throughput apart.

    A PlotError names the file when it has no training loss to draw (or only superseded ones, without
    ``superseded``)."""
    kept = [r for r in metrics.all_rows if not r.superseded]
    gone = [r for r in metrics.all_rows if r.superseded]
    training, earlier = _points(kept, TRAINING_LOSS), _points(gone, TRAINING_LOSS)
    if not _finite(training) and not (superseded and _finite(earlier)):
        lines = f"lines 1 to {metrics.all_rows[-1].line}" if metrics.all_rows else "no rows"
        if _finite(earlier):
            why = f"every training loss ({TRAINING_LOSS}) in {lines} was superseded by a later start's resume; "
            raise PlotError(f"{metrics.path}: {why}--show-superseded draws them")
        if training or earlier:
            raise PlotError(
                f"{metrics.path}: every training loss ({TRAINING_LOSS}) in {lines} is null (not finite): "
                "nothing to draw; the run diverged from its first logged iteration"
            )
        raise PlotError(
            f"{metrics.path}: no training loss ({TRAINING_LOSS}) in {lines}; a run logs it every --log-interval "
            "iterations: give the file of a run that logged at least one"
        )
    stage_count = max((len(r.values.get("stage_forward_ms") or []) for r in kept), default=0)
    return Curves(
        label=label,
        training=training,
        validation=_points(kept, VALIDATION_LOSS),
        throughput=_points(kept, throughput_key) if throughput_key else [],
        stages=[_stage_points(kept, stage) for stage in range(stage_count)],
        superseded_training=earlier if superseded else [],
        superseded_throughput=_points(gone, throughput_key) if superseded and throughput_key else [],
        resumes=[s.resumed_from_iteration for s in metrics.starts[1:] if s.resumed_from_iteration is not None],
    )


def _points(rows: Sequence[Row], key: str) -> Points:
    """(iteration, value) of the rows that have ``key``; a value written as null (not finite) is NaN: a gap."""
    out = []
    for row in rows:
        if row.iteration is None or key not in row.values:
            continue
        value = row.values[key]
        if value is None or (isinstance(value, int | float) and not isinstance(value, bool)):
            out.append((row.iteration, math.nan if value is None else float(value)))
    return out


def _finite(points: Points) -> bool:
    """Whether any of ``points`` has a finite value."""
    return any(math.isfinite(value) for _, value in points)


def _stage_points(rows: Sequence[Row], stage: int) -> Points:
    """(iteration, forward + backward ms of one microbatch through pipeline stage ``stage``) where recorded."""
    out = []
    for row in rows:
        forward, backward = row.values.get("stage_forward_ms") or [], row.values.get("stage_backward_ms") or []
        pair = (forward[stage], backward[stage]) if stage < min(len(forward), len(backward)) else ()
        if row.iteration is not None and pair and all(isinstance(v, int | float) for v in pair):
            out.append((row.iteration, float(pair[0]) + float(pair[1])))
    return out


def draw(curves: Sequence[Curves], *, throughput_key: str | None, width: int, height: int) -> bytes:
    """The picture as PNG bytes, ``width`` × ``height`` pixels (PlotError without matplotlib)."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise PlotError(
            "tools/plot_metrics.py draws with matplotlib, which is not installed: pip install matplotlib "
            "(or pip install -e .[plot]; bash scripts/setup.sh installs it)"
        ) from None
    throughput = throughput_key is not None and any(c.throughput or c.superseded_throughput for c in curves)
    stages = any(c.stages for c in curves)
    figure = Figure(figsize=(width / DPI, height / DPI), dpi=DPI, layout="constrained")
    FigureCanvasAgg(figure)
    axes = list(figure.subplots(1 + throughput + stages, 1, sharex=True, squeeze=False)[:, 0])
    colours = [f"C{i % 10}" for i in range(len(curves))]
    loss = axes[0]
    for c, colour in zip(curves, colours, strict=True):
        _line(loss, c.training, colour, f"{c.label}: training")
        _line(loss, c.validation, colour, f"{c.label}: validation", style="--", marker="o")
        _crosses(loss, c.superseded_training, colour, f"{c.label}: superseded")
        for iteration in c.resumes:
            for ax in axes:
                ax.axvline(iteration, color=colour, linestyle=":", linewidth=0.8, alpha=0.6)
    loss.set_ylabel("loss")
    loss.set_title("loss" + (" (dotted: where a start resumed)" if any(c.resumes for c in curves) else ""))
    panels = axes[1:]
    if throughput and throughput_key is not None:
        ax = panels.pop(0)
        name = next(label for key, label in THROUGHPUTS.values() if key == throughput_key)
        for c, colour in zip(curves, colours, strict=True):
            _line(ax, c.throughput, colour, c.label)
            _crosses(ax, c.superseded_throughput, colour, f"{c.label}: superseded")
        ax.set_ylabel(name)
        ax.set_title(f"throughput ({name})")
    if stages:
        ax = panels.pop(0)
        for c, colour in zip(curves, colours, strict=True):
            for stage, points in enumerate(c.stages):
                style = STAGE_STYLES[stage % len(STAGE_STYLES)]
                _line(ax, points, colour, f"{c.label}: stage {stage}", style=style)
        ax.set_ylabel("ms per microbatch")
        ax.set_title("pipeline stages: forward + backward of one microbatch")
    for ax in axes:
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small", loc="best")
    axes[-1].set_xlabel("iteration")
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=DPI)
    return buffer.getvalue()


def _line(ax: Any, points: Points, colour: str, label: str, *, style: str = "-", marker: str | None = None) -> None:
    if points:
        xs, ys = zip(*points, strict=True)
        ax.plot(xs, ys, linestyle=style, marker=marker, markersize=3, color=colour, label=label)


def _crosses(ax: Any, points: Points, colour: str, label: str) -> None:
    if points:
        xs, ys = zip(*points, strict=True)
        ax.scatter(xs, ys, marker="x", s=12, color=colour, alpha=0.35, label=label)


def _publish(path: Path, png: bytes) -> None:
    """``png`` at ``path``, written to a temporary beside it and renamed (WriteError: nothing left)."""
    replace_file(path, png)


def _summary(metrics: MetricsFile, curves: Curves) -> str:
    """One line of what was drawn from a file."""
    finite = [(i, v) for i, v in curves.training if math.isfinite(v)]
    parts = []
    if finite:
        (first, a), (last, b) = finite[0], finite[-1]
        parts.append(f"loss {a:.3f} at iteration {first} -> {b:.3f} at iteration {last}")
    parts.append(f"{len(metrics.starts)} start(s)")
    superseded = sum(r.superseded for r in metrics.all_rows)
    if superseded:
        drawn = "drawn faint" if curves.superseded_training else "left out"
        parts.append(f"{superseded} superseded row(s) {drawn}")
    return "; ".join(parts)

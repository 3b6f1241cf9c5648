"""``tools/plot_metrics.py`` on metrics files written here: a PNG of the asked size with a curve per file, the
rows a resume superseded left out (or drawn), files from before the start marks, and every refusal with its
exit code and nothing written."""

from __future__ import annotations

import io
import json
import math
import re
import struct
import sys
from pathlib import Path
from typing import Any

import pytest

from megatron_ext.cli.plot_metrics import _throughput_key, curves_of, main
from megatron_ext.config.exit_codes import ExitCode
from megatron_ext.estimate.metrics_file import RUN_RECORD, read_metrics_file, start_marks

pytestmark = pytest.mark.unit

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
BLUE, ORANGE = (0x1F, 0x77, 0xB4), (0xFF, 0x7F, 0x0E)
"""matplotlib's first two colours (C0, C1): the first and second file's."""


def _rows(first: int, last: int, *, stages: bool = False, throughput: str = "tokens_per_sec") -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for i in range(first, last + 1):
        row: dict[str, Any] = {"iteration": i, "lm_loss": 2 + 8 * math.exp(-i / 10), throughput: 1000.0 + 10 * i}
        if stages:
            row |= {"stage_forward_ms": [3.0, 3.5], "stage_backward_ms": [6.0, 7.0]}
        rows.append(row)
        if i % 10 == 0:
            rows.append({"iteration": i, "valid_loss": 2.5 + 8 * math.exp(-i / 10)})
    return rows


def _start(index: int | None, resumed: int = 0) -> dict[str, Any]:
    marks = {} if index is None else start_marks(start=index, resumed_from_iteration=resumed, started_at=1.8e9)
    return {RUN_RECORD: marks | {"world_size": 2}}


def _write(path: Path, lines: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    return path


def _resumed(path: Path, **kwargs: Any) -> Path:
    """Crashed at 27 after a checkpoint of 20, resumed to 40."""
    return _write(path, [_start(0), *_rows(1, 27, **kwargs), _start(1, resumed=20), *_rows(21, 40, **kwargs)])


def _plot(*args: str | Path) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main([str(a) for a in args], stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def _size(png: Path) -> tuple[int, int]:
    data = png.read_bytes()
    assert data[:8] == PNG_SIGNATURE, f"{png} is not a PNG"
    width, height = struct.unpack(">II", data[16:24])  # the IHDR chunk, first after the signature
    return width, height


def _pixels_of(png: Path, colour: tuple[int, int, int]) -> int:
    """How many pixels are ``colour`` (within anti-aliasing's reach)."""
    import numpy as np
    from matplotlib.image import imread

    rgb = imread(png)[..., :3]
    return int((np.abs(rgb - np.asarray(colour) / 255).max(axis=-1) < 0.06).sum())


def test_files_are_drawn_one_colour_each_on_a_png_of_the_asked_size(tmp_path: Path) -> None:
    a = _resumed(tmp_path / "a.jsonl", stages=True)
    b = _write(tmp_path / "b.jsonl", [_start(0), *_rows(1, 40)])
    code, out, err = _plot(a, b, "--output", tmp_path / "both.png", "--width", "640", "--height", "480")
    assert code == ExitCode.OK, err
    assert _size(tmp_path / "both.png") == (640, 480)
    assert "a.jsonl: loss " in out and "7 superseded row(s) left out" in out
    # An empty picture: one logged iteration, a point and no line (its legend's sample is all the blue there is).
    lone = _write(tmp_path / "lone.jsonl", [_start(0), *_rows(1, 1)])
    assert _plot(lone, "--output", tmp_path / "lone.png", "--width", "640", "--height", "480")[0] == ExitCode.OK
    blue_in_lone = _pixels_of(tmp_path / "lone.png", BLUE)
    assert _pixels_of(tmp_path / "both.png", BLUE) > 5 * blue_in_lone + 500
    assert _pixels_of(tmp_path / "both.png", ORANGE) > 5 * _pixels_of(tmp_path / "lone.png", ORANGE) + 500


def test_the_rows_a_resume_superseded_are_left_out_unless_asked_for(tmp_path: Path) -> None:
    metrics = read_metrics_file(_resumed(tmp_path / "a.jsonl"))
    plain = curves_of(metrics, label="a", throughput_key="tokens_per_sec", superseded=False)
    assert [i for i, _ in plain.training] == list(range(1, 41))
    assert [i for i, _ in plain.validation] == [10, 20, 30, 40]
    assert plain.superseded_training == [] and plain.resumes == [20]
    shown = curves_of(metrics, label="a", throughput_key="tokens_per_sec", superseded=True)
    assert [i for i, _ in shown.superseded_training] == list(range(21, 28))
    assert [i for i, _ in shown.superseded_throughput] == list(range(21, 28))
    # Drawn, they change the picture.
    for name, extra in (("left-out", []), ("shown", ["--show-superseded"])):
        assert _plot(metrics.path, "--output", tmp_path / f"{name}.png", *extra)[0] == ExitCode.OK
    assert (tmp_path / "left-out.png").read_bytes() != (tmp_path / "shown.png").read_bytes()


def test_a_file_from_before_the_start_marks_is_drawn(tmp_path: Path) -> None:
    old = _write(tmp_path / "old.jsonl", [_start(None), *_rows(1, 27), _start(None), *_rows(21, 40)])
    curves = curves_of(read_metrics_file(old), label="old", throughput_key=None, superseded=False)
    assert [i for i, _ in curves.training] == list(range(1, 41))
    code, out, err = _plot(old, "--output", tmp_path / "old.png", "--label", "before the marks")
    assert code == ExitCode.OK, err
    assert "before the marks: loss" in out and _size(tmp_path / "old.png") == (1200, 900)


def test_stage_times_and_the_throughput_are_what_the_files_have(tmp_path: Path) -> None:
    staged = read_metrics_file(_resumed(tmp_path / "staged.jsonl", stages=True))
    curves = curves_of(staged, label="s", throughput_key="tokens_per_sec", superseded=False)
    assert [[ms for _, ms in stage][:1] for stage in curves.stages] == [[9.0], [10.5]]
    assert [i for i, _ in curves.stages[0]] == list(range(1, 41))
    gap = {"iteration": 41, "lm_loss": 2.0, "stage_forward_ms": [None, 3.5], "stage_backward_ms": [6.0, 7.0]}
    with_gap = read_metrics_file(_write(tmp_path / "gap.jsonl", [_start(0), *_rows(1, 2, stages=True), gap]))
    stages = curves_of(with_gap, label="g", throughput_key=None, superseded=False).stages
    assert [[i for i, _ in points] for points in stages] == [[1, 2], [1, 2, 41]]  # a null time is no point
    flops = read_metrics_file(_resumed(tmp_path / "flops.jsonl", throughput="tflops_per_gpu"))
    assert _throughput_key("auto", [flops]) == "tflops_per_gpu"
    assert _throughput_key("auto", [flops, staged]) == "tokens_per_sec"
    assert _throughput_key("tflops", [staged]) == "tflops_per_gpu"
    assert curves_of(flops, label="f", throughput_key="tokens_per_sec", superseded=False).throughput == []


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda d: d / "missing.jsonl", r"missing.jsonl: cannot read it"),
        (lambda d: _write(d / "cfg.jsonl", [{"model": "gpt"}]), r"cfg.jsonl: not a metrics file"),
        (lambda d: (d / "text.jsonl").write_text('{"iteration": 1}\nloss 9\n{"iteration": 2}\n'), r"line 2: not JSON"),
        (lambda d: _write(d / "eval.jsonl", [_start(0), {"iteration": 5, "valid_loss": 3.0}]), r"no training loss"),
        (lambda d: _write(d / "nan.jsonl", [_start(0), {"iteration": 5, "lm_loss": None}]), r"is null \(not finite\)"),
        (
            lambda d: _write(d / "gone.jsonl", [_start(0), *_rows(1, 3), _start(1, resumed=0)]),
            r"was superseded by a later start's resume; --show-superseded draws them",
        ),
    ],
    ids=["missing", "not-metrics", "not-json", "no-loss", "only-null", "all-superseded"],
)
def test_bad_input_is_refused_naming_the_file_and_nothing_is_written(tmp_path: Path, make, message: str) -> None:
    made = make(tmp_path)
    bad = made if isinstance(made, Path) else tmp_path / "text.jsonl"
    good = _write(tmp_path / "good.jsonl", [_start(0), *_rows(1, 5)])
    output = tmp_path / "out" / "curves.png"
    output.parent.mkdir()
    output.write_bytes(b"an earlier picture")
    code, out, err = _plot(good, bad, "--output", output)
    assert code == ExitCode.ERROR, err
    assert str(bad) in err
    assert re.search(message, err), err
    assert output.read_bytes() == b"an earlier picture" and sorted(output.parent.iterdir()) == [output]
    assert out == ""


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--label", "one"], r"1 --label for 2 metrics file\(s\)"),
        (["--output", "curves.svg"], r"name it FILE.png"),
        (["--width", "50"], r"--width 50: give 300 to 10000 pixels"),
        (["--output", "no/such/dir/c.png"], r"the directory no/such/dir does not exist"),
    ],
    ids=["labels", "suffix", "width", "directory"],
)
def test_invalid_options_are_refused_before_reading(tmp_path: Path, args: list[str], message: str) -> None:
    good = _write(tmp_path / "good.jsonl", [_start(0), *_rows(1, 5)])
    output = ["--output", str(tmp_path / "c.png")] if "--output" not in args else []
    code, _, err = _plot(good, good, *output, *args)
    assert code == ExitCode.INVALID and re.search(message, err), err
    assert not (tmp_path / "c.png").exists()


def test_without_matplotlib_the_error_says_how_to_install_it(tmp_path: Path, monkeypatch) -> None:
    good = _write(tmp_path / "good.jsonl", [_start(0), *_rows(1, 5)])
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    code, _, err = _plot(good, "--output", tmp_path / "c.png")
    assert code == ExitCode.ERROR and "pip install matplotlib" in err, err
    assert sorted(tmp_path.iterdir()) == [good]

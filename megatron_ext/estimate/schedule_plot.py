"""Draw a pipeline timeline (``estimate.pipeline_schedule.Timeline``) as SVG and PNG, without plotting libraries.

One row per pipeline rank; every forward (blue shades, one per model chunk)
and backward pass (orange shades) is a box labelled with its microbatch;
idle time shows as the grey row background. The PNG is rasterised here: boxes
are filled rectangles and text uses a built-in 3×5 pixel font, so nothing
beyond the standard library (``zlib``, ``struct``) is needed.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from megatron_ext.estimate.pipeline_schedule import Timeline

Color = tuple[int, int, int]

FORWARD_COLORS: tuple[Color, ...] = ((158, 202, 225), (66, 146, 198), (8, 81, 156), (8, 48, 107))
BACKWARD_COLORS: tuple[Color, ...] = ((253, 174, 107), (241, 105, 19), (166, 54, 3), (127, 39, 4))
WEIGHT_COLORS: tuple[Color, ...] = ((161, 217, 155), (65, 171, 93), (0, 109, 44), (0, 68, 27))
"""Zero-bubble schedules' W passes (weight gradients); their B passes take the backward colours."""
KIND_COLORS = {"F": FORWARD_COLORS, "B": BACKWARD_COLORS, "W": WEIGHT_COLORS}
IDLE: Color = (225, 225, 225)
BACKGROUND: Color = (255, 255, 255)
TEXT: Color = (20, 20, 20)

ROW_HEIGHT = 30
ROW_GAP = 8
LEFT = 90
TOP = 44
RIGHT = 20
SCALE = 2  # pixel size of the PNG font

# 3×5 glyphs, rows top to bottom, for the characters the pictures use.
_FONT = {
    "0": "111101101101111",
    "1": "010110010010111",
    "2": "111001111100111",
    "3": "111001111001111",
    "4": "101101111001001",
    "5": "111100111001111",
    "6": "111100111101111",
    "7": "111001001001001",
    "8": "111101111101111",
    "9": "111101111001111",
    "A": "010101111101101",
    "B": "110101110101110",
    "C": "011100100100011",
    "D": "110101101101110",
    "E": "111100110100111",
    "F": "111100110100100",
    "G": "011100101101011",
    "H": "101101111101101",
    "I": "111010010010111",
    "J": "001001001101010",
    "K": "101101110101101",
    "L": "100100100100111",
    "M": "101111111101101",
    "N": "110101101101101",
    "O": "010101101101010",
    "P": "110101110100100",
    "Q": "010101101110011",
    "R": "110101110101101",
    "S": "011100010001110",
    "T": "111010010010010",
    "U": "101101101101111",
    "V": "101101101101010",
    "W": "101101111111101",
    "X": "101101010101101",
    "Y": "101101010010010",
    "Z": "111001010100111",
    "=": "000111000111000",
    "(": "001010010010001",
    ")": "100010010010100",
    "/": "001001010100100",
    ".": "000000000000010",
    "-": "000000111000000",
    "%": "101001010100101",
    ":": "000010000010000",
    ",": "000000000010100",
    ";": "000010000010100",
    "+": "000010111010000",
    "*": "000101010101000",
    " ": "000000000000000",
}
_SUBSTITUTES = {"·": "*", "×": "X", "−": "-", "_": "-"}


class Canvas(Protocol):
    """What the drawing code needs of an output format."""

    def rect(self, x: float, y: float, w: float, h: float, color: Color, *, outline: bool = True) -> None: ...

    def text(self, x: float, y: float, s: str, color: Color = TEXT) -> None: ...


def text_width(s: str) -> int:
    """Width of ``s`` in the PNG font (also used to decide whether a label fits in a box)."""
    return len(s) * 4 * SCALE


class SvgCanvas:
    """Collects SVG elements."""

    def __init__(self, width: int, height: int) -> None:
        self.width, self.height = width, height
        self.elements: list[str] = []

    def rect(self, x: float, y: float, w: float, h: float, color: Color, *, outline: bool = True) -> None:
        stroke = ' stroke="white" stroke-width="0.5"' if outline else ""
        self.elements.append(
            f'<rect x="{x:.2f}" y="{y:.2f}" width="{w:.2f}" height="{h:.2f}" fill="rgb{color}"{stroke}/>'
        )

    def text(self, x: float, y: float, s: str, color: Color = TEXT) -> None:
        escaped = s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
        self.elements.append(
            f'<text x="{x:.2f}" y="{y + 10:.2f}" font-family="monospace" font-size="11" fill="rgb{color}">{escaped}</text>'
        )

    def render(self) -> str:
        body = "\n".join(self.elements)
        return (
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{self.width}" height="{self.height}" '
            f'viewBox="0 0 {self.width} {self.height}">\n<rect width="100%" height="100%" fill="white"/>\n{body}\n</svg>\n'
        )


class PngCanvas:
    """An RGB raster with rectangles and 3×5-font text."""

    def __init__(self, width: int, height: int) -> None:
        self.width, self.height = width, height
        self.pixels = bytearray(bytes(BACKGROUND) * (width * height))

    def rect(self, x: float, y: float, w: float, h: float, color: Color, *, outline: bool = True) -> None:
        x0, y0 = max(0, round(x)), max(0, round(y))
        x1, y1 = min(self.width, round(x + w)), min(self.height, round(y + h))
        if x1 <= x0 or y1 <= y0:
            return
        row = bytes(color) * (x1 - x0)
        for yy in range(y0, y1):
            start = (yy * self.width + x0) * 3
            self.pixels[start : start + len(row)] = row
        if outline and x1 - x0 > 2:  # a white separator line so adjacent boxes stay apart, as in the SVG
            for yy in range(y0, y1):
                start = (yy * self.width + x1 - 1) * 3
                self.pixels[start : start + 3] = bytes(BACKGROUND)

    def text(self, x: float, y: float, s: str, color: Color = TEXT) -> None:
        cx = round(x)
        for ch in s.upper():
            glyph = _FONT.get(_SUBSTITUTES.get(ch, ch), _FONT[" "])
            for i, bit in enumerate(glyph):
                if bit == "1":
                    self._dot(cx + (i % 3) * SCALE, round(y) + 1 + (i // 3) * SCALE, color)
            cx += 4 * SCALE

    def _dot(self, x: int, y: int, color: Color) -> None:
        for yy in range(y, min(y + SCALE, self.height)):
            for xx in range(x, min(x + SCALE, self.width)):
                start = (yy * self.width + xx) * 3
                self.pixels[start : start + 3] = bytes(color)

    def pixel(self, x: int, y: int) -> Color:
        start = (y * self.width + x) * 3
        return (self.pixels[start], self.pixels[start + 1], self.pixels[start + 2])

    def render(self) -> bytes:
        """The image as PNG bytes (8-bit RGB, no filter)."""
        stride = self.width * 3
        raw = b"".join(b"\x00" + bytes(self.pixels[y * stride : (y + 1) * stride]) for y in range(self.height))

        def chunk(tag: bytes, data: bytes) -> bytes:
            return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

        header = struct.pack(">IIBBBBB", self.width, self.height, 8, 2, 0, 0, 0)
        return (
            b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")
        )


@dataclass(frozen=True)
class Geometry:
    """Where the timelines go on the picture."""

    width: int
    """Picture width, pixels."""
    height: int
    """Picture height, pixels."""
    pixels_per_time: float
    """Horizontal scale (shared by all timelines of the picture)."""

    def x(self, t: float) -> float:
        return LEFT + t * self.pixels_per_time

    @staticmethod
    def y(rank: int, top: float = TOP) -> float:
        return top + rank * (ROW_HEIGHT + ROW_GAP)


def title(timeline: Timeline) -> str:
    """The picture's title: schedule, sizes, and the bubble by formula and on the timeline."""
    kind = "interleaved 1F1B" if timeline.vp > 1 else "1F1B"
    p, v, m = timeline.pp, timeline.vp, timeline.num_microbatches
    return (
        f"{kind}: p={p} v={v} m={m}  bubble (p-1)/(v*m) = {p - 1}/({v}*{m}) = {timeline.formula_bubble:.2%} of ideal; "
        f"timeline {timeline.bubble_of_ideal:.2%} of ideal = {timeline.bubble_of_step:.2%} of the step"
    )


LEGEND_HEIGHT = 48
"""The legend rows under the last timeline."""
PANEL_HEAD = 40
"""A panel's title and subtitle above its rows."""


def _panel_height(timeline: Timeline) -> float:
    return PANEL_HEAD + timeline.pp * (ROW_HEIGHT + ROW_GAP)


def geometry(timeline: Timeline, *, width: int, others: Sequence[Timeline] = ()) -> Geometry:
    panels = [timeline, *others]
    height = 4 + sum(_panel_height(t) for t in panels) + LEGEND_HEIGHT
    makespan = max(t.makespan for t in panels)
    return Geometry(width=width, height=int(height), pixels_per_time=(width - LEFT - RIGHT) / makespan)


def draw(
    timeline: Timeline,
    canvas: Canvas,
    geo: Geometry,
    *,
    top: float = 8,
    heading: str | None = None,
    rank_notes: Sequence[str] = (),
    legend: bool = True,
) -> float:
    """Draw one panel (title, rank rows with idle background, passes) from ``top``; returns the panel's bottom."""
    canvas.text(8, top, heading or title(timeline))
    canvas.text(
        8,
        top + 16,
        "boxes: microbatch number; blue forward, orange backward (B), green weight gradients (W), darker = later "
        "model chunk; grey idle",
    )
    rows_top = top + PANEL_HEAD - 4
    for rank in range(timeline.pp):
        y = geo.y(rank, rows_top)
        note = rank_notes[rank] if rank < len(rank_notes) else ""
        canvas.text(8, y + ROW_HEIGHT / 2 - 6, f"rank {rank}{note}")
        canvas.rect(geo.x(0), y, timeline.makespan * geo.pixels_per_time, ROW_HEIGHT, IDLE)
    for p in timeline.passes:
        colors = KIND_COLORS[p.step.kind]
        color = colors[p.step.chunk % len(colors)]
        x, y = geo.x(p.start), geo.y(p.rank, rows_top)
        w = (p.end - p.start) * geo.pixels_per_time
        canvas.rect(x, y, w, ROW_HEIGHT, color)
        label = str(p.step.microbatch)
        if text_width(label) + 2 <= w:
            ink = (255, 255, 255) if sum(color) < 400 else TEXT
            canvas.text(x + (w - text_width(label)) / 2 + 1, y + ROW_HEIGHT / 2 - 6, label, ink)
    bottom = geo.y(timeline.pp, rows_top)
    if legend:
        _legend(timeline, canvas, bottom + 2)
    return bottom


def _legend(timeline: Timeline, canvas: Canvas, y: float) -> None:
    x = float(LEFT)
    kinds = "FBW" if any(p.step.kind == "W" for p in timeline.passes) else "FB"
    for chunk in range(timeline.vp):
        for kind, colors in ((k, KIND_COLORS[k]) for k in kinds):
            canvas.rect(x, y, 14, 14, colors[chunk % len(colors)])
            label = f"{kind} chunk {chunk}"
            canvas.text(x + 18, y + 1, label)
            x += 18 + text_width(label) + 16
    canvas.rect(x, y, 14, 14, IDLE)
    canvas.text(x + 18, y + 1, "idle")


def draw_panels(panels: Sequence[tuple[Timeline, str, Sequence[str]]], canvas: Canvas, geo: Geometry) -> None:
    """Timelines one above the other on one time scale: (timeline, heading, per-rank notes) each."""
    top = 8.0
    for index, (timeline, heading, notes) in enumerate(panels):
        top = draw(timeline, canvas, geo, top=top, heading=heading, rank_notes=notes, legend=index == len(panels) - 1)
        top += 4 if index < len(panels) - 1 else 0


Panel = tuple[Timeline, str, Sequence[str]]
"""A timeline with its heading and per-rank notes."""


def _drawn(timeline: Timeline, panels: Sequence[Panel] | None, width: int, canvas_type: Any) -> Any:
    """A canvas of ``canvas_type`` with the panels (default: ``timeline`` alone, with its title) drawn on it."""
    drawn = list(panels) if panels else [(timeline, title(timeline), ())]
    geo = geometry(drawn[0][0], width=width, others=[p[0] for p in drawn[1:]])
    canvas = canvas_type(geo.width, geo.height)
    draw_panels(drawn, canvas, geo)
    return canvas


def render_svg(timeline: Timeline, *, width: int = 1200, panels: Sequence[Panel] | None = None) -> str:
    return str(_drawn(timeline, panels, width, SvgCanvas).render())


def render_png(timeline: Timeline, *, width: int = 1200, panels: Sequence[Panel] | None = None) -> bytes:
    return bytes(_drawn(timeline, panels, width, PngCanvas).render())


def write(
    timeline: Timeline, stem: Path, *, width: int = 1200, panels: Sequence[Panel] | None = None
) -> tuple[Path, Path]:
    """Write ``stem.png`` and ``stem.svg`` (``panels``: several timelines stacked); returns their paths."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    png, svg = stem.with_suffix(".png"), stem.with_suffix(".svg")
    png.write_bytes(render_png(timeline, width=width, panels=panels))
    svg.write_text(render_svg(timeline, width=width, panels=panels))
    return png, svg


MEMORY_HEIGHT = 36
"""The in-flight memory strip under a compared schedule's rows."""
MEMORY_COLOR: Color = (116, 176, 98)


@dataclass(frozen=True)
class MemoryStrip:
    """A quantity over time drawn as a filled step curve under a timeline."""

    label: str
    """Written in the strip."""
    curve: Sequence[tuple[float, float, float]]
    """(start, end, value) intervals."""
    scale: float
    """The value drawn at the strip's full height (shared by the strips of one picture)."""


def draw_strip(strip: MemoryStrip, canvas: Canvas, geo: Geometry, *, top: float, makespan: float, name: str) -> None:
    canvas.text(8, top + MEMORY_HEIGHT / 2 - 6, name)
    canvas.rect(geo.x(0), top, makespan * geo.pixels_per_time, MEMORY_HEIGHT, (245, 245, 245), outline=False)
    bottom = top + MEMORY_HEIGHT
    for start, end, value in strip.curve:
        height = MEMORY_HEIGHT * value / strip.scale if strip.scale > 0 else 0.0
        canvas.rect(geo.x(start), bottom - height, (end - start) * geo.pixels_per_time, height, MEMORY_COLOR,
                    outline=False)  # fmt: skip
    canvas.text(geo.x(0) + 4, top + 2, strip.label)


ComparedPanel = tuple[Timeline, str, MemoryStrip]
"""A schedule's timeline, its heading, and its first stage's activations in flight."""


def _comparison(panels: Sequence[ComparedPanel], width: int, canvas_type: Any) -> Any:
    """Every schedule's rows on one time axis, each with its memory strip, and one legend."""
    height = 4 + sum(_panel_height(t) + MEMORY_HEIGHT + 8 for t, _, _ in panels) + LEGEND_HEIGHT
    makespan = max(t.makespan for t, _, _ in panels)
    geo = Geometry(width=width, height=int(height), pixels_per_time=(width - LEFT - RIGHT) / makespan)
    canvas = canvas_type(geo.width, geo.height)
    top = 8.0
    for timeline, heading, strip in panels:
        bottom = draw(timeline, canvas, geo, top=top, heading=heading, legend=False)
        draw_strip(strip, canvas, geo, top=bottom, makespan=timeline.makespan, name="rank 0 mem")
        top = bottom + MEMORY_HEIGHT + 8
    # The legend of the panel with the most chunks, and the W passes' colours if any panel has them.
    _legend(max((t for t, _, _ in panels), key=lambda t: (t.vp, any(p.step.kind == "W" for p in t.passes))), canvas,
            top)  # fmt: skip
    return canvas


def write_comparison(panels: Sequence[ComparedPanel], stem: Path, *, width: int = 1200) -> tuple[Path, Path]:
    """Write ``stem.png`` and ``stem.svg`` with the compared schedules stacked; returns their paths."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    png, svg = stem.with_suffix(".png"), stem.with_suffix(".svg")
    png.write_bytes(bytes(_comparison(panels, width, PngCanvas).render()))
    svg.write_text(str(_comparison(panels, width, SvgCanvas).render()))
    return png, svg

"""Which transformer layers, and whether the embedding and the loss, each pipeline stage holds.

Megatron-Core 0.16 places layers in one of four ways, one at a time (as
Megatron-LM's ``arguments.py`` allows):

* **uniform**: ``num_layers / (p·v)`` layers in every model chunk;
* **first/last sizes** (``--decoder-first-pipeline-num-layers``,
  ``--decoder-last-pipeline-num-layers``): the first and/or last pipeline rank
  hold the given number of layers, the ranks between share the rest evenly,
  and each rank's layers split evenly over its ``v`` chunks;
* **account for embedding/loss** (``--account-for-embedding-in-pipeline-split``,
  ``--account-for-loss-in-pipeline-split``): the embedding and/or the loss count
  as one layer each, the ``num_layers + e + l`` slots split evenly, and the
  chunk that holds the embedding (loss) builds one layer fewer;
* **a layout string** (``--pipeline-model-parallel-layout``, e.g.
  ``"Et*3|(t*4|)*30,t*3L"``): one ``|``-separated entry per virtual stage, in
  order ``(v0, p0), (v0, p1), …, (v1, p0), …``, with ``E`` the embedding, ``t`` a
  transformer layer and ``L`` the loss; ``(…)*n`` and ``x*n`` repeat, commas are
  cosmetic. The number of entries over ``p`` is the virtual pipeline size.

Layer indices run in virtual-stage order: chunk ``v`` of rank ``r`` follows
every chunk of virtual stage ``v`` on ranks ``< r`` and every chunk of the
earlier virtual stages. The embedding is always on chunk 0 of rank 0 and the
loss on the last chunk of the last rank (Megatron-Core's ``GPTModel`` puts them
there, whatever the split says).

This is arithmetic on the flags, with no torch: the rules and messages are
checked before launch, and ``tests/config/test_stages_megatron_core.py``
checks every count and offset against Megatron-Core's own
``get_num_layers_to_build``, ``get_transformer_layer_offset`` and
``PipelineParallelLayerLayout``, which build the real model.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from megatron_ext.parallel.factors import divisors, nearest_multiples

SPLIT_FIELDS = (
    "decoder_first_pipeline_num_layers",
    "decoder_last_pipeline_num_layers",
    "account_for_embedding_in_pipeline_split",
    "account_for_loss_in_pipeline_split",
    "pipeline_model_parallel_layout",
)
"""The ``ParallelLayout`` fields (and flags) that place layers on stages, one way at a time."""

LAYOUT_SYMBOLS = {"E": "embedding", "t": "transformer layer", "L": "loss"}
"""Layout-string characters this project builds (Megatron-Core's ``m``, MTP, is not supported)."""


@dataclass(frozen=True)
class Stage:
    """One model chunk: the layers of one virtual stage on one pipeline rank."""

    pipeline_rank: int
    """Pipeline rank holding the chunk."""
    virtual_stage: int
    """Chunk index on that rank (0 when not interleaved)."""
    first_layer: int
    """Global index (0-based) of the chunk's first transformer layer."""
    num_layers: int
    """Transformer layers in the chunk (may be 0 for an embedding- or loss-only chunk)."""
    embedding: bool
    """The chunk holds the word (and position) embedding."""
    loss: bool
    """The chunk holds the final norm, the output layer and the cross entropy."""

    @property
    def layers(self) -> range:
        return range(self.first_layer, self.first_layer + self.num_layers)

    def summary(self) -> str:
        """``E+3t+L``-style contents: embedding, layer count, loss."""
        parts = ["E"] if self.embedding else []
        if self.num_layers or not (self.embedding or self.loss):
            parts.append(f"{self.num_layers}t")
        if self.loss:
            parts.append("L")
        return "+".join(parts)

    def describe(self) -> str:
        """``E+t0-3``-style contents: embedding, layer range, loss."""
        parts = ["E"] if self.embedding else []
        if self.num_layers:
            last = self.first_layer + self.num_layers - 1
            parts.append(f"t{self.first_layer}" + (f"-{last}" if last != self.first_layer else ""))
        if self.loss:
            parts.append("L")
        return "+".join(parts) or "(empty)"


@dataclass(frozen=True, kw_only=True)
class StageSplit:
    """The flags that place layers on pipeline stages."""

    num_layers: int
    pp: int
    vp: int
    first: int | None = None
    last: int | None = None
    account_for_embedding: bool = False
    account_for_loss: bool = False
    layout: str | None = None

    @classmethod
    def of(cls, *, num_layers: int, pp: int, vp: int, flags: Mapping[str, Any]) -> StageSplit:
        """The split of ``ParallelLayout``-named field values (``SPLIT_FIELDS``; absent ones at their defaults)."""
        return cls(
            num_layers=num_layers,
            pp=pp,
            vp=vp,
            first=flags.get("decoder_first_pipeline_num_layers"),
            last=flags.get("decoder_last_pipeline_num_layers"),
            account_for_embedding=bool(flags.get("account_for_embedding_in_pipeline_split", False)),
            account_for_loss=bool(flags.get("account_for_loss_in_pipeline_split", False)),
            layout=flags.get("pipeline_model_parallel_layout"),
        )

    @property
    def mode(self) -> str:
        if self.layout is not None:
            return "layout"
        if self.first is not None or self.last is not None:
            return "first/last"
        if self.account_for_embedding or self.account_for_loss:
            return "account"
        return "uniform"


def rank_rows(texts: Sequence[str]) -> list[tuple[str, int, int, str]]:
    """One row per run of consecutive pipeline ranks with the same text: (``rank r`` or ``ranks a-b``, a, b, text)."""
    rows: list[tuple[int, int, str]] = []
    for rank, text in enumerate(texts):
        if rows and rows[-1][2] == text:
            rows[-1] = (rows[-1][0], rank, text)
        else:
            rows.append((rank, rank, text))
    return [(f"rank {a}" if a == b else f"ranks {a}-{b}", a, b, text) for a, b, text in rows]


# ------------------------------------------------------------------ layout strings
def expand_layout(text: str) -> list[str]:
    """The entries of a layout string, repeats unrolled and commas dropped (Megatron-Core's syntax).

    Raises ValueError naming the offending character and its position.
    """
    flat = text.replace(",", "")
    # (group)*n first, then x*n, as Megatron-Core unrolls them.
    flat = re.sub(r"\(([^)]+)\)\*(\d+)", lambda mt: mt.group(1) * int(mt.group(2)), flat)
    flat = re.sub(r"(.)\*(\d+)", lambda mt: mt.group(1) * int(mt.group(2)), flat)
    for position, char in enumerate(flat):
        if char not in LAYOUT_SYMBOLS and char != "|":
            what = "m (multi-token prediction) is not supported by this project" if char == "m" else "is not a layer"
            raise ValueError(
                f"pipeline_model_parallel_layout {text!r}: character {char!r} at position {position} of the "
                f"expanded layout {what}; use E (embedding), t (transformer layer), L (loss), | between "
                "stages, (…)*n and x*n to repeat"
            )
    return flat.split("|")


def _compress(entry: str) -> str:
    return re.sub(r"t{3,}", lambda mt: f"t*{len(mt.group(0))}", entry)


def layout_string(counts: list[int]) -> str:
    """A compact layout string for per-virtual-stage layer ``counts`` (in layout order), E first and L last."""
    entries = [
        ("E" if k == 0 else "") + _compress("t" * c) + ("L" if k == len(counts) - 1 else "")
        for k, c in enumerate(counts)
    ]
    pieces: list[str] = []
    k = 0
    while k < len(entries):
        run = 1
        while k + run < len(entries) and entries[k + run] == entries[k]:
            run += 1
        last = k + run == len(entries)
        if run == 1:
            pieces.append(entries[k] + ("" if last else "|"))
        else:
            pieces.append(f"({entries[k]}|)*{run}" + ("," if not last else ""))
        k += run
    return "".join(pieces)


# ----------------------------------------------------------------------- counts
def _counts(split: StageSplit) -> list[list[int]]:
    """Layers per [pipeline rank][virtual stage] (assumes ``split_problems(split)`` is empty)."""
    n, pp, vp = split.num_layers, split.pp, split.vp
    if split.layout is not None:
        entries = expand_layout(split.layout)
        return [[entries[v * pp + r].count("t") for v in range(vp)] for r in range(pp)]
    if split.mode == "first/last":
        ends = [x for x in (split.first, split.last) if x is not None]
        middle_ranks = pp - len(ends)
        middle = (n - sum(ends)) // middle_ranks if middle_ranks else 0
        per_rank = [middle] * pp
        if split.first is not None:
            per_rank[0] = split.first
        if split.last is not None:
            per_rank[-1] = split.last
        return [[layers // vp] * vp for layers in per_rank]
    e, lo = int(split.account_for_embedding), int(split.account_for_loss)
    slots = (n + e + lo) // (pp * vp)
    counts = [[slots] * vp for _ in range(pp)]
    counts[0][0] -= e
    counts[-1][-1] -= lo
    return counts


def stages(split: StageSplit) -> tuple[tuple[Stage, ...], ...]:
    """Every chunk, indexed ``[pipeline_rank][virtual_stage]`` (assumes ``split_problems(split)`` is empty)."""
    counts = _counts(split)
    pp, vp = split.pp, split.vp
    first: dict[tuple[int, int], int] = {}
    offset = 0
    for v in range(vp):
        for r in range(pp):
            first[(r, v)] = offset
            offset += counts[r][v]
    return tuple(
        tuple(
            Stage(
                pipeline_rank=r,
                virtual_stage=v,
                first_layer=first[(r, v)],
                num_layers=counts[r][v],
                embedding=(r, v) == (0, 0),
                loss=(r, v) == (pp - 1, vp - 1),
            )
            for v in range(vp)
        )
        for r in range(pp)
    )


# ------------------------------------------------------------------ suggestions
def _first_last_candidates(n: int, pp: int, vp: int) -> list[tuple[int, int]]:
    """(first, last) sizes that split ``n`` layers validly, most even first."""
    if pp < 2:
        return []
    found = []
    for first in range(vp, n + 1, vp):
        for last in range(vp, n - first + 1, vp):
            rest, middle = n - first - last, pp - 2
            if n % pp == 0 and first == last == n // pp:
                continue  # the even split: not a fix
            if middle == 0:
                if rest == 0 and vp == 1:  # interleaved, Megatron-Core 0.16 needs a middle rank (see below)
                    found.append((first, last))
            elif rest > 0 and rest % middle == 0 and (rest // middle) % vp == 0:
                found.append((first, last))
    mean = n / pp

    def unevenness(pair: tuple[int, int]) -> tuple[float, int]:
        # Closest to an even share; then a lighter first stage (it also holds the embedding).
        return (max(abs(pair[0] - mean), abs(pair[1] - mean)), pair[0] - pair[1])

    return sorted(found, key=unevenness)


def balanced_layout(n: int, pp: int, vp: int, *, embedding: float = 1.0, loss: float = 1.0) -> str:
    """A layout string giving every rank the same work: ``n`` layers, the embedding and the loss weighing
    ``embedding`` and ``loss`` layers (a rank whose extra alone outweighs the others' share gets none)."""
    extra = [(embedding if r == 0 else 0.0) + (loss if r == pp - 1 else 0.0) for r in range(pp)]
    # Water-filling: every rank's work is the same level, except a rank whose extra alone exceeds it (no layers).
    active = list(range(pp))
    while True:
        level = (n + sum(extra[r] for r in active)) / len(active)
        heavy = [r for r in active if extra[r] >= level]
        if not heavy or len(heavy) == len(active):
            break
        active = [r for r in active if r not in heavy]
    ideal = [max(0.0, level - extra[r]) if r in active else 0.0 for r in range(pp)]
    counts = [int(x + 1e-9) for x in ideal]
    # The layers left over go to the ranks furthest below their share (ties: the middle ranks first).
    order = sorted(range(pp), key=lambda r: (-(ideal[r] - counts[r]), abs(r - (pp - 1) / 2)))
    for r in order[: n - sum(counts)]:
        counts[r] += 1
    chunks = [[c // vp + (1 if v >= vp - c % vp else 0) for v in range(vp)] for c in counts]
    chunks[-1].reverse()  # the last rank's smaller chunk is its last, which holds the loss
    return layout_string([chunks[r][v] for v in range(vp) for r in range(pp)])


def balanced_splits(n: int, pp: int, vp: int, *, loss: float) -> list[dict[str, Any]]:
    """Uneven splits worth estimating for ``n`` layers on ``pp`` × ``vp`` when the loss costs ``loss`` layers.

    As ``ParallelLayout`` field values: Megatron-LM's account-for flags, the
    first/last sizes nearest to equal work per rank, and a balanced layout
    string; only valid ones, without repeats.
    """
    if pp < 2:
        return []
    out: list[dict[str, Any]] = []
    seen: set[tuple[tuple[int, ...], ...]] = set()

    def add(flags: dict[str, Any]) -> None:
        split = StageSplit.of(num_layers=n, pp=pp, vp=vp, flags=flags)
        if split_problems(split, fixes=False):
            return
        key = tuple(tuple(c.num_layers for c in rank) for rank in stages(split))
        if key not in seen:
            seen.add(key)
            out.append(flags)

    if n % pp == 0 and (n // pp) % vp == 0:
        seen.add(tuple((n // pp // vp,) * vp for _ in range(pp)))  # the even split is estimated anyway
    add({"account_for_embedding_in_pipeline_split": True, "account_for_loss_in_pipeline_split": True})
    add({"account_for_loss_in_pipeline_split": True})
    # First/last sizes: the last rank lighter by the loss's weight, the rest even.
    # Near an equal share (clamped to what the first rank can hold: a heavy loss empties the last rank).
    target = min(max((n + loss) / pp, vp), n - vp)
    best: tuple[float, dict[str, Any]] | None = None
    for first in range(vp, n + 1, vp):
        if abs(first - target) > 2 * vp + 1:
            continue
        for last in [None, *range(vp, n - first + 1, vp)]:
            if pp == 2 and last is not None:
                continue  # PP 2: the last rank takes the rest (Megatron-Core 0.16 needs a middle rank otherwise)
            rest = n - first - (last or 0)
            middle_ranks = pp - 1 - (last is not None)
            if middle_ranks == 0 or rest % middle_ranks or (rest // middle_ranks) % vp:
                continue
            if split_problems(StageSplit(num_layers=n, pp=pp, vp=vp, first=first, last=last), fixes=False):
                continue
            end = rest // middle_ranks if last is None else last
            work = max(first, rest / middle_ranks if last is not None else 0.0, end + loss)
            flags = {"decoder_first_pipeline_num_layers": first}
            if last is not None:
                flags["decoder_last_pipeline_num_layers"] = last
            if best is None or work < best[0]:
                best = (work, flags)
    if best is not None:
        add(best[1])
    text = balanced_layout(n, pp, vp, embedding=0.0, loss=loss)
    if text:
        add({"pipeline_model_parallel_layout": text})
    return out


def suggest(n: int, pp: int, vp: int) -> list[str]:
    """Flags that place ``n`` layers on ``pp`` ranks × ``vp`` chunks, best first (at most three)."""
    out = []
    for e, lo in ((True, True), (True, False), (False, True)):
        split = StageSplit(num_layers=n, pp=pp, vp=vp, account_for_embedding=e, account_for_loss=lo)
        if not split_problems(split, fixes=False):
            flags = [
                f
                for f, on in (
                    ("--account-for-embedding-in-pipeline-split", e),
                    ("--account-for-loss-in-pipeline-split", lo),
                )
                if on
            ]
            out.append(" ".join(flags))
            break
    pairs = _first_last_candidates(n, pp, vp)
    if pairs:
        first, last = pairs[0]
        out.append(f"--decoder-first-pipeline-num-layers {first} --decoder-last-pipeline-num-layers {last}")
    text = balanced_layout(n, pp, vp)
    if text and (vp > 1 or not out):
        out.append(f'--pipeline-model-parallel-layout "{text}"')
    return out


def _fixes(n: int, pp: int, vp: int) -> str:
    options = suggest(n, pp, vp)
    return ("; or place the layers unevenly: " + ", or ".join(options)) if options else ""


# ------------------------------------------------------------------- validation
def split_problems(split: StageSplit, *, fixes: bool = True) -> list[str]:
    """Every broken placement rule, each naming its factors and a fix (empty when valid).

    ``fixes=False`` leaves out the suggested uneven splits (``suggest`` tries candidates with it).
    """
    n, pp, vp = split.num_layers, split.pp, split.vp

    def fix() -> str:
        return _fixes(n, pp, vp) if fixes else ""

    uneven = [
        flag
        for flag, on in (
            ("--decoder-first-pipeline-num-layers", split.first is not None),
            ("--decoder-last-pipeline-num-layers", split.last is not None),
            ("--account-for-embedding-in-pipeline-split", split.account_for_embedding),
            ("--account-for-loss-in-pipeline-split", split.account_for_loss),
        )
        if on
    ]
    if split.layout is not None:
        if uneven:
            return [
                f"--pipeline-model-parallel-layout places every layer itself and contradicts {', '.join(uneven)}; "
                "give the layout string alone"
            ]
        return _layout_problems(split)
    if split.mode == "first/last" and (split.account_for_embedding or split.account_for_loss):
        return [
            "--decoder-first/last-pipeline-num-layers and --account-for-embedding/loss-in-pipeline-split are two "
            "ways of placing layers (Megatron-Core refuses both at once); give one of them"
        ]
    if uneven and pp == 1:
        return [f"{', '.join(uneven)} place layers on pipeline stages and need pipeline parallelism: use PP >= 2"]
    if split.mode == "first/last":
        return _first_last_problems(split, fix)
    if split.mode == "account":
        slots = n + int(split.account_for_embedding) + int(split.account_for_loss)
        counted = " + ".join(
            ["num_layers"]
            + [w for w, on in (("embedding", split.account_for_embedding), ("loss", split.account_for_loss)) if on]
        )
        if slots % pp:
            return [f"{counted} = {slots} slots are not divisible by pipeline({pp}) with the account-for flags" + fix()]
        if (slots // pp) % vp:
            return [
                f"{counted} = {slots} slots give {slots // pp} per pipeline rank, which is not divisible by "
                f"virtual({vp})" + fix()
            ]
        return []
    if n % pp:
        return [f"num_layers={n} is not divisible by pipeline({pp}){_uniform_hint(n, pp)}" + fix()]
    if vp > 1 and n % (pp * vp):
        ok_vp = [d for d in divisors(n // pp) if d > 1]
        return [
            f"num_layers={n} is not divisible by pipeline({pp}) × virtual({vp}) = {pp * vp}; try "
            f"{nearest_multiples(n, pp * vp)} layers or VP in {[1, *ok_vp]}" + fix()
        ]
    return []


def _uniform_hint(n: int, pp: int) -> str:
    fits = [d for d in divisors(n) if d <= max(pp * 2, 8)]
    return f"; try {nearest_multiples(n, pp)} layers or PP in {fits}"


def _first_last_problems(split: StageSplit, fix: Callable[[], str]) -> list[str]:
    n, pp, vp = split.num_layers, split.pp, split.vp
    p: list[str] = []
    for name, value in (("first", split.first), ("last", split.last)):
        if value is not None and value % vp:
            p.append(
                f"--decoder-{name}-pipeline-num-layers {value} is not divisible by virtual({vp}): each of the "
                f"rank's {vp} chunks holds the same number of layers; use {nearest_multiples(value, vp)}"
            )
    ends = [x for x in (split.first, split.last) if x is not None]
    rest, middle = n - sum(ends), pp - len(ends)
    if vp > 1 and middle == 0 and split.first is not None and split.last is not None and not p:
        # Megatron-Core's get_transformer_layer_offset (0.16 and still 0.19.2) divides by the number of middle ranks.
        return [
            f"--decoder-first-pipeline-num-layers and --decoder-last-pipeline-num-layers together on "
            f"pipeline({pp}) × virtual({vp}) crash Megatron-Core (it divides by the ranks in between, of "
            f"which there are none); give --decoder-first-pipeline-num-layers {split.first} alone: the last rank "
            f"takes the other {n - split.first}"
        ]
    given = " - ".join(
        [f"num_layers {n}"] + [f"{w} {x}" for w, x in (("first", split.first), ("last", split.last)) if x is not None]
    )
    if rest < 0 or (rest == 0) != (middle == 0):
        p.append(
            f"{given} leaves {rest} layers for the {middle} pipeline ranks in between; "
            "every rank needs layers (and no layer may be left over)" + fix()
        )
    elif middle and rest % middle:
        p.append(f"{given} = {rest} layers are not divisible by the {middle} pipeline ranks in between" + fix())
    elif middle and (rest // middle) % vp:
        p.append(
            f"{given} = {rest} layers give {rest // middle} per middle pipeline rank, which is not divisible "
            f"by virtual({vp})" + fix()
        )
    return p


def _layout_problems(split: StageSplit) -> list[str]:
    n, pp = split.num_layers, split.pp
    text = split.layout or ""
    try:
        entries = expand_layout(text)
    except ValueError as exc:
        return [str(exc)]
    p: list[str] = []
    if len(entries) % pp:
        p.append(
            f"pipeline_model_parallel_layout {text!r} has {len(entries)} stages, not a multiple of pipeline({pp}); "
            f"give pipeline × virtual stages, e.g. {nearest_multiples(len(entries), pp)}"
        )
        return p
    if len(entries) != pp * split.vp:
        # The string sets VP (Megatron-LM derives it from the length): a layout built with another VP is not one.
        p.append(
            f"pipeline_model_parallel_layout {text!r} has {len(entries)} stages, pipeline({pp}) × virtual"
            f"({len(entries) // pp}), and contradicts virtual({split.vp}); the string sets the virtual pipeline size"
        )
        return p
    flat = "".join(entries)
    layers = flat.count("t")
    if layers != n:
        example = balanced_layout(n, pp, len(entries) // pp)
        p.append(
            f"pipeline_model_parallel_layout {text!r} places {layers} transformer layers but num_layers={n}"
            + (f'; for example "{example}" places {n} on {len(entries)} stages' if example else "")
        )
    if flat.count("E") != 1 or not entries[0].startswith("E"):
        p.append(
            f"pipeline_model_parallel_layout {text!r}: the embedding E must appear once, at the start of the first "
            "stage (Megatron-Core's GPTModel builds it on rank 0's first chunk)"
        )
    if flat.count("L") != 1 or not entries[-1].endswith("L"):
        p.append(
            f"pipeline_model_parallel_layout {text!r}: the loss L must appear once, at the end of the last stage "
            "(Megatron-Core's GPTModel builds it on the last rank's last chunk)"
        )
    return p

"""Blends as files: Megatron-LM's ``--data-args-path`` and ``--per-split-data-args-path``, read; and a blend
written from a directory of datasets (``tools/merge_datasets.py --write-blend``).

A blend of thousands of prefixes (one dataset per input file of a corpus, as the
preprocessing job array writes them) is too long for a command line. Megatron-LM
reads it from a file: whitespace-separated words in ``--data-path``'s form
(``W1 P1 W2 P2 …``), or a JSON object of the three splits' blends.

A written blend weighs each dataset by its tokens (what Megatron-Core does for
unweighted prefixes, by samples), or, with a mix (``web:0.7 code:0.3``), gives
each source its share of the total, spread over its datasets by tokens.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from megatron_ext.data.atomic_files import WriteError, stage_file
from megatron_ext.data.indexed import IndexedDatasetError, IndexedDatasetFiles
from megatron_ext.data.sources import DataError, parse_blend


def with_blend_files(data: Any) -> Any:
    """``data`` (``DataArgs``) with ``--data-args-path`` and ``--per-split-data-args-path`` read into the blends
    they hold, as Megatron-LM reads them (``get_blend_and_blend_per_split``): the first file's whitespace-separated
    words are ``--data-path``; the second is JSON with keys train, valid and test, each a list or a string (or
    null). DataError names the file and what is wrong with it."""
    if data.data_args_path:
        path = data.data_args_path
        items = _read(path, "--data-args-path").split()
        if not items:
            raise DataError(f"--data-args-path {path} holds no dataset prefix")
        parse_blend(items, f"--data-args-path {path}")  # a malformed blend named with its file
        return dataclasses.replace(data, data_args_path=None, data_path=tuple(items))
    if data.per_split_data_args_path:
        path = data.per_split_data_args_path
        try:
            per_split = json.loads(_read(path, "--per-split-data-args-path"))
        except json.JSONDecodeError as exc:
            raise DataError(f"--per-split-data-args-path {path} is not JSON: {exc}") from None
        missing = [k for k in SPLITS if not isinstance(per_split, dict) or k not in per_split]
        if missing:
            raise DataError(
                f"--per-split-data-args-path {path} lacks {', '.join(missing)}: give an object with keys train, "
                "valid and test (each a list of prefixes, optionally weighted, or one string of them)"
            )
        split = {k: per_split[k].split() if isinstance(per_split[k], str) else list(per_split[k] or []) for k in SPLITS}
        for name in SPLITS:
            if split[name]:
                parse_blend([str(x) for x in split[name]], f"--per-split-data-args-path {path} ({name})")
        if not split["train"]:
            raise DataError(f"--per-split-data-args-path {path}: train holds no dataset prefix")
        return dataclasses.replace(
            data,
            per_split_data_args_path=None,
            **{f"{name}_data_path": tuple(str(x) for x in split[name]) for name in SPLITS},
        )
    return data


SPLITS = ("train", "valid", "test")


def _read(path: str, flag: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as exc:
        raise DataError(f"{flag} {path}: cannot read it ({exc.strerror or exc})") from None


@dataclass(frozen=True)
class Source:
    """One part of a mix: the datasets whose prefix matches ``pattern``, and their share of the blend."""

    pattern: str
    share: float

    def matches(self, prefix: str) -> bool:
        """A glob (``*``, ``?``, ``[…]``) against the dataset's name or its whole prefix; a plain word anywhere in
        the name (not in the directories above it, which all datasets of a corpus may share)."""
        name = os.path.basename(prefix)
        if not any(c in self.pattern for c in "*?["):
            return self.pattern in name
        return fnmatch.fnmatchcase(name, self.pattern) or fnmatch.fnmatchcase(prefix, self.pattern)


def parse_mix(items: Sequence[str]) -> list[Source]:
    """``PATTERN:SHARE`` items (``web:0.7 code:0.3``); the shares need not add up to 1 (they are normalized)."""
    sources = []
    for item in items:
        pattern, colon, share = item.rpartition(":")
        try:
            value = float(share)
        except ValueError:
            value = -1.0
        if not colon or not pattern or not value > 0 or value == float("inf"):
            raise DataError(f"--mix {item!r}: write PATTERN:SHARE with a positive share, e.g. web:0.7")
        sources.append(Source(pattern, value))
    return sources


@dataclass(frozen=True)
class BlendEntry:
    prefix: str
    tokens: int
    documents: int
    weight: float
    source: str | None


def plan_blend(prefixes: Sequence[str], mix: Sequence[Source] = ()) -> list[BlendEntry]:
    """Each dataset's weight: its tokens, or with a mix, its source's share × its part of that source's tokens.
    DataError names a dataset that is broken, matches no source or two, and a source that matches nothing."""
    counted = []
    for prefix in prefixes:
        try:
            files = IndexedDatasetFiles.open(prefix)
        except IndexedDatasetError as exc:
            raise DataError(str(exc)) from None
        problems = files.quick_check()
        if problems:
            raise DataError(f"dataset {prefix}: {'; '.join(problems)} (tools/inspect_dataset.py --verify shows all)")
        counted.append(counts_of(files))
    return weigh(counted, mix)


def counts_of(files: IndexedDatasetFiles) -> tuple[str, int, int]:
    """(prefix, tokens, documents) of an opened dataset, as ``weigh`` takes them."""
    return files.prefix, int(files.bin_bytes // files.dtype.itemsize), files.num_documents


def weigh(counted: Sequence[tuple[str, int, int]], mix: Sequence[Source] = ()) -> list[BlendEntry]:
    """``plan_blend`` for datasets already opened and checked: (prefix, tokens, documents) each."""
    if not mix:
        return [BlendEntry(p, tokens, docs, float(tokens), None) for p, tokens, docs in counted]
    owners: dict[str, Source] = {}
    problems = []
    for prefix, _, _ in counted:
        found = [s for s in mix if s.matches(prefix)]
        if len(found) != 1:
            which = "no source" if not found else "sources " + ", ".join(s.pattern for s in found)
            problems.append(f"{prefix} matches {which}")
        else:
            owners[prefix] = found[0]
    if problems:
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        raise DataError(f"every dataset must match exactly one source of --mix: {'; '.join(problems[:5])}{more}")
    totals = {s.pattern: sum(t for p, t, _ in counted if owners[p] is s) for s in mix}
    empty = [pattern for pattern, total in totals.items() if total == 0]
    if empty:
        raise DataError(f"--mix {', '.join(empty)}: no dataset (with tokens) matches; drop it or fix the pattern")
    whole = sum(s.share for s in mix)
    return [
        BlendEntry(p, tokens, docs, owners[p].share / whole * tokens / totals[owners[p].pattern], owners[p].pattern)
        for p, tokens, docs in counted
    ]


def write_blend(entries: Sequence[BlendEntry], path: str | os.PathLike[str]) -> None:
    """The ``--data-args-path`` file of ``entries``: one ``WEIGHT PREFIX`` per line, published whole (never a
    partial file at ``path``) and never over an existing file."""
    target = Path(path)
    if target.exists():
        raise DataError(f"{target} exists; choose another --write-blend path or remove it")
    spaced = [e.prefix for e in entries if any(c.isspace() for c in e.prefix)]
    if spaced:
        raise DataError(f"{spaced[0]!r} holds whitespace, which splits it in a blend file (Megatron-LM reads words)")
    # Absolute: the training job reads the blend from its own working directory.
    text = "".join(f"{entry.weight:.12g} {os.path.abspath(entry.prefix)}\n" for entry in entries)
    staged = stage_file(target, text.encode("utf-8"))
    try:
        os.link(staged, target)  # unlike a rename, never replaces a file that appeared meanwhile
    except FileExistsError:
        raise DataError(f"{target} appeared while the blend was written; nothing was replaced") from None
    except OSError as exc:
        raise WriteError(target, exc) from None
    finally:
        staged.unlink(missing_ok=True)

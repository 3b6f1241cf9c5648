"""A run's identity: what its tokenizer and its training data are, by content, recorded in every checkpoint.

A vocabulary size alone does not tell two tokenizers apart: another 4,000-piece
SentencePiece model has the same size and other ids. So a checkpoint records
the SHA-256 of the tokenizer's files (the SentencePiece model; vocab.json and
merges.txt; a Hugging Face directory's tokenizer files), and of every training
dataset's ``.idx`` with the blend's weights and ``--split``. Paths are kept
for the messages only: a run resumed on another cluster, with the same files
elsewhere, is the same run.

Resuming compares both (``--accept-tokenizer-change`` and
``--accept-data-change`` accept a change deliberately; ``--finetune`` starts a
new run on new data and compares only the tokenizer); exporting and
generating compare the tokenizer.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from megatron_ext.config.data_args import parse_split
from megatron_ext.data.sources import parse_blend
from megatron_ext.data.tokenizer_base import Tokenizer

TOKENIZER_FLAG = "--accept-tokenizer-change"
DATA_FLAG = "--accept-data-change"

DATA_FLAGS = ("data_path", "train_data_path", "valid_data_path", "test_data_path")
"""The blends a run trains and evaluates on (``DataArgs`` fields)."""


def sha256_of_files(files: list[Path]) -> str:
    """One digest of the contents of several files in order, each preceded by its length (names and places do
    not count: a copy elsewhere is the same tokenizer). Streamed: memory is one block."""
    digest = hashlib.sha256()
    for file in files:
        digest.update(f"{file.stat().st_size}\0".encode())
        with open(file, "rb") as f:
            while block := f.read(8 << 20):
                digest.update(block)
    return digest.hexdigest()


def _tokenizer_location(tokenizer: Tokenizer) -> str:
    directory = getattr(tokenizer, "directory", None)  # a Hugging Face directory: named as given
    if directory:
        return str(directory)
    files = tokenizer.definition_files
    return " + ".join(map(str, files)) or f"no files (vocabulary {tokenizer.vocab_size:,})"


def tokenizer_identity(tokenizer: Tokenizer) -> dict[str, Any]:
    """``{"type", "vocab_size", "sha256", "location"}`` of a tokenizer (plain values, for the checkpoint's common state)."""
    return {
        "type": tokenizer.type_name,
        "vocab_size": tokenizer.vocab_size,
        "sha256": sha256_of_files(tokenizer.definition_files),
        "location": _tokenizer_location(tokenizer),
    }


def data_identity(data: Any) -> dict[str, Any]:
    """``{"mock", "split", "split_shares", "blends": {flag: [{"weight", "sha256", "prefix"}, ...]}}`` of the data flags
    (``DataArgs``): each dataset by the SHA-256 of its ``.idx`` (its documents' sizes: another or a changed
    dataset has another), with its weight."""
    blends: dict[str, list[dict[str, Any]]] = {}
    for name in DATA_FLAGS:
        items = getattr(data, name)
        if not items:
            continue
        blend = parse_blend(items, flag=f"--{name.replace('_', '-')}")
        weights = blend.weights or (None,) * len(blend.prefixes)
        blends[name] = [
            {"weight": weight, "sha256": sha256_of_files([Path(f"{prefix}.idx")]), "prefix": prefix}
            for weight, prefix in zip(weights, blend.prefixes, strict=True)
        ]
    weights = parse_split(data.split)
    shares = [round(w / sum(weights), 12) for w in weights]  # '969,30,1' and '96.9/3/0.1' are one split
    return {"mock": bool(data.mock_data), "split": data.split, "split_shares": shares, "blends": blends}


@dataclass(frozen=True)
class RunIdentity:
    """A run's tokenizer and training data, by content (plain values: the common state records ``as_record()``)."""

    tokenizer: dict[str, Any]
    data: dict[str, Any]

    @classmethod
    def of(cls, tokenizer: Tokenizer, data: Any) -> RunIdentity:
        return cls(tokenizer=tokenizer_identity(tokenizer), data=data_identity(data))

    def as_record(self) -> dict[str, Any]:
        return {"tokenizer": self.tokenizer, "data": self.data}


def tokenizer_difference(saved: dict[str, Any], current: dict[str, Any]) -> str | None:
    """How this tokenizer differs from the one a checkpoint was trained with, or None."""
    if all(saved.get(key) == current[key] for key in ("type", "vocab_size", "sha256")):
        return None
    return (
        f"the checkpoint was trained with the tokenizer {saved.get('type')} at {saved.get('location')} "
        f"(vocabulary {saved.get('vocab_size', 0):,}, sha256 {str(saved.get('sha256'))[:12]}…) and this one is "
        f"{current['type']} at {current['location']} (vocabulary {current['vocab_size']:,}, sha256 "
        f"{current['sha256'][:12]}…): the same ids would mean other text"
    )


def data_differences(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """How this run's training data differs from the checkpoint's: one line per difference."""
    found = []
    if saved.get("mock") != current["mock"]:
        found.append(f"--mock-data: {'on' if saved.get('mock') else 'off'} → {'on' if current['mock'] else 'off'}")
    same_split = (
        saved.get("split_shares", saved.get("split")) == current["split_shares" if "split_shares" in saved else "split"]
    )
    if not same_split and (saved.get("blends") or {}).get("data_path"):
        found.append(f"--split {saved.get('split')} → {current['split']}")
    was, now = saved.get("blends") or {}, current["blends"]
    for name in DATA_FLAGS:
        flag = f"--{name.replace('_', '-')}"
        old, new = was.get(name, []), now.get(name, [])
        if len(old) != len(new):
            found.append(f"{flag}: {len(old)} datasets → {len(new)}")
            continue
        for i, (a, b) in enumerate(zip(old, new, strict=True), start=1):
            if a.get("sha256") != b["sha256"]:
                found.append(f"{flag} dataset {i}: {b['prefix']}.idx is not the checkpoint's {a.get('prefix')}.idx")
            if a.get("weight") != b["weight"]:
                found.append(f"{flag} dataset {i} ({b['prefix']}): weight {a.get('weight')} → {b['weight']}")
    return found

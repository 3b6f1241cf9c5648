"""Read back what an offline W&B run logged: the history rows of its ``run-*.wandb`` file.

The file is W&B's transaction log: a 7-byte header (``:W&B``, magic 0xBEE1, version 0), then LevelDB-style
records in 32 KiB blocks (CRC-32C, little-endian length, type: 1 full, 2 first, 3 middle, 4 last), each record
a ``wandb_internal_pb2.Record``. wandb 0.2x+ keeps its reader in its Go core, so the tests read it here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

HEADER = b":W&B\xe1\xbe\x00"
BLOCK = 32 * 1024
RECORD_HEADER = 7  # checksum (4), length (2), type (1)


def _payloads(data: bytes) -> list[bytes]:
    assert data[: len(HEADER)] == HEADER, "not a W&B transaction log"
    payloads, pending, pos = [], b"", len(HEADER)
    while pos + RECORD_HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < RECORD_HEADER:  # the block's tail is padding
            pos += left
            continue
        length = int.from_bytes(data[pos + 4 : pos + 6], "little")
        kind = data[pos + 6]
        chunk = data[pos + RECORD_HEADER : pos + RECORD_HEADER + length]
        pos += RECORD_HEADER + length
        if kind == 0:
            continue
        pending += chunk
        if kind in (1, 4):  # a whole record, or the last piece of one
            payloads.append(pending)
            pending = b""
    return payloads


def history(run_dir: Path) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """(every logged row, with its ``_step``; the run's display name, project and config keys)."""
    from wandb.proto import wandb_internal_pb2

    (log,) = run_dir.glob("run-*.wandb")
    rows: list[dict[str, Any]] = []
    run: dict[str, str] = {}
    for payload in _payloads(log.read_bytes()):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(payload)
        kind = record.WhichOneof("record_type")
        if kind == "history":
            rows.append(
                {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            )
        elif kind == "run":
            run = {"name": record.run.display_name, "project": record.run.project}
            run["config"] = ",".join(sorted(item.key for item in record.run.config.update))
    return rows, run

"""Per-iteration metrics: console lines, a JSON Lines file, TensorBoard."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, TextIO


class MetricsWriter:
    """Writes metrics from the one logging rank; a no-op elsewhere."""

    def __init__(self, *, enabled: bool, metrics_file: str | None, tensorboard_dir: str | None) -> None:
        self.enabled = enabled
        self._file: TextIO | None = None
        self._tb: Any = None
        if not enabled:
            return
        if metrics_file:
            Path(metrics_file).parent.mkdir(parents=True, exist_ok=True)
            self._file = open(metrics_file, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
        if tensorboard_dir:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as exc:  # tensorboard is optional
                raise RuntimeError("--tensorboard-dir needs the tensorboard package: pip install tensorboard") from exc
            self._tb = SummaryWriter(log_dir=tensorboard_dir)

    def write(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        if self._file is not None:
            clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
            self._file.write(json.dumps(clean) + "\n")
            self._file.flush()
        if self._tb is not None:
            step = int(record["iteration"])
            for key, value in record.items():
                if key != "iteration" and isinstance(value, (int, float)) and not isinstance(value, bool):
                    self._tb.add_scalar(key, value, step)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None

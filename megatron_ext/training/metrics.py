"""Per-iteration metrics: what one step did (``StepResult``), the window between logged iterations
(``LogWindow``), and the metrics file (JSON Lines)."""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from megatron_ext.estimate.metrics_file import RUN_RECORD, start_marks, starts_in


class MetricsWriter:
    """Appends the metrics file (JSON Lines; its format: ``estimate.metrics_file``) from the one logging rank; a
    no-op elsewhere. TensorBoard and W&B are ``training.tracking``'s."""

    def __init__(self, *, enabled: bool, metrics_file: str | None) -> None:
        self.enabled = enabled
        self._file: TextIO | None = None
        self._start = 0
        """This start's ``start`` mark: the start records already in the file."""
        if enabled and metrics_file:
            path = Path(metrics_file)
            path.parent.mkdir(parents=True, exist_ok=True)
            self._start = starts_in(path)
            self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
            if _ends_mid_line(path):
                # An earlier start's last write was cut short: this start begins on a line of its own.
                self._file.write("\n")

    def write_start(self, record: dict[str, Any], *, resumed_from_iteration: int) -> None:
        """This start's record (``calibration.run_record``), first in the file, with the start's marks."""
        marks = start_marks(start=self._start, resumed_from_iteration=resumed_from_iteration, started_at=time.time())
        self.write({RUN_RECORD: marks | record[RUN_RECORD]})

    def write(self, record: dict[str, Any]) -> None:
        if self._file is not None:
            clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
            self._file.write(json.dumps(clean) + "\n")
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def _ends_mid_line(path: Path) -> bool:
    """Whether ``path``'s last byte is not a newline (an empty file ends none)."""
    with open(path, "rb") as f:
        if f.seek(0, 2) == 0:
            return False
        f.seek(-1, 2)
        return f.read(1) != b"\n"


@dataclass
class StepResult:
    loss: float
    """Token-mean loss over the global batch (NaN when not finite)."""
    grad_norm: float | None
    skipped: bool
    """No update: a non-finite loss, or (fp16) gradients overflowed at this loss scale."""
    lr: float
    """Learning rate this step used."""
    decoupled_lr: float | None = None
    """With --decoupled-lr: the embedding and output layer's learning rate this step used."""
    num_zeros: int | None = None
    """With --log-num-zeros-in-grad: the gradient's zeros (Megatron-Core's optimizer counts them)."""

    @property
    def non_finite(self) -> bool:
        return not math.isfinite(self.loss)


@dataclass
class LogWindow:
    """The iterations since the last logged one (Megatron-LM averages the loss over them)."""

    iterations: int = 0
    samples: int = 0
    seconds: float = 0.0
    """Training-step time only (evaluation and saving are timed apart)."""
    loss_sum: float = 0.0
    finite_losses: int = 0
    skipped: int = 0

    def add(self, result: StepResult, seconds: float, samples: int) -> None:
        self.iterations += 1
        self.samples += samples
        self.seconds += seconds
        self.skipped += int(result.skipped)
        if not result.non_finite:
            self.loss_sum += result.loss
            self.finite_losses += 1

    @property
    def mean_loss(self) -> float:
        return self.loss_sum / self.finite_losses if self.finite_losses else math.nan

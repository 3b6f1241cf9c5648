"""Per-iteration metrics: what one step did (``StepResult``), the window between logged iterations
(``LogWindow``), and the metrics file (JSON Lines)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO


class MetricsWriter:
    """Appends the metrics file (JSON Lines) from the one logging rank; a no-op elsewhere. TensorBoard and W&B
    are ``training.tracking``'s."""

    def __init__(self, *, enabled: bool, metrics_file: str | None) -> None:
        self.enabled = enabled
        self._file: TextIO | None = None
        if enabled and metrics_file:
            Path(metrics_file).parent.mkdir(parents=True, exist_ok=True)
            self._file = open(metrics_file, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()

    def write(self, record: dict[str, Any]) -> None:
        if self._file is not None:
            clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
            self._file.write(json.dumps(clean) + "\n")
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


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

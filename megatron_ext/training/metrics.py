"""Per-iteration metrics: what one step did (``StepResult``), the window between logged iterations (``LogWindow``), and where they go (console lines, a JSON Lines file, TensorBoard)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
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

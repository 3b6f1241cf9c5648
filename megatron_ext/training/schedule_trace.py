"""Record which (microbatch, model chunk) forward and backward pass a real run executes, in order.

``ScheduleRecorder.wrap`` wraps the ``forward_step`` given to
``megatron_ext.training.entry.pretrain``: Megatron-Core's schedule calls it once per
forward pass after setting the microbatch index on the chunk's layers
(``set_current_microbatch``), so the wrapper logs ``F`` with that index and the
chunk's ``vp_stage``, and threads the output through an identity autograd
function whose backward logs ``B`` when the gradient reaches the chunk — the
start of that chunk's backward pass. Evaluation (no grad) is not recorded.
Each rank writes ``rank<RANK>.json`` with its pipeline rank and the events;
``load_trace`` reads them back per pipeline rank.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from megatron_ext.estimate.pipeline_schedule import PipelinePass


class _MarkBackward(torch.autograd.Function):
    """Identity whose backward calls ``callback`` first."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, callback: Callable[[], None]) -> torch.Tensor:
        ctx.callback = callback
        return tensor.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        ctx.callback()
        return grad, None


class ScheduleRecorder:
    """Collects this rank's passes; ``write`` saves them."""

    def __init__(self) -> None:
        self.events: list[PipelinePass] = []
        self.pipeline_rank: int | None = None

    def wrap(self, forward_step: Callable[..., Any]) -> Callable[..., Any]:
        """A forward_step that records every training forward and backward pass, then calls ``forward_step``."""

        def recording_forward_step(data_iterator: Any, model: torch.nn.Module) -> Any:
            if not torch.is_grad_enabled():
                return forward_step(data_iterator, model)
            from megatron.core import parallel_state

            from megatron_ext.training.model import unwrap

            chunk = unwrap(model)
            index = int(chunk.vp_stage or 0)
            layers = chunk.decoder.layers
            if len(layers):
                microbatch = int(layers[0].current_microbatch)
            else:  # an embedding- or loss-only chunk: its forwards run in microbatch order
                microbatch = sum(1 for e in self.events if e.kind == "F" and e.chunk == index)
            if self.pipeline_rank is None:
                self.pipeline_rank = parallel_state.get_pipeline_model_parallel_rank()
            self.events.append(PipelinePass("F", microbatch, index))
            output, loss_func = forward_step(data_iterator, model)

            def on_backward() -> None:
                self.events.append(PipelinePass("B", microbatch, index))

            return _MarkBackward.apply(output, on_backward), loss_func

        return recording_forward_step

    def write(self, directory: Path) -> Path:
        """Save to ``directory/rank<RANK>.json``."""
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"rank{os.environ.get('RANK', '0')}.json"
        doc = {
            "rank": int(os.environ.get("RANK", "0")),
            "pipeline_rank": self.pipeline_rank,
            "events": [[e.kind, e.microbatch, e.chunk] for e in self.events],
        }
        path.write_text(json.dumps(doc))
        return path


def load_trace(directory: Path) -> dict[int, list[PipelinePass]]:
    """Recorded passes per pipeline rank (the first rank file of each pipeline rank)."""
    by_stage: dict[int, list[PipelinePass]] = {}
    for path in sorted(directory.glob("rank*.json"), key=lambda p: int(p.stem[4:])):
        doc = json.loads(path.read_text())
        if doc["pipeline_rank"] is None:
            continue
        by_stage.setdefault(int(doc["pipeline_rank"]), [PipelinePass(k, int(mb), int(c)) for k, mb, c in doc["events"]])
    return by_stage

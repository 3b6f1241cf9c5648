"""ZB-H1 (``--enable-zero-bubble``): Megatron-Core's own 1F1B schedule with each backward pass split in two.

Qi et al., "Zero Bubble Pipeline Parallelism" (ICLR 2024), §3.1: 1F1B's F and B passes in 1F1B's order, each B
computing the input gradient only, and the weight gradients (W) of the linear layers run after it, rank ``r``
keeping ``r`` W passes back: the B passes reach the previous stage sooner, and in the cool-down, where rank
``r`` waits ``r`` times for the last gradients to travel down to rank 0, its kept W passes fill the wait. Its
bubble is ``(p − 1)·(t_F + t_B − t_W)`` against 1F1B's ``(p − 1)·(t_F + t_B + t_W)``, at 1F1B's peak memory
(``estimate.zero_bubble``, which simulates it).

The schedule is Megatron-Core's ``forward_backward_pipelining_without_interleaving`` itself: its p2p
communication, forward and backward steps, gradient-sync switching and gradient finalisation are unchanged.
While it runs, its ``backward_step`` runs B (``training.split_backward``: the linear layers defer their weight
gradients to a ``WeightGradStore``); once B's gradient has been sent to the previous stage (and, in the steady
state, Megatron-Core's batched exchange has brought the next forward input), the W passes beyond the ``r`` kept
run; after the last B, the rest. Each W
pass but the last microbatch's runs with DDP's gradient sync held off, so that a bucket (``--overlap-grad-
reduce``) is reduced only once every microbatch's gradient is in it, as in 1F1B.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from megatron_ext.training.split_backward import WeightGradStore


@contextlib.contextmanager
def _sync_held_off(model: Any) -> Iterator[None]:
    """DDP's buckets told that this is not the last microbatch, and then what they were told before (Megatron-Core's
    ``no_sync`` would end by declaring the last microbatch, whatever the schedule had declared)."""
    groups = [*getattr(model, "bucket_groups", []), *getattr(model, "expert_parallel_bucket_groups", [])]
    before = [g.is_last_microbatch for g in groups]
    for g in groups:
        g.is_last_microbatch = False
    try:
        yield
    finally:
        for g, value in zip(groups, before, strict=True):
            g.is_last_microbatch = value


def zero_bubble_h1(store: WeightGradStore, *, pipeline_rank: int) -> Callable[..., Any]:
    """A forward-backward function with Megatron-Core's signature that runs ZB-H1 on this pipeline rank."""
    from megatron.core.pipeline_parallel import schedules
    from megatron.core.pipeline_parallel.p2p_communication import P2PCommunicator
    from megatron.core.utils import get_model_config

    def forward_backward(**kwargs: Any) -> Any:
        if kwargs.get("forward_only"):
            return schedules.forward_backward_pipelining_without_interleaving(**kwargs)
        model = kwargs["model"][0] if isinstance(kwargs["model"], list) else kwargs["model"]
        num_microbatches = kwargs["num_microbatches"]
        done = {"b": 0, "w": 0}

        # W passes are backward compute: Megatron-Core's timer for it (the measured bubble's compute) covers them.
        timers = get_model_config(model).timers
        timer = timers("backward-compute", log_level=2) if timers is not None else None

        def run_w() -> None:
            last = done["w"] == num_microbatches - 1
            with contextlib.nullcontext() if last else _sync_held_off(model):
                if timer is not None:
                    timer.start()
                store.run_w()
                if timer is not None:
                    timer.stop()
            done["w"] += 1

        def w_passes() -> None:
            """After a B's gradient has left: the W passes beyond the ``r`` kept, or after the last B, all."""
            while store.pending > (pipeline_rank if done["b"] < num_microbatches else 0):
                run_w()

        def backward_step(*args: Any, **step_kwargs: Any) -> Any:
            grad = original_step(*args, **step_kwargs)
            store.close_b()
            done["b"] += 1
            return grad

        # The W passes run once B's gradient has gone to the previous stage (with Megatron-Core's batched
        # exchange, once the next forward input has come too): never on the gradient's way.
        def send_backward_recv_forward(self: Any, grads: Any, shapes: Any, is_first_stage: bool) -> Any:
            received = original_exchange(self, grads, shapes, is_first_stage)
            w_passes()
            return received

        def send_backward(self: Any, grads: Any, is_first_stage: bool) -> None:
            original_send(self, grads, is_first_stage)
            w_passes()

        original_step = schedules.backward_step
        original_send = P2PCommunicator.send_backward
        original_exchange = P2PCommunicator.send_backward_recv_forward
        schedules.backward_step = backward_step
        P2PCommunicator.send_backward = send_backward
        P2PCommunicator.send_backward_recv_forward = send_backward_recv_forward
        store.splitting = True
        try:
            result = schedules.forward_backward_pipelining_without_interleaving(**kwargs)
            if done["w"] != num_microbatches:  # Megatron-Core's schedule ran a backward pass not through us
                raise RuntimeError(f"ZB-H1 ran {done['w']} W passes for {num_microbatches} microbatches")
            return result
        finally:
            schedules.backward_step = original_step
            P2PCommunicator.send_backward = original_send
            P2PCommunicator.send_backward_recv_forward = original_exchange
            store.splitting = False
            if store.pending:  # only after an error: the step is abandoned
                store.discard()

    return forward_backward

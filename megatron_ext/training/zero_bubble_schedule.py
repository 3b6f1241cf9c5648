"""Zero-bubble schedules (``--enable-zero-bubble``): Megatron-Core's own 1F1B schedules with each backward pass
split in two.

Qi et al., "Zero Bubble Pipeline Parallelism" (ICLR 2024): B computes the input gradient only, and the weight
gradients of the linear layers (W) run after it, a rank keeping some W passes back: the B passes reach the
previous stage sooner, and in the cool-down, where the rank waits for the last gradients to travel down, its kept
W passes fill the wait (``estimate.zero_bubble`` simulates both schedules):

* **ZB-H1** (one model chunk per rank): 1F1B's order, rank ``r`` keeping ``r`` W passes back. Its bubble is
  ``(p − 1)·(t_F + t_B − t_W)`` against 1F1B's ``(p − 1)·(t_F + t_B + t_W)``, at 1F1B's peak memory.
* **ZB interleaved** (virtual stages): interleaved 1F1B's order, rank ``r`` keeping the W passes that simulation
  chooses within interleaved 1F1B's memory (``zero_bubble.zb_interleaved_defers``).

The schedule is Megatron-Core's ``forward_backward_pipelining_without_interleaving`` (or ``_with_interleaving``)
itself: its p2p communication, forward and backward steps, gradient-sync switching and gradient finalisation are
unchanged. While it runs, its ``backward_step`` runs B (``training.split_backward``: the linear layers defer their
weight gradients to a ``WeightGradStore``); once a B's gradient has been posted to the previous stage, the W
passes beyond those kept run; after the last B, the rest. Under 1F1B, whose transfers block, the gradient and the
receive of the next input are posted without waiting and the W passes run while they travel (what the schedule
means W for: filling the wait for the next input); the interleaved schedule's transfers are already overlapped.

DDP's gradient sync sees every microbatch's gradient before it reduces, as under 1F1B: a W pass runs with the
sync held off, except a model chunk's last one where the buckets reduce as their gradients arrive (the schedule
declared the last microbatch). Where the interleaved schedule starts a chunk's reduction itself
(``config.grad_sync_func``, ``--overlap-grad-reduce`` aligned), that chunk's pending W passes run first.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from megatron_ext.estimate.zero_bubble import zb_interleaved_defers
from megatron_ext.training.split_backward import WeightGradStore

# Megatron-Core's P2PCommunicator methods that send a B pass's gradient to the previous stage.
_SENDS_GRADIENT = (
    "send_backward",
    "send_backward_recv_forward",
    "send_backward_recv_backward",
    "send_forward_backward_recv_forward_backward",
)


def _bucket_groups(chunk: Any) -> list[Any]:
    return [*getattr(chunk, "bucket_groups", []), *getattr(chunk, "expert_parallel_bucket_groups", [])]


@contextlib.contextmanager
def _last_microbatch(chunks: Sequence[Any], value: bool) -> Iterator[None]:
    """DDP's buckets told whether this is the last microbatch, and then what they were told before (Megatron-Core's
    ``no_sync`` would end by declaring the last microbatch, whatever the schedule had declared)."""
    groups = [g for chunk in chunks for g in _bucket_groups(chunk)]
    before = [g.is_last_microbatch for g in groups]
    for g in groups:
        g.is_last_microbatch = value
    try:
        yield
    finally:
        for g, was in zip(groups, before, strict=True):
            g.is_last_microbatch = was


def zero_bubble(
    store: WeightGradStore,
    *,
    chunks: Sequence[Any],
    pipeline_rank: int,
    pp: int,
    vp: int,
    timed: Callable[[int, int], contextlib.AbstractContextManager[None]] | None = None,
) -> Callable[..., Any]:
    """A forward-backward function with Megatron-Core's signature that runs ZB-H1 (``vp`` 1) or ZB interleaved on
    this pipeline rank; ``chunks``: its DDP-wrapped model chunks; ``timed(microbatch, chunk)``: around each W pass
    (``StageTimer.weight_pass``)."""
    from megatron.core.pipeline_parallel import schedules
    from megatron.core.pipeline_parallel.p2p_communication import P2PCommunicator
    from megatron.core.utils import get_model_config

    interleaved = vp > 1
    name = f"forward_backward_pipelining_with{'' if interleaved else 'out'}_interleaving"
    config = get_model_config(chunks[0])

    def forward_backward(**kwargs: Any) -> Any:
        schedule = getattr(schedules, name)
        if kwargs.get("forward_only"):
            return schedule(**kwargs)
        m = kwargs["num_microbatches"]
        kept = zb_interleaved_defers(pp=pp, vp=vp, num_microbatches=m)[pipeline_rank] if interleaved else pipeline_rank
        schedule_starts_sync = interleaved and config.grad_sync_func is not None
        b_passes, w_passes, w_of_chunk = [0], [0], [0] * len(chunks)
        # W passes are backward compute: Megatron-Core's timer for it (the measured bubble's compute) covers them.
        timer = config.timers("backward-compute", log_level=2) if config.timers is not None else None

        def sync_for(chunk: int | None) -> contextlib.AbstractContextManager[None]:
            if not interleaved:  # 1F1B's last microbatch: what the schedule declared for it
                return contextlib.nullcontext() if w_passes[0] == m - 1 else _last_microbatch(chunks, False)
            if chunk is not None and w_of_chunk[chunk] == m - 1 and not schedule_starts_sync:
                return _last_microbatch([chunks[chunk]], True)
            return _last_microbatch(chunks, False)

        def run_w() -> None:
            chunk = store.next_chunk
            # A chunk's B passes, and so its W passes, run in microbatch order.
            mark = timed(w_of_chunk[chunk], chunk) if timed is not None and chunk is not None else None
            with sync_for(chunk), mark or contextlib.nullcontext():
                if timer is not None:
                    timer.start()
                store.run_w()
                if timer is not None:
                    timer.stop()
            w_passes[0] += 1
            if chunk is not None:
                w_of_chunk[chunk] += 1

        def after_gradient_sent() -> None:
            """The W passes beyond those kept, or after the last B, all."""
            while store.pending > (kept if b_passes[0] < m * vp else 0):
                run_w()

        def backward_step(*args: Any, **step_kwargs: Any) -> Any:
            grad = original_step(*args, **step_kwargs)
            store.close_b()
            b_passes[0] += 1
            return grad

        def sends(original: Callable[..., Any]) -> Callable[..., Any]:
            # The W passes run once B's gradient has gone (with a batched exchange, once the next input has come):
            # never on the gradient's way.
            def send(self: Any, *args: Any, **send_kwargs: Any) -> Any:
                result = original(self, *args, **send_kwargs)
                after_gradient_sent()
                return result

            return send

        def posted(original: Callable[..., Any], *, receive: bool, timer_name: str) -> Callable[..., Any]:
            # 1F1B's blocking calls (send_backward_recv_forward, send_backward): B's gradient (and the receive of
            # the next input) posted with Megatron-Core's own p2p, the W passes run while they travel, then waited
            # for: W fills the wait for the next input, as the schedule intends.
            def send(self: Any, grads: Any, *rest: Any) -> Any:
                listed = isinstance(grads, list)
                shapes = rest[0] if receive else None
                shape = shapes[0] if isinstance(shapes, list) and len(shapes) == 1 else shapes
                if rest[-1] or (listed and len(grads) != 1) or isinstance(shape, list):  # first stage; several
                    result = original(self, grads, *rest)
                    after_gradient_sent()
                    return result
                config, grad = self.config, grads[0] if listed else grads
                batched, config.batch_p2p_comm = config.batch_p2p_comm, False  # batched ops cannot be left pending
                try:
                    received, _, reqs = self._communicate(
                        tensor_send_next=None,
                        tensor_send_prev=grad,
                        recv_prev=receive,
                        recv_next=False,
                        tensor_shape=shape,
                        wait_on_reqs=False,
                    )
                finally:
                    config.batch_p2p_comm = batched
                after_gradient_sent()
                wait = config.timers(timer_name, log_level=2) if config.timers is not None else None
                if wait is not None:
                    wait.start()
                for req in reqs.values() if isinstance(reqs, dict) else reqs or ():
                    req.wait()
                if wait is not None:
                    wait.stop()
                if not receive:
                    return None
                return [received] if listed else received

            return send

        def starts_sync(chunk: int, original: Callable[..., Any]) -> Callable[..., Any]:
            def start(*args: Any) -> Any:
                while store.pending_for(chunk):
                    run_w()
                return original(*args)

            return start

        original_step = schedules.backward_step
        original_sends = {method: getattr(P2PCommunicator, method) for method in _SENDS_GRADIENT}
        original_sync = config.grad_sync_func
        schedules.backward_step = backward_step
        for method, original in original_sends.items():
            setattr(P2PCommunicator, method, sends(original))
        if not interleaved:
            P2PCommunicator.send_backward = posted(
                original_sends["send_backward"], receive=False, timer_name="backward-send"
            )
            P2PCommunicator.send_backward_recv_forward = posted(
                original_sends["send_backward_recv_forward"], receive=True, timer_name="backward-send-forward-recv"
            )
        if schedule_starts_sync:
            funcs = original_sync if isinstance(original_sync, list) else [original_sync] * len(chunks)
            config.grad_sync_func = [starts_sync(c, f) for c, f in enumerate(funcs)]
        store.splitting = True
        try:
            result = schedule(**kwargs)
            if w_passes[0] != m * vp:  # Megatron-Core's schedule ran a backward pass not through us
                raise RuntimeError(f"the zero-bubble schedule ran {w_passes[0]} W passes for {m * vp} backward passes")
            return result
        finally:
            schedules.backward_step = original_step
            for method, original in original_sends.items():
                setattr(P2PCommunicator, method, original)
            config.grad_sync_func = original_sync
            store.splitting = False
            if store.pending:  # only after an error: the step is abandoned
                store.discard()

    return forward_backward

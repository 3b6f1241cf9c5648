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
unchanged, and nothing of Megatron-Core is rebound; the step talks to it through its own arguments. Its backward
steps run B (``training.split_backward``: the transformer layers' linears defer their weight gradients to a
``WeightGradStore``). Each B begins where the output gradient reaches the chunk's output, which the forward step
marks (``_BackwardStarts``, wrapped around the ``forward_step_func`` the schedule is given); once a B's gradient
has been posted to the previous stage (through the ``P2PCommunicator`` subclass the schedule is given as
``p2p_communicator=``), that B ends and the W passes beyond those kept run; after the last B, the rest. Under 1F1B, whose transfers block, the gradient and the
receive of the next input are posted without waiting and the W passes run while they travel (what the schedule
means W for: filling the wait for the next input); the interleaved schedule's transfers are already overlapped.

DDP's gradient sync sees every microbatch's gradient before it reduces, as under 1F1B: a W pass runs with the
sync held off, except a model chunk's last one where the buckets reduce as their gradients arrive (the schedule
declared the last microbatch). Where the interleaved schedule starts a chunk's reduction itself
(``config.grad_sync_func``, ``--overlap-grad-reduce`` aligned), that chunk's pending W passes run first.
"""

from __future__ import annotations

import contextlib
import functools
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
# The process groups Megatron-Core's pipeline schedules take from parallel_state when given none.
_SCHEDULE_GROUPS = ("tp", "cp", "embd", "pos_embd", "pp", "dp_cp")
# Those of them that 1F1B calls blocking, and the timer Megatron-Core times them with.
_BLOCKING = {"send_backward": "backward-send", "send_backward_recv_forward": "backward-send-forward-recv"}


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


class _Step:
    """One training step's passes on this rank: counts B and W passes, runs the W passes when the schedule says
    and keeps DDP's gradient sync to what 1F1B would have declared."""

    def __init__(
        self,
        store: WeightGradStore,
        *,
        chunks: Sequence[Any],
        num_microbatches: int,
        kept: int,
        interleaved: bool,
        schedule_starts_sync: bool,
        timer: Any,
        timed: Callable[[int, int], contextlib.AbstractContextManager[None]] | None,
    ) -> None:
        self.store, self.chunks, self.m, self.kept = store, chunks, num_microbatches, kept
        self.interleaved, self.schedule_starts_sync = interleaved, schedule_starts_sync
        self.timer, self.timed = timer, timed
        self.b_passes = self.w_passes = 0
        self.w_of_chunk = [0] * len(chunks)

    @property
    def backward_passes(self) -> int:
        return self.m * len(self.chunks)

    def _sync_for(self, chunk: int | None) -> contextlib.AbstractContextManager[None]:
        if not self.interleaved:  # 1F1B's last microbatch: what the schedule declared for it
            return contextlib.nullcontext() if self.w_passes == self.m - 1 else _last_microbatch(self.chunks, False)
        if chunk is not None and self.w_of_chunk[chunk] == self.m - 1 and not self.schedule_starts_sync:
            return _last_microbatch([self.chunks[chunk]], True)
        return _last_microbatch(self.chunks, False)

    def run_w(self) -> None:
        """The oldest W pass, timed as backward compute (the measured bubble's compute) and on the timeline."""
        chunk = self.store.next_chunk
        # A chunk's B passes, and so its W passes, run in microbatch order.
        mark = self.timed(self.w_of_chunk[chunk], chunk) if self.timed is not None and chunk is not None else None
        with self._sync_for(chunk), mark or contextlib.nullcontext():
            if self.timer is not None:
                self.timer.start()
            self.store.run_w()
            if self.timer is not None:
                self.timer.stop()
        self.w_passes += 1
        if chunk is not None:
            self.w_of_chunk[chunk] += 1

    def after_gradient_sent(self) -> None:
        """The B that sent ends; the W passes beyond those kept, or after the last B, all."""
        self.store.close_b()
        while self.store.pending > (self.kept if self.b_passes < self.backward_passes else 0):
            self.run_w()

    def started_b(self) -> None:
        self.store.start_b()
        self.b_passes += 1

    def flush_chunk(self, chunk: int) -> None:
        """Every pending W pass of ``chunk`` (and those before them), before its gradients are reduced: the B
        that just ended included."""
        self.store.close_b()
        while self.store.pending_for(chunk):
            self.run_w()


class _BackwardStarts:
    """An identity on a forward step's output whose backward, the first of the chunk's B pass, tells the step."""

    @staticmethod
    @functools.cache
    def function() -> Any:
        import torch

        class BackwardStarts(torch.autograd.Function):
            @staticmethod
            def forward(ctx: Any, output: Any, step: tuple[_Step]) -> Any:
                ctx.step = step[0]
                return output.view_as(output)

            @staticmethod
            def backward(ctx: Any, grad: Any) -> Any:
                ctx.step.started_b()
                return grad, None

        return BackwardStarts


def _marking(forward_step_func: Callable[..., Any], step: _Step) -> Callable[..., Any]:
    """``forward_step_func`` whose output tensor carries ``_BackwardStarts`` (the loss function is unchanged)."""

    def forward_step(*args: Any, **kwargs: Any) -> Any:
        output, *rest = forward_step_func(*args, **kwargs)
        return (_BackwardStarts.function().apply(output, (step,)), *rest)

    return forward_step


def _post_and_wait(
    communicator: Any, grads: Any, shapes: Any, *, receive: bool, timer_name: str, during: Callable[[], None]
) -> Any:
    """1F1B's blocking ``send_backward_recv_forward`` (``receive``) or ``send_backward``, split: B's gradient (and
    the receive of the next input) posted with Megatron-Core's own p2p, ``during`` run while they travel, then
    waited for (timed as Megatron-Core times the call)."""
    listed = isinstance(grads, list)
    config, grad = communicator.config, grads[0] if listed else grads
    shape = shapes[0] if isinstance(shapes, list) else shapes
    batched, config.batch_p2p_comm = config.batch_p2p_comm, False  # batched ops cannot be left pending
    try:
        received, _, reqs = communicator._communicate(
            tensor_send_next=None,
            tensor_send_prev=grad,
            recv_prev=receive,
            recv_next=False,
            tensor_shape=shape,
            wait_on_reqs=False,
        )
    finally:
        config.batch_p2p_comm = batched
    during()
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
    from megatron.core.process_groups_config import ProcessGroupCollection
    from megatron.core.utils import get_model_config

    interleaved = vp > 1
    name = f"forward_backward_pipelining_with{'' if interleaved else 'out'}_interleaving"
    config = get_model_config(chunks[0])

    def forward_backward(**kwargs: Any) -> Any:
        schedule = getattr(schedules, name)
        if kwargs.get("forward_only"):
            return schedule(**kwargs)
        m = kwargs["num_microbatches"]
        step = _Step(
            store,
            chunks=chunks,
            num_microbatches=m,
            kept=zb_interleaved_defers(pp=pp, vp=vp, num_microbatches=m)[pipeline_rank]
            if interleaved
            else pipeline_rank,
            interleaved=interleaved,
            schedule_starts_sync=interleaved and config.grad_sync_func is not None,
            timer=config.timers("backward-compute", log_level=2) if config.timers is not None else None,
            timed=timed,
        )
        original_sync = config.grad_sync_func

        def starts_sync(chunk: int, original: Callable[..., Any]) -> Callable[..., Any]:
            def start(*args: Any) -> Any:
                step.flush_chunk(chunk)
                return original(*args)

            return start

        if kwargs.get("p2p_communicator") is not None or kwargs.get("pg_collection") is not None:
            raise ValueError("the zero-bubble schedule brings its own p2p_communicator and pg_collection")
        # Megatron-Core's seam: the schedule sends through the communicator it is given (with the process groups
        # it would have taken itself), which runs W passes once a B's gradient is on its way.
        groups = ProcessGroupCollection.use_mpu_process_groups(required_pgs=list(_SCHEDULE_GROUPS))
        kwargs |= {
            "pg_collection": groups,
            "p2p_communicator": _communicator_class()(pp_group=groups.pp, config=config, step=step),
            "forward_step_func": _marking(kwargs["forward_step_func"], step),
        }
        if step.schedule_starts_sync:
            funcs = original_sync if isinstance(original_sync, list) else [original_sync] * len(chunks)
            config.grad_sync_func = [starts_sync(c, f) for c, f in enumerate(funcs)]
        store.splitting = True
        try:
            result = schedule(**kwargs)
            if (step.b_passes, step.w_passes) != (step.backward_passes,) * 2:  # a pass went round the step
                raise RuntimeError(
                    f"the zero-bubble schedule ran {step.b_passes} B and {step.w_passes} W passes for "
                    f"{step.backward_passes} backward passes"
                )
            return result
        finally:
            config.grad_sync_func = original_sync
            store.splitting = False
            if store.pending:  # only after an error: the step is abandoned
                store.discard()

    return forward_backward


@functools.cache
def _communicator_class() -> type:
    """Megatron-Core's ``P2PCommunicator`` whose gradient sends run the step's W passes once the gradient is on its
    way (``_Step.after_gradient_sent``); under 1F1B, whose sends block, the send is posted, the W passes run while
    it travels, then it is waited for (``_post_and_wait``)."""
    from megatron.core.pipeline_parallel.p2p_communication import P2PCommunicator

    def sends(method: str) -> Callable[..., Any]:
        original = getattr(P2PCommunicator, method)

        def send(self: Any, *args: Any, **kwargs: Any) -> Any:
            step: _Step = self.zero_bubble_step
            # 1F1B calls these positionally: (grads, [shapes,] is_first_stage).
            if not step.interleaved and method in _BLOCKING and not kwargs and not args[-1]:  # not the first stage
                grads, receive = args[0], method == "send_backward_recv_forward"
                if not isinstance(grads, list) or len(grads) == 1:
                    return _post_and_wait(self, grads, args[1] if receive else None, receive=receive,
                                          timer_name=_BLOCKING[method], during=step.after_gradient_sent)  # fmt: skip
            # Overlapped transfers (interleaved) are posted by the call: W passes once it returns.
            result = original(self, *args, **kwargs)
            step.after_gradient_sent()
            return result

        send.__name__ = method
        return send

    def __init__(self: Any, *, pp_group: Any, config: Any, step: _Step) -> None:
        P2PCommunicator.__init__(self, pp_group=pp_group, config=config)
        self.zero_bubble_step = step

    return type(
        "ZeroBubbleCommunicator", (P2PCommunicator,), {"__init__": __init__} | {m: sends(m) for m in _SENDS_GRADIENT}
    )

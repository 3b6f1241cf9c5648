"""Every private name of Megatron-Core that this project uses, in one place: where, how, and what would replace it.

``tests/test_mcore_private.py`` checks that each still exists, with the parameters we call it with, so that an
upgrade which moves one fails there in a second, before any multi-process test does. The CPU backend
(``training/cpu_backend.py``) rebinds names of its own table on CPU processes only; the same test checks that
table resolves.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class PrivateName:
    """One private name of Megatron-Core and our use of it."""

    module: str
    """The module that defines it."""
    name: str
    """Its dotted name in the module (``Class.method`` for a method)."""
    parameters: tuple[str, ...] = ()
    """The parameters our call relies on (keyword or position), checked with ``inspect.signature``."""
    use: str
    """Where we use it, how, and the public seam that would replace it."""


PRIVATE_NAMES = (
    PrivateName(
        module="megatron.core.pipeline_parallel.schedules",
        name="backward_step",
        parameters=("input_tensor", "output_tensor", "output_tensor_grad"),
        use="training/zero_bubble_schedule.py rebinds it for one step to count each B pass (the W passes are run "
        "by the communicator passed as p2p_communicator=). Megatron-Core 0.19's backward_dw() seam replaces it.",
    ),
    PrivateName(
        module="megatron.core.pipeline_parallel.p2p_communication",
        name="P2PCommunicator._communicate",
        parameters=("tensor_send_next", "tensor_send_prev", "recv_prev", "recv_next", "tensor_shape", "wait_on_reqs"),
        use="training/zero_bubble_schedule.py (_post_and_wait) posts 1F1B's blocking gradient send without waiting "
        "(wait_on_reqs=False), runs W passes while it travels, then waits on the requests.",
    ),
    PrivateName(
        module="megatron.core.distributed.distributed_data_parallel",
        name="DistributedDataParallel._make_backward_post_hook",
        parameters=("param",),
        use="training/split_backward.py delivers a deferred weight gradient through DDP's own hook (main_grad, "
        "bucket readiness). Megatron-Core 0.19's register_wgrad_accumulation_and_reduce_hooks protocol replaces it.",
    ),
    PrivateName(
        module="megatron.core.tensor_parallel.layers",
        name="ColumnParallelLinear._forward_impl",
        use="training/split_backward.py wraps it per layer so that the layer's weight gradient is deferred (W). "
        "Megatron-Core 0.19's delay_wgrad_compute on the local spec replaces it.",
    ),
    PrivateName(
        module="megatron.core.tensor_parallel.layers",
        name="RowParallelLinear._forward_impl",
        use="As ColumnParallelLinear._forward_impl.",
    ),
    PrivateName(
        module="megatron.core.dist_checkpointing.strategies.filesystem_async",
        name="_results_queue",
        use="training/helper_processes.py sets it to a results queue whose server ignores the planned-stop "
        "signals; _get_write_results_queue() then returns it.",
    ),
    PrivateName(
        module="megatron.core.dist_checkpointing.strategies.filesystem_async",
        name="_get_write_results_queue",
        use="Read by Megatron-Core's own writer; the contract behind _results_queue.",
    ),
)
"""The private names, each with its use."""

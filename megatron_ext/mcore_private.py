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
        module="megatron.core.pipeline_parallel.p2p_communication",
        name="P2PCommunicator._communicate",
        parameters=("tensor_send_next", "tensor_send_prev", "recv_prev", "recv_next", "tensor_shape", "wait_on_reqs"),
        use="training/zero_bubble_schedule.py (_post_and_wait) posts 1F1B's blocking gradient send without waiting "
        "(wait_on_reqs=False), runs W passes while it travels, then waits on the requests.",
    ),
    PrivateName(
        module="megatron.core.tensor_parallel.layers",
        name="ColumnParallelLinear._forward_impl",
        parameters=("input", "weight"),
        use="training/split_backward.py's deferring linears (subclasses, in the layer spec of --enable-zero-bubble) "
        "override it so that the layer's weight gradient is deferred (W); Megatron-Core calls it with keywords "
        "(bias, allreduce_dgrad, sequence_parallel, tp_group, gtp_remat_size: refused above 1). 0.19's "
        "backward_dw() does nothing on the local spec and its delay_wgrad_compute needs MoE expert-parallel "
        "overlap, so nothing public replaces it for a dense model.",
    ),
    PrivateName(
        module="megatron.core.tensor_parallel.layers",
        name="RowParallelLinear._forward_impl",
        parameters=("input", "weight"),
        use="As ColumnParallelLinear._forward_impl.",
    ),
    PrivateName(
        module="megatron.core.tensor_parallel.mappings",
        name="_gather_along_first_dim",
        parameters=("input_", "group"),
        use="training/split_backward.py gathers a sequence-parallel layer's input over TP, in the forward and in "
        "the W pass, as Megatron-Core's own linear does.",
    ),
    PrivateName(
        module="megatron.core.tensor_parallel.mappings",
        name="_reduce_scatter_along_first_dim",
        parameters=("input_", "group"),
        use="training/split_backward.py reduce-scatters a sequence-parallel layer's input gradient in B, as "
        "Megatron-Core's own linear does.",
    ),
    PrivateName(
        module="megatron.core.dist_checkpointing.strategies.filesystem_async",
        name="_results_queue",
        use="training/helper_processes.py sets it to a thread queue for a synchronous save, and for --async-save "
        "to a manager's queue whose server ignores the planned-stop signals; get_write_results_queue() then returns "
        "it.",
    ),
    PrivateName(
        module="megatron.core.dist_checkpointing.strategies.filesystem_async",
        name="get_write_results_queue",
        use="Public (0.16 named it _get_write_results_queue); listed as the contract behind _results_queue: "
        "Megatron-Core's writer takes its queue from here, and this returns the one set in _results_queue.",
    ),
    PrivateName(
        module="megatron.core.optimizer.distrib_optimizer",
        name="DistributedOptimizer._set_main_param_and_optimizer_states",
        parameters=("model_param", "tensors"),
        use="training/checkpoint_loading.py wraps it on each optimizer instance so that loading a dp-reshardable "
        "checkpoint keeps the restored step (the per-parameter placeholder's step is dropped).",
    ),
)
"""The private names, each with its use."""

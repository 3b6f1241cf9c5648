"""The backward pass split into B and W for Megatron-Core's linear layers (zero-bubble schedules, issue 31).

A zero-bubble schedule (Qi et al., ICLR 2024; ``estimate.zero_bubble``) runs each microbatch's backward in two:
**B** computes the gradient with respect to the stage's input, which the previous stage waits for; **W**
computes the weight gradients, which nothing downstream needs until the optimizer step, and runs later, in a
slot that would otherwise idle.

Here B is the ordinary autograd backward with the weight-gradient GEMM of the transformer layers' linears left
out. The layer spec builds them as ``DeferringColumnParallelLinear`` and ``DeferringRowParallelLinear``
(subclasses of Megatron-Core's, for QKV, projection, FC1 and FC2; ``model.layer_spec``): the layer's saved
input and output gradient go to a ``WeightGradStore``, one entry per microbatch's B. ``WeightGradStore.run_w``
later computes them and hands each gradient to the parameter as autograd would have: into ``.grad``, then
through Megatron-Core DDP's own hook for the parameter, which adds it to ``main_grad`` and, with
``--overlap-grad-reduce``, marks it ready in its bucket, so that the reduction (and the distributed optimizer)
see exactly what they see without the split. DDP hands that hook over by its own protocol: with
``delay_wgrad_compute`` in its config, a parameter marked ``skip_backward_post_hook`` gets no autograd hook, and
the module that owns it receives the hook through ``register_wgrad_accumulation_and_reduce_hooks`` (Transformer
Engine's layers implement the same). Everything else (norms, biases, embeddings, the attention core, the
output layer, which GPTModel builds outside the spec) keeps its gradient in B.

Transformer Engine's linears (2.3 and newer) split their own backward: built with ``delay_wgrad_compute``
(Megatron-Core's TE wrappers read it from the layer's config, given here as a copy with it on), they queue each
backward's weight-gradient GEMM, and ``backward_dw()`` computes the oldest and runs DDP's hooks, registered by the
same protocol. The layer spec builds them as ``Deferring…`` subclasses too (``deferring(..., transformer_engine=
True)``); an identity on the layer's input, whose backward runs once the layer's has, makes each of their
backwards one more entry of the store's B, and the W pass calls ``backward_dw()``. That path is tested with
Transformer Engine mocked (``tests/training/test_split_backward.py``), not yet on a GPU.

``training.zero_bubble_schedule`` runs ZB-H1 with it (``--enable-zero-bubble``).

The B pass's input gradient and its tensor-parallel all-reduce (with sequence parallelism: the forward's
all-gather of the input and the backward's reduce-scatter of its gradient) are Megatron-Core's own
(``linear_with_grad_accumulation_and_async_allreduce``'s arithmetic). With sequence parallelism the W pass
gathers the input again, as Megatron-Core's backward does for the weight gradient: only this rank's part of it
is held until W runs. Not covered, and refused where asked for: Megatron-Core's fused weight-gradient
accumulation (a CUDA kernel; the CPU runs never use it).
"""

from __future__ import annotations

import copy
import functools
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class _Pending:
    weight: torch.nn.Parameter
    hooks: list[Callable[[], None]]
    """DDP's hooks for the weight (``register_wgrad_accumulation_and_reduce_hooks``), run once it has its gradient."""
    grad_output: torch.Tensor
    """The layer's output gradient, flattened to (tokens, outputs)."""
    input: torch.Tensor
    """The layer's input: with sequence parallelism this rank's part of the sequence, else all of it."""
    gather_group: Any = None
    """With sequence parallelism, the tensor-parallel group whose ranks hold the rest of the input (gathered by
    the W pass, as Megatron-Core's backward gathers it for the weight gradient); else None."""

    def run(self) -> None:
        """This W: the weight gradient (the input gathered over TP first with sequence parallelism, as
        Megatron-Core's backward gathers it), delivered as autograd would have delivered it."""
        from megatron.core.tensor_parallel.mappings import _gather_along_first_dim

        full = self.input if self.gather_group is None else _gather_along_first_dim(self.input, self.gather_group)
        grad = self.grad_output.t().matmul(full.reshape(-1, full.shape[-1]))
        self.weight.grad = grad if self.weight.grad is None else self.weight.grad + grad
        for hook in self.hooks:  # DDP's: into main_grad, ready in its bucket
            hook()


class WeightGradStore:
    """The W passes the split backward defers, oldest first: one per B pass (``close_b``), each every deferred
    weight-gradient GEMM of that B."""

    def __init__(self) -> None:
        self.splitting = False
        """While True, linear layers defer their weight gradients here; False, they compute them in place."""
        self.b_open = False
        """A B pass has started (``start_b``) and is not yet closed."""
        self._open: list[_Pending | _QueuedByLayer] = []
        self._queue: deque[list[_Pending | _QueuedByLayer]] = deque()
        self._chunk_of: dict[torch.nn.Parameter, int] = {}

    def attach(self, chunks: Iterable[Any]) -> int:
        """Make the deferring linears of ``chunks`` (their DDP-wrapped model chunks) defer to this store, and know
        which chunk each weight is in (``next_chunk``); the number of layers. A chunk without any (the embedding
        or the loss alone on a virtual stage) has empty W passes. A ValueError names a layer configuration the
        split does not cover."""
        layers = 0
        for index, chunk in enumerate(chunks):
            deferring = [
                m for m in chunk.modules() if isinstance(m, (_DeferredWeightGradient, _DeferredByTransformerEngine))
            ]
            for module in deferring:
                # Transformer Engine's backward_dw() accumulates into main_grad itself.
                if isinstance(module, _DeferredWeightGradient) and getattr(
                    module, "gradient_accumulation_fusion", False
                ):
                    raise ValueError("the split backward does not cover --gradient-accumulation-fusion")
                module.weight_grad_store = self
                self._chunk_of[module.weight] = index
            layers += len(deferring)
        return layers

    def defer(self, item: _Pending | _QueuedByLayer) -> None:
        self._open.append(item)

    def start_b(self) -> None:
        """A B pass begins (its output gradient reached the chunk's output): the one before it, if still open,
        ends."""
        self.close_b()
        self.b_open = True

    def close_b(self) -> bool:
        """End the open B pass: what it deferred becomes one W pass (possibly empty). False: none was open."""
        if not self.b_open:
            return False
        self._queue.append(self._open)
        self._open = []
        self.b_open = False
        return True

    @property
    def pending(self) -> int:
        """W passes not yet run."""
        return len(self._queue)

    @property
    def next_chunk(self) -> int | None:
        """The model chunk whose weights the oldest pending W pass updates (None: it updates none)."""
        if not self._queue or not self._queue[0]:
            return None
        return self._chunk_of.get(self._queue[0][0].weight, 0)

    def pending_for(self, chunk: int) -> int:
        """Pending W passes that update weights of model chunk ``chunk``."""
        return sum(1 for w in self._queue if w and self._chunk_of.get(w[0].weight, 0) == chunk)

    @torch.no_grad()
    def run_w(self) -> None:
        """Run the oldest W pass: each weight gradient, delivered as autograd would have delivered it (outside
        autograd: nothing differentiates through a weight gradient)."""
        for item in self._queue.popleft():
            # Every tensor-parallel rank of a stage runs its W passes in the same order: the gathers pair up.
            item.run()

    def discard(self) -> None:
        """Drop every deferred W pass (a step abandoned midway)."""
        self._queue.clear()
        self._open = []
        self.b_open = False


class _SplitLinear(torch.autograd.Function):
    """``y = x·Wᵀ + b`` whose backward returns the input and bias gradients and defers the weight's."""

    @staticmethod
    def forward(
        ctx: Any,
        input_: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        allreduce_dgrad: bool,
        sequence_parallel: bool,
        tp_group: Any,
        store: WeightGradStore,
        owner: tuple[Any],
    ) -> torch.Tensor:
        from megatron.core.tensor_parallel.mappings import _gather_along_first_dim

        # Sequence parallelism: the input gathered over the TP ranks for the GEMM, only this rank's part kept.
        ctx.save_for_backward(input_, weight)
        ctx.use_bias = bias is not None
        ctx.allreduce_dgrad = allreduce_dgrad
        ctx.sequence_parallel = sequence_parallel
        ctx.tp_group = tp_group
        ctx.store = store
        ctx.owner = owner[0]
        total = _gather_along_first_dim(input_, tp_group) if sequence_parallel else input_
        output = torch.matmul(total, weight.t())
        return output + bias if bias is not None else output

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[Any, ...]:
        from megatron.core.tensor_parallel.mappings import _reduce_scatter_along_first_dim

        input_, weight = ctx.saved_tensors
        grad_input = grad_output.matmul(weight)
        handle = None
        if ctx.sequence_parallel:  # each TP rank's part of the sequence, summed over the ranks
            grad_input = _reduce_scatter_along_first_dim(grad_input, ctx.tp_group)
        elif ctx.allreduce_dgrad:
            handle = torch.distributed.all_reduce(grad_input, group=ctx.tp_group, async_op=True)
        flat_grad = grad_output.reshape(-1, grad_output.shape[-1])
        owner: _DeferredWeightGradient = ctx.owner
        item = _Pending(
            owner.weight, owner.wgrad_hooks, flat_grad, input_, ctx.tp_group if ctx.sequence_parallel else None
        )
        if ctx.store.splitting:
            ctx.store.defer(item)
        else:  # a backward outside the zero-bubble schedule: W at once (DDP hooks only this module's weight)
            with torch.no_grad():
                item.run()
        grad_bias = flat_grad.sum(dim=0) if ctx.use_bias else None
        if handle is not None:
            handle.wait()
        return grad_input, None, grad_bias, None, None, None, None, None


class _DeferredWeightGradient:
    """What the deferring linears add to Megatron-Core's: the weight's gradient goes to ``weight_grad_store``
    (``attach``), and DDP's hook for the weight, which DDP hands over by its protocol (the weight is marked
    ``skip_backward_post_hook``; ``ddp_config(..., delay_wgrad_compute=True)``), runs once it is delivered."""

    weight: torch.nn.Parameter
    weight_grad_store: WeightGradStore | None = None
    wgrad_hooks: list[Callable[[], None]]

    def _defer_weight_gradient(self) -> None:
        """Called by the subclasses' ``__init__``, after Megatron-Core's."""
        self.wgrad_hooks = []
        self.weight.skip_backward_post_hook = True  # type: ignore[attr-defined]

    def register_wgrad_accumulation_and_reduce_hooks(self, hook: Callable[[], None]) -> None:
        """DDP's protocol (``DistributedDataParallel.__init__``): ``hook`` accumulates the weight's gradient into
        ``main_grad`` and marks it ready for the reduction."""
        self.wgrad_hooks.append(hook)

    def _split_forward_impl(self, parent: Any, input: torch.Tensor, weight: Any, *args: Any, **kwargs: Any) -> Any:
        store = self.weight_grad_store
        if store is None or weight is not self.weight or not weight.requires_grad:
            return parent._forward_impl(self, input, weight, *args, **kwargs)
        if kwargs.get("gtp_remat_size", 1) > 1:
            raise ValueError("the split backward does not cover generalized tensor parallelism (gtp_remat_size > 1)")
        from megatron.core.utils import get_tensor_model_parallel_group_if_none

        group = get_tensor_model_parallel_group_if_none(kwargs.get("tp_group"))
        # The weight enters detached: autograd has no edge to it; the W pass delivers its gradient.
        # (The layer travels in a tuple: as an argument of its own it would be taken for an input.)
        return _SplitLinear.apply(input, weight.detach(), kwargs["bias"], kwargs["allreduce_dgrad"],
                                  kwargs["sequence_parallel"], group, store, (self,))  # fmt: skip


class _AfterLayerBackward(torch.autograd.Function):
    """An identity on a Transformer Engine layer's input: its backward runs once the layer's has, which queued
    the layer's weight-gradient GEMM (``delay_wgrad_compute``)."""

    @staticmethod
    def forward(ctx: Any, input_: torch.Tensor, owner: tuple[Any]) -> torch.Tensor:
        ctx.owner = owner[0]
        return input_.view_as(input_)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        ctx.owner._layer_backward_ran()
        return grad, None


@dataclass
class _QueuedByLayer:
    """A Transformer Engine layer's W: the oldest weight gradient it queued, computed by its ``backward_dw()``,
    which then runs DDP's hooks for the layer's deferred parameters."""

    layer: Any

    @property
    def weight(self) -> torch.nn.Parameter:
        return self.layer.weight

    def run(self) -> None:
        self.layer.backward_dw()


class _DeferredByTransformerEngine:
    """What the deferring Transformer Engine linears add to Megatron-Core's: the layer is built with
    ``delay_wgrad_compute`` (its own queue of weight-gradient GEMMs, one per backward; its weight and bias marked
    ``skip_backward_post_hook``, DDP's hooks taken through ``register_wgrad_accumulation_and_reduce_hooks``), and
    each of its backwards becomes a W in the store (``weight_grad_store``), or runs at once outside the schedule."""

    weight: torch.nn.Parameter
    weight_grad_store: WeightGradStore | None = None
    backward_dw: Callable[[], None]

    def _layer_backward_ran(self) -> None:
        store = self.weight_grad_store
        if store is not None and store.splitting:
            store.defer(_QueuedByLayer(self))
        else:  # a backward outside the zero-bubble schedule: W at once
            with torch.no_grad():
                self.backward_dw()

    def _split_forward(self, parent: Any, x: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if torch.is_grad_enabled() and self.weight.requires_grad:
            if not x.requires_grad:  # its backward would queue a W that nothing is told of
                raise ValueError("the split backward needs the input of a Transformer Engine layer to carry a gradient")
            x = _AfterLayerBackward.apply(x, (self,))
        return parent.forward(self, x, *args, **kwargs)


def _delaying(config: Any) -> Any:
    """The layer's copy of the model's config with ``delay_wgrad_compute`` (Megatron-Core's TE layers read it;
    the model's own stays off: in Megatron-Core it asks for MoE expert-parallel overlap)."""
    config = copy.copy(config)
    config.delay_wgrad_compute = True
    return config


@functools.cache
def deferring(base: type, *, transformer_engine: bool) -> type:
    """``base`` (a linear layer of Megatron-Core's layer spec) whose weight gradients a zero-bubble schedule
    defers to W passes: Megatron-Core's column- and row-parallel linears (the local spec) through their
    ``_forward_impl``; Transformer Engine's through its ``delay_wgrad_compute`` and ``backward_dw()``."""
    parent: Any = base
    if transformer_engine:

        def te_init(self: Any, *args: Any, **kwargs: Any) -> None:
            parent.__init__(self, *args, **(kwargs | {"config": _delaying(kwargs["config"])}))

        def forward(self: Any, x: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            return self._split_forward(base, x, *args, **kwargs)

        members: dict[str, Any] = {"__init__": te_init, "forward": forward}
        mixin: type = _DeferredByTransformerEngine
    else:

        def init(self: Any, *args: Any, **kwargs: Any) -> None:
            parent.__init__(self, *args, **kwargs)
            self._defer_weight_gradient()

        def _forward_impl(self: Any, input: torch.Tensor, weight: Any, *args: Any, **kwargs: Any) -> Any:
            return self._split_forward_impl(base, input, weight, *args, **kwargs)

        members, mixin = {"__init__": init, "_forward_impl": _forward_impl}, _DeferredWeightGradient
    name = f"Deferring{base.__name__}"
    return type(name, (mixin, base), members | {"__module__": __name__, "__qualname__": name})

"""The backward pass split into B and W for Megatron-Core's linear layers (zero-bubble schedules, issue 31).

A zero-bubble schedule (Qi et al., ICLR 2024; ``estimate.zero_bubble``) runs each microbatch's backward in two:
**B** computes the gradient with respect to the stage's input, which the previous stage waits for; **W**
computes the weight gradients, which nothing downstream needs until the optimizer step, and runs later, in a
slot that would otherwise idle.

Here B is the ordinary autograd backward with the weight-gradient GEMM of every ``ColumnParallelLinear`` and
``RowParallelLinear`` (the local spec's QKV, projection, FC1 and FC2, and the output layer) left out: the layer's
saved input and output gradient go to a ``WeightGradStore``, one entry per microbatch's B. ``WeightGradStore.
run_w`` later computes them and hands each gradient to the parameter as autograd would have: into ``.grad``,
then through Megatron-Core DDP's own backward hook for the parameter, which adds it to ``main_grad`` and, with
``--overlap-grad-reduce``, marks it ready in its bucket, so that the reduction (and the distributed optimizer)
see exactly what they see without the split. Everything else (norms, biases, embeddings, the attention core)
keeps its gradient in B, and so does an output layer tied to the embedding (``--untie-embeddings-and-output-
weights`` not given): the embedding gives the same weight a gradient in B, and DDP must see one, complete.

``training.zero_bubble_schedule`` runs ZB-H1 with it (``--enable-zero-bubble``).

The B pass's input gradient and its tensor-parallel all-reduce (with sequence parallelism: the forward's
all-gather of the input and the backward's reduce-scatter of its gradient) are Megatron-Core's own
(``linear_with_grad_accumulation_and_async_allreduce``'s arithmetic). With sequence parallelism the W pass
gathers the input again, as Megatron-Core's backward does for the weight gradient: only this rank's part of it
is held until W runs. Not covered, and refused where asked for: Megatron-Core's fused weight-gradient
accumulation (a CUDA kernel; the CPU runs never use it).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class _Pending:
    weight: torch.nn.Parameter
    grad_output: torch.Tensor
    """The layer's output gradient, flattened to (tokens, outputs)."""
    input: torch.Tensor
    """The layer's input: with sequence parallelism this rank's part of the sequence, else all of it."""
    gather_group: Any = None
    """With sequence parallelism, the tensor-parallel group whose ranks hold the rest of the input (gathered by
    the W pass, as Megatron-Core's backward gathers it for the weight gradient); else None."""


class WeightGradStore:
    """The W passes the split backward defers, oldest first: one per B pass (``close_b``), each every deferred
    weight-gradient GEMM of that B."""

    def __init__(self) -> None:
        self.splitting = False
        """While True, linear layers defer their weight gradients here; False, they compute them in place."""
        self._open: list[_Pending] = []
        self._queue: deque[list[_Pending]] = deque()
        self._hooks: dict[torch.nn.Parameter, Callable[..., None]] = {}
        self._chunk_of: dict[torch.nn.Parameter, int] = {}

    def use_ddp_hooks(self, chunks: Iterable[Any]) -> None:
        """Deliver gradients through each DDP-wrapped chunk's own backward hook (``main_grad``, bucket readiness),
        and know which model chunk each weight is in (``next_chunk``)."""
        for index, chunk in enumerate(chunks):
            make_hook = getattr(chunk, "_make_backward_post_hook", None)
            for param in chunk.parameters():
                self._chunk_of[param] = index
                if make_hook is not None and param.requires_grad:
                    self._hooks[param] = make_hook(param)

    def defer(
        self, weight: torch.nn.Parameter, grad_output: torch.Tensor, input_: torch.Tensor, gather_group: Any = None
    ) -> None:
        self._open.append(_Pending(weight, grad_output, input_, gather_group))

    def close_b(self) -> None:
        """End one B pass: what it deferred becomes one W pass (possibly empty, on a stage without linears)."""
        self._queue.append(self._open)
        self._open = []

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
        from megatron.core.tensor_parallel.mappings import _gather_along_first_dim

        for item in self._queue.popleft():
            # Every tensor-parallel rank of a stage runs its W passes in the same order: the gathers pair up.
            full = item.input if item.gather_group is None else _gather_along_first_dim(item.input, item.gather_group)
            grad = item.grad_output.t().matmul(full.reshape(-1, full.shape[-1]))
            weight = item.weight
            weight.grad = grad if weight.grad is None else weight.grad + grad
            hook = self._hooks.get(weight)
            if hook is not None:
                hook()

    def discard(self) -> None:
        """Drop every deferred W pass (a step abandoned midway)."""
        self._queue.clear()
        self._open = []


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
        parameter: tuple[torch.nn.Parameter],
    ) -> torch.Tensor:
        from megatron.core.tensor_parallel.mappings import _gather_along_first_dim

        # Sequence parallelism: the input gathered over the TP ranks for the GEMM, only this rank's part kept.
        ctx.save_for_backward(input_, weight)
        ctx.use_bias = bias is not None
        ctx.allreduce_dgrad = allreduce_dgrad
        ctx.sequence_parallel = sequence_parallel
        ctx.tp_group = tp_group
        ctx.store = store
        ctx.parameter = parameter[0]
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
        ctx.store.defer(ctx.parameter, flat_grad, input_, ctx.tp_group if ctx.sequence_parallel else None)
        grad_bias = flat_grad.sum(dim=0) if ctx.use_bias else None
        if handle is not None:
            handle.wait()
        return grad_input, None, grad_bias, None, None, None, None, None


def split_linear_layers(chunks: Iterable[torch.nn.Module], store: WeightGradStore) -> int:
    """Make every Megatron-Core column- and row-parallel linear layer of ``chunks`` defer its weight gradient to
    ``store`` while ``store.splitting``; the number of layers changed. A ValueError names a layer whose
    configuration the split does not cover."""
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear

    changed = 0
    for chunk in chunks:
        for name, module in chunk.named_modules():
            if not isinstance(module, ColumnParallelLinear | RowParallelLinear):
                continue
            if module.gradient_accumulation_fusion:
                raise ValueError(f"{name}: the split backward does not cover --gradient-accumulation-fusion")
            module._forward_impl = _split_forward(module._forward_impl, store, own=module.weight)
            changed += module.weight is not None
    return changed


def _split_forward(
    original: Callable[..., torch.Tensor], store: WeightGradStore, *, own: torch.nn.Parameter | None
) -> Callable[..., torch.Tensor]:
    def forward_impl(input: torch.Tensor, weight: torch.nn.Parameter, *args: Any, **kwargs: Any) -> torch.Tensor:
        # A weight passed in (the output layer tied to the embedding) also gets the embedding's gradient in B:
        # its W stays in B, so that DDP sees one gradient for it, complete.
        if not store.splitting or not weight.requires_grad or weight is not own:
            return original(input, weight, *args, **kwargs)
        from megatron.core.utils import get_tensor_model_parallel_group_if_none

        group = get_tensor_model_parallel_group_if_none(kwargs.get("tp_group"))
        # The weight enters detached: autograd has no edge to it, so DDP's hook for it runs once, from the W pass.
        # (The parameter itself travels in a tuple: a tensor argument would be an autograd edge again.)
        return _SplitLinear.apply(input, weight.detach(), kwargs["bias"], kwargs["allreduce_dgrad"],
                                  kwargs["sequence_parallel"], group, store, (weight,))  # fmt: skip

    return forward_impl

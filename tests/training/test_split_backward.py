"""The split backward: B now, W later, the same gradients in Megatron-Core's DDP buffers.

A real GPTModel of the local spec with the deferring linears (the layer spec of ``--enable-zero-bubble``),
wrapped in Megatron-Core's DDP with ``--overlap-grad-reduce`` and ``delay_wgrad_compute`` (which hands each
deferred weight's hook to its module), in one CPU process: several microbatches' forward and backward with the
transformer layers' weight gradients deferred, then the W passes, give the gradient buffers of the ordinary
backward to the last bit of fp32 arithmetic's reach; DDP's own bucket bookkeeping (which refuses to finish a sync
whose parameters did not all report) sees every parameter. The tensor-parallel and pipeline cases run in the
schedule's loss-equivalence rows.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

pytestmark = pytest.mark.distributed  # a one-process gloo group for Megatron-Core's parallel state

FLAGS = (
    "--num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16 --max-position-embeddings 16 "
    "--micro-batch-size 2 --global-batch-size 8 --mock-data --device cpu --overlap-grad-reduce "
    "--ddp-bucket-size 3000 --hidden-dropout 0 --attention-dropout 0"
).split()


def _model(untied: bool, *, deferring: bool = True, extra: list[str] | None = None) -> Any:
    import dataclasses

    from megatron.core.distributed import DistributedDataParallel

    from megatron_ext.config.training_config import parse_args
    from megatron_ext.training.model import ddp_config, gpt_model

    untie = ["--untie-embeddings-and-output-weights"] if untied else []
    cfg = parse_args([*FLAGS, *untie, *(extra or [])], world_size=1)
    # The layers and DDP of --enable-zero-bubble (which itself needs a pipeline: PP 1 here).
    cfg = dataclasses.replace(cfg, parallel=dataclasses.replace(cfg.parallel, enable_zero_bubble=deferring))
    torch.manual_seed(0)
    chunk = gpt_model(cfg, pre_process=True, post_process=True, vp_stage=None, device=torch.device("cpu"))
    return DistributedDataParallel(config=chunk.config, ddp_config=ddp_config(cfg), module=chunk)


def _grads(model: Any, store: Any | None, batches: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    model.zero_grad_buffer()
    for i, tokens in enumerate(batches):
        positions = torch.arange(tokens.shape[1]).expand_as(tokens)
        last = i == len(batches) - 1
        # Megatron-Core's schedules: gradient sync only on the last microbatch.
        context = model.no_sync() if not last else torch.enable_grad()
        with context:
            if store is not None:
                store.splitting = True
                store.start_b()
            loss = model(tokens, positions, None, labels=tokens.roll(-1, dims=1)).sum()
            loss.backward()
            if store is not None:
                assert store.close_b()
                store.splitting = False
    if store is not None:
        assert store.pending == len(batches)
        for i in range(len(batches)):  # the W passes afterwards, the last microbatch's last, with sync on
            if i < len(batches) - 1:
                with model.no_sync():
                    store.run_w()
            else:
                store.run_w()
    model.finish_grad_sync()
    return {name: p.main_grad.clone() for name, p in model.module.named_parameters()}


@pytest.mark.parametrize("untied", [False, True])
def test_deferred_weight_gradients_match_the_ordinary_backward(parallel_state: None, untied: bool) -> None:
    from megatron_ext.training.split_backward import WeightGradStore

    torch.manual_seed(1)
    batches = [torch.randint(0, 1000, (2, 16)) for _ in range(3)]
    expected = _grads(_model(untied, deferring=False), None, batches)
    model = _model(untied)
    store = WeightGradStore()
    # 2 layers × (QKV, projection, FC1, FC2); the output layer, which GPTModel builds outside the spec, keeps its
    # W in B, tied or not.
    assert store.attach([model]) == 8
    got = _grads(model, store, batches)
    assert got.keys() == expected.keys()
    for name, grad in expected.items():
        assert grad.abs().sum() > 0, name
        torch.testing.assert_close(got[name], grad, rtol=1e-5, atol=1e-6, msg=name)


def test_while_not_splitting_the_layers_compute_their_weight_gradients_at_once(parallel_state: None) -> None:
    """Outside the zero-bubble schedule the deferring layers' backward is the ordinary one: DDP, which gave their
    weights no autograd hook, still gets every gradient (through the module's hook, at once)."""
    from megatron_ext.training.split_backward import WeightGradStore

    torch.manual_seed(2)
    batches = [torch.randint(0, 1000, (2, 16))]
    expected = _grads(_model(False, deferring=False), None, batches)
    model = _model(False)
    store = WeightGradStore()
    store.attach([model])
    got = _grads(model, None, batches)  # the store never splits
    assert store.pending == 0
    for name, grad in expected.items():
        torch.testing.assert_close(got[name], grad, rtol=1e-5, atol=1e-6, msg=name)


def test_fused_weight_gradient_accumulation_is_refused_with_the_reason(parallel_state: None) -> None:
    """Megatron-Core's fused accumulation (a CUDA kernel) is not split; sequence parallelism is (the TP2 rows of
    the loss-equivalence matrix). A chunk without a deferring layer attaches with nothing to defer."""
    from megatron_ext.training.split_backward import WeightGradStore

    model = _model(False)
    next(m for m in model.modules() if hasattr(m, "gradient_accumulation_fusion")).gradient_accumulation_fusion = True
    with pytest.raises(ValueError, match="does not cover --gradient-accumulation-fusion"):
        WeightGradStore().attach([model])
    assert WeightGradStore().attach([_model(False, deferring=False)]) == 0


class _QueuedLinear(torch.autograd.Function):
    """A linear layer's arithmetic as Transformer Engine's with ``delay_wgrad_compute``: the backward returns the
    input gradient and queues what the weight gradient needs, for the layer's ``backward_dw()``."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, layer: Any) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.layer = layer
        return x.matmul(weight.t())

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        x, weight = ctx.saved_tensors
        queued = (x.reshape(-1, x.shape[-1]), grad.reshape(-1, grad.shape[-1]))
        if ctx.layer.delayed:
            ctx.layer.queue.append(queued)
            return grad.matmul(weight), None, None
        return grad.matmul(weight), queued[1].t().matmul(queued[0]), None


def _mocked_transformer_engine(base: type) -> type:
    """Megatron-Core's ``base`` linear standing in for its Transformer Engine wrapper, with Transformer Engine's
    ``delay_wgrad_compute`` contract: read from the layer's config; the weight marked ``skip_backward_post_hook``;
    DDP's hooks taken by ``register_wgrad_accumulation_and_reduce_hooks``; ``backward_dw()`` computes the oldest
    queued weight gradient and then runs them."""
    from collections import deque

    class MockedTransformerEngineLinear(base):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, config: Any, **kwargs: Any) -> None:
            super().__init__(*args, config=config, **kwargs)
            self.delayed = config.delay_wgrad_compute
            self.queue: deque[tuple[torch.Tensor, torch.Tensor]] = deque()
            self.hooks: list[Any] = []
            if self.delayed:
                self.weight.skip_backward_post_hook = True

        def register_wgrad_accumulation_and_reduce_hooks(self, hook: Any) -> None:
            self.hooks.append(hook)

        def _forward_impl(self, input: torch.Tensor, weight: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            assert kwargs["bias"] is None  # the model is built without linear biases
            return _QueuedLinear.apply(input, weight, self)

        def backward_dw(self) -> None:
            if not self.delayed:
                return
            x, grad = self.queue.popleft()
            self.weight.grad = grad.t().matmul(x)
            for hook in self.hooks:
                hook()

    return MockedTransformerEngineLinear


@pytest.fixture
def mocked_transformer_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    """The layer spec of a run with Transformer Engine's layers, each linear mocked as above."""
    import dataclasses
    import functools

    from megatron.core.models.gpt import gpt_layer_specs
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear

    from megatron_ext.training import model

    column, row = _mocked_transformer_engine(ColumnParallelLinear), _mocked_transformer_engine(RowParallelLinear)

    def spec(**kwargs: Any) -> Any:
        layer = gpt_layer_specs.get_gpt_layer_local_spec(**kwargs)
        attention = layer.submodules.self_attention.submodules
        attention.linear_qkv, attention.linear_proj = column, row
        mlp = layer.submodules.mlp
        linears = dataclasses.replace(mlp.keywords["submodules"], linear_fc1=column, linear_fc2=row)
        layer.submodules.mlp = functools.partial(mlp.func, *mlp.args, **(mlp.keywords | {"submodules": linears}))
        return layer

    monkeypatch.setattr(gpt_layer_specs, "get_gpt_layer_with_transformer_engine_spec", spec)
    monkeypatch.setattr(model, "use_transformer_engine", lambda cfg, device: True)


TE_FLAGS = ["--disable-bias-linear", "--no-gradient-accumulation-fusion", "--attention-backend", "local"]


@pytest.mark.parametrize("splitting", [True, False])
def test_transformer_engine_layers_defer_their_weight_gradients_through_backward_dw(
    parallel_state: None, mocked_transformer_engine: None, splitting: bool
) -> None:
    """Transformer Engine's layers (mocked) are built with delay_wgrad_compute in their own config copy (the
    model's stays off), each backward of theirs is one W of the store's, run by their backward_dw(), which hands
    each gradient to DDP through the hooks DDP registered with them: the gradient buffers of the ordinary
    backward. Outside the schedule each backward_dw() runs at once."""
    from megatron_ext.training.split_backward import WeightGradStore

    torch.manual_seed(3)
    batches = [torch.randint(0, 1000, (2, 16)) for _ in range(3 if splitting else 1)]
    expected = _grads(_model(False, deferring=False, extra=TE_FLAGS), None, batches)
    model = _model(False, extra=TE_FLAGS)
    layers = [m for m in model.modules() if hasattr(m, "backward_dw") and hasattr(m, "queue")]
    assert len(layers) == 8 and all(m.delayed and type(m).__name__.startswith("Deferring") for m in layers)
    assert not model.module.config.delay_wgrad_compute
    store = WeightGradStore()
    assert store.attach([model]) == 8
    got = _grads(model, store if splitting else None, batches)
    assert store.pending == 0 and not any(m.queue for m in layers)
    assert got.keys() == expected.keys()
    for name, grad in expected.items():
        assert grad.abs().sum() > 0, name
        torch.testing.assert_close(got[name], grad, rtol=1e-5, atol=1e-6, msg=name)

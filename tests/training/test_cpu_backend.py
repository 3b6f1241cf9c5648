"""The CPU backend maps CUDA-isms to the CPU and undoes itself."""

from __future__ import annotations

import pytest
import torch

from megatron_ext.training import cpu_backend

pytestmark = pytest.mark.unit


def test_device_arguments_and_type_names() -> None:
    with cpu_backend.cpu_backend():
        a = torch.zeros(3, device="cuda")
        b = torch.empty(2, device=torch.cuda.current_device())
        c = torch.ones(2).cuda()
        d = torch.ones(2).to("cuda")
        assert {t.device.type for t in (a, b, c, d)} == {"cpu"}
        assert torch.ones(1).type() == "torch.cuda.FloatTensor"
        assert torch.ones(1, dtype=torch.bfloat16).type() == "torch.cuda.BFloat16Tensor"
        torch.cuda.synchronize()
    assert torch.ones(1).type() == "torch.FloatTensor"
    assert not cpu_backend.is_enabled()


def test_cuda_rng_is_the_cpu_generator() -> None:
    with cpu_backend.cpu_backend():
        torch.cuda.manual_seed(7)
        state = torch.cuda.get_rng_state()
        first = torch.rand(4)
        torch.cuda.set_rng_state(state)
        assert torch.equal(first, torch.rand(4))


def test_rng_tracker_fork_draws_its_own_stream() -> None:
    from megatron.core.tensor_parallel import random as mrandom

    with cpu_backend.cpu_backend():
        tracker = mrandom.CudaRNGStatesTracker()
        torch.manual_seed(1)
        tracker.add("tp", 99)
        before = torch.get_rng_state()
        with tracker.fork("tp"):
            inside = torch.rand(3)
        assert torch.equal(torch.get_rng_state(), before)  # default stream restored
        torch.manual_seed(99)
        assert torch.equal(inside, torch.rand(3))


def test_backward_pass_runs_under_the_mapping() -> None:
    class AllocatesOnCudaInBackward(torch.autograd.Function):
        # As Megatron-Core's sequence-parallel linear layer: a buffer on "cuda" in backward.
        @staticmethod
        def forward(ctx, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
            return x * 2

        @staticmethod
        def backward(ctx, grad: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
            buffer = torch.empty(grad.shape, device=torch.cuda.current_device())
            buffer.copy_(grad * 2)
            return buffer

    with cpu_backend.cpu_backend():
        x = torch.ones(3, requires_grad=True)
        torch.autograd.backward(AllocatesOnCudaInBackward.apply(x).sum())
        assert torch.equal(x.grad, torch.full((3,), 2.0))
    assert not cpu_backend.is_enabled()

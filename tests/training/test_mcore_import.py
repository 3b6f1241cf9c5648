"""Megatron-Core's element-wise fusions: plain functions without a GPU, torch.compile'd with one."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import REPO
from tests.waits import QUICK_S

pytestmark = pytest.mark.unit

PROBE = """
import sys, torch
{setup}
import megatron_ext.training.model
import megatron.core.jit as jit
from megatron.core.fusions import fused_bias_gelu
print(jit.jit_fuser is torch.compile, jit.jit_fuser is jit.noop_decorator,
      "torch._dynamo" in sys.modules, hasattr(fused_bias_gelu.bias_gelu, "__wrapped__"))
"""


def probe(setup: str = "") -> list[str]:
    proc = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", PROBE.format(setup=setup)],
        capture_output=True, text=True, cwd=REPO, timeout=QUICK_S, check=True,
    )  # fmt: skip
    return proc.stdout.split()


def test_without_a_gpu_megatron_core_imports_without_torchdynamo() -> None:
    """This machine has no CUDA device: jit_fuser is Megatron-Core's no-op and TorchDynamo is never imported."""
    assert probe() == ["False", "True", "False", "False"]


def test_with_a_gpu_megatron_core_keeps_torch_compile() -> None:
    """Where CUDA is available the import is Megatron-Core's own: its fusions are torch.compile'd."""
    assert probe("torch.cuda.is_available = lambda: True") == ["True", "False", "True", "True"]


def test_installing_imports_nothing() -> None:
    """The hook costs nothing until Megatron-Core is imported: light modules of the package stay torch-free."""
    proc = subprocess.run(
        [sys.executable, "-c", "import sys, megatron_ext.training.chrome_trace; print('torch' in sys.modules)"],
        capture_output=True, text=True, cwd=REPO, timeout=QUICK_S, check=True,
    )  # fmt: skip
    assert proc.stdout.split() == ["False"]


def test_megatron_core_no_longer_imports_wandb_and_wandb_still_imports() -> None:
    """``import megatron.core`` tried ``import wandb`` (in its timers) on every start; it is not imported until the
    tracker asks for it (``--wandb-project``), and then it is the real package."""
    code = (
        "import sys, megatron_ext.training.model, megatron.core.timers as t\n"
        "print(t.wandb is None, 'wandb' in sys.modules)\n"
        "import wandb; print(hasattr(wandb, 'init'))"
    )
    proc = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, cwd=REPO, timeout=QUICK_S, check=True
    )  # fmt: skip
    assert proc.stdout.split() == ["True", "False", "True"]

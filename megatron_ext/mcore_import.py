"""Importing Megatron-Core on a machine without a GPU: its element-wise fusions stay plain functions.

When ``megatron.core.jit`` is imported, Megatron-Core sets its ``jit_fuser``
to ``torch.compile``, and the modules imported after it decorate about two
dozen element-wise functions (bias-GeLU, SwiGLU, rope, …) with it. The first
``torch.compile`` call imports TorchDynamo and Inductor, about 2 s of every
process's start-up, for fusions that pay off on GPUs only. ``install()``
arranges that, on a machine with no CUDA device, Megatron-Core's own
``disable_jit_fuser`` runs right after ``megatron.core.jit`` is executed, before
any module takes ``jit_fuser``: the functions compute the same thing eagerly.
Modules that decorate with a bare ``@torch.compile`` when they execute (the
MoE router's inference routing, the emerging optimizers' update functions)
execute, on such a machine, with ``torch.compile`` returning what it is given.
With a GPU, nothing changes (but for ``megatron.core.timers``'s wandb import,
skipped on every machine: see ``TIMERS_MODULE``). Installing costs nothing: it acts only when (and
if) Megatron-Core is imported.

``megatron_ext.training`` and ``megatron_ext.inference`` install it when they
are imported, before any of their modules imports Megatron-Core.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from types import ModuleType

JIT_MODULE = "megatron.core.jit"
ROUTER_MODULE = "megatron.core.transformer.moe.router"
"""Megatron-Core >= 0.19 decorates InferenceTopKRouter._compiled_topk_routing with a bare ``@torch.compile``
at class definition (router.py:918), which imports TorchDynamo whatever jit_fuser is."""
EAGER_PACKAGE = "emerging_optimizers"
"""NVIDIA's emerging optimizers (Muon, Lion, SOAP), which ``megatron.core.optimizer`` imports when installed,
decorate their update functions with a bare ``@torch.compile`` in a dozen modules (emerging-optimizers 0.3.0)."""
TIMERS_MODULE = "megatron.core.timers"
"""``import megatron.core`` imports it, and it tries ``import wandb`` (about 0.5 s and 100 MB where wandb is
installed), only so that ``Timers.write(writer=wandb)`` can tell a W&B writer: nothing here calls it (the
tracker writes W&B, importing wandb only for ``--wandb-project``). It runs with wandb unimportable, so that
``timers.wandb`` is None, as where wandb is not installed."""


def _compiles_at_import(fullname: str) -> bool:
    return fullname in (ROUTER_MODULE, EAGER_PACKAGE) or fullname.startswith(EAGER_PACKAGE + ".")


def _disable_without_cuda(module: ModuleType) -> None:
    import torch  # megatron.core.jit has imported it already

    if not torch.cuda.is_available():
        module.disable_jit_fuser()


def _eager_compile(model=None, **kwargs):
    return model if model is not None else (lambda fn: fn)


class _PlainFusionsWithoutCuda(importlib.abc.MetaPathFinder):
    """Finds ``megatron.core.jit`` as usual, and disables its fuser right after it runs when there is no CUDA;
    runs the modules that compile at import with ``torch.compile`` eager there, and ``megatron.core.timers``
    without wandb."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        # Stays installed: the emerging optimizers' modules may be imported at any time, one by one.
        if fullname not in (JIT_MODULE, TIMERS_MODULE) and not _compiles_at_import(fullname):
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        loader = spec.loader if spec is not None else None
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            if fullname == JIT_MODULE:
                run(module)
                _disable_without_cuda(module)
                return
            if fullname == TIMERS_MODULE:
                hidden = "wandb" not in sys.modules
                if hidden:
                    sys.modules["wandb"] = None  # type: ignore[assignment]  # import wandb raises ImportError
                try:
                    run(module)
                finally:
                    if hidden:
                        del sys.modules["wandb"]
                return
            import torch

            if torch.cuda.is_available():
                run(module)
                return
            compile_ = torch.compile
            torch.compile = _eager_compile
            try:
                run(module)
            finally:
                torch.compile = compile_

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def install() -> None:
    """Disable Megatron-Core's torch.compile fuser when it is first imported on a machine without CUDA."""
    if JIT_MODULE in sys.modules or any(isinstance(f, _PlainFusionsWithoutCuda) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _PlainFusionsWithoutCuda())

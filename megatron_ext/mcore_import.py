"""Importing Megatron-Core on a machine without a GPU: its element-wise fusions stay plain functions.

When ``megatron.core.jit`` is imported, Megatron-Core sets its ``jit_fuser``
to ``torch.compile``, and its package import then decorates about two dozen
element-wise functions (bias-GeLU, SwiGLU, rope, …) with it. The first
``torch.compile`` call imports TorchDynamo and Inductor, about 1.7 s of every
process's start-up, for fusions that pay off on GPUs only. On a machine with
no CUDA device, ``prepare()`` imports Megatron-Core with its own
``disable_jit_fuser`` in effect: the package import runs while
``torch.compile`` returns the function unchanged (what ``jit_fuser`` captures),
then ``disable_jit_fuser`` keeps later imports plain too. The functions compute
the same thing eagerly. With a GPU, nothing changes.

``megatron_ext.training`` and ``megatron_ext.inference`` call it when they are
imported, before any of their modules imports Megatron-Core.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch


def _uncompiled(model: Callable[..., Any] | None = None, **_: Any) -> Any:
    """``torch.compile``'s signature, returning the function itself (or, as a decorator factory, the identity)."""
    return model if model is not None else (lambda fn: fn)


def prepare() -> None:
    """Import Megatron-Core with plain element-wise functions when no CUDA device exists (see the module doc)."""
    if "megatron.core" in sys.modules or torch.cuda.is_available():
        return
    compile_ = torch.compile
    torch.compile = _uncompiled
    try:
        import megatron.core.jit as jit

        jit.disable_jit_fuser()
    finally:
        torch.compile = compile_

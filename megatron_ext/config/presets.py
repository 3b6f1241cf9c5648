"""Model shapes for ``--model NAME`` of ``pretrain_gpt.py``, ``tools/layout.py`` and the recipes.

Each preset is a set of ``pretrain_gpt.py`` model flags (``--model NAME``
expands to them; flags given after it override them) plus the global batch
size its paper trained with, which the calculator uses. Sources:

* ``gpt3-*``: Brown et al. 2020, "Language Models are Few-Shot Learners",
  Table 2.1 (layers, d_model, heads, batch size in tokens / 2048), sequence
  2048, GPT-2 BPE vocabulary (50,257). Where Table 2.1's head count does not
  divide d_model (1.3B: 24 heads of 128 for d_model 2048) or d_model is not a
  multiple of the heads (13B: 5140), we use the shapes Megatron-LM and NeMo
  ship for these sizes: 1.3B with 16 heads of 128, 13B with d_model 5120.
  126M is the 125M "Small" model as Megatron counts it (tied embeddings).
* ``megatron-530b`` and ``megatron-1t``: Narayanan et al. 2021, "Efficient
  Large-Scale Language Model Training on GPU Clusters Using Megatron-LM",
  Table 1 (vocabulary 51,200, sequence 2048; the 530B shape is MT-NLG's).
* ``llama3.1-*``, ``qwen2.5-*`` and ``mistral-7b``: the models continued
  pretraining starts from, each as its ``config.json`` on the Hugging Face Hub
  describes it (meta-llama/Llama-3.1-8B and -70B, Qwen/Qwen2.5-0.5B, -7B and
  -72B, mistralai/Mistral-7B-v0.1): the flags ``tools/convert_checkpoint.py
  from-hf`` gives (a test imports each config and compares). The vocabulary is
  the embedding's rows. Sequence length: the pretraining length of the Llama 3
  paper (8192) and the Qwen2.5 report (4096); for Mistral 7B its sliding
  window (4096), the longest sequence computed exactly here. None of them
  publishes a global batch size: give ``--global-batch-size``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any


@dataclass(frozen=True, kw_only=True)
class ModelPreset:
    """A named model shape with the batch size its source trained with."""

    name: str
    """What ``--model`` takes."""
    description: str
    """Model and source."""
    num_layers: int
    """Transformer layers."""
    hidden_size: int
    """Hidden size (d_model)."""
    num_attention_heads: int
    """Attention heads."""
    seq_length: int
    """Sequence length."""
    vocab_size: int
    """Tokenizer vocabulary (padded by the calculator as Megatron does)."""
    global_batch_size: int | None
    """Sequences per step in the source (None: it publishes none)."""
    architecture: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    """The other ``ModelArgs`` fields of the model (FFN size, grouped-query attention, rotary positions, …)."""

    def model_flags(self) -> dict[str, Any]:
        """The model as ``ModelArgs`` field values (``pretrain_gpt.py`` flag names)."""
        return {
            "num_layers": self.num_layers,
            "hidden_size": self.hidden_size,
            "num_attention_heads": self.num_attention_heads,
            "seq_length": self.seq_length,
            "vocab_size": self.vocab_size,
            **self.architecture,
        }


def _rotary(*, ffn: int, groups: int, theta: int, eps: float, positions: int, **other: Any) -> Mapping[str, Any]:
    """The Llama family's fields (rotary positions, SwiGLU, RMSNorm, grouped-query attention, no dropout)."""
    return MappingProxyType(
        {
            "ffn_hidden_size": ffn,
            "group_query_attention": True,
            "num_query_groups": groups,
            "max_position_embeddings": positions,
            "position_embedding_type": "rope",
            "rotary_base": theta,
            "swiglu": True,
            "normalization": "RMSNorm",
            "norm_epsilon": eps,
            "hidden_dropout": 0.0,
            "attention_dropout": 0.0,
            **other,
        }
    )


def _hub(
    name: str,
    model: str,
    repo: str,
    *,
    layers: int,
    hidden: int,
    heads: int,
    seq: int,
    vocab: int,
    note: str = "",
    **rotary: Any,
) -> ModelPreset:
    """A model of the Hugging Face Hub: its config.json's shape and Llama-family fields; no published batch size."""
    return ModelPreset(
        name=name, description=f"{model} (config.json of {repo}){note}", num_layers=layers, hidden_size=hidden,
        num_attention_heads=heads, seq_length=seq, vocab_size=vocab, global_batch_size=None,
        architecture=_rotary(**rotary),
    )  # fmt: skip


_LLAMA31: dict[str, Any] = {
    "use_rope_scaling": True,
    "disable_bias_linear": True,
    "untie_embeddings_and_output_weights": True,
}
_QWEN25: dict[str, Any] = {"disable_bias_linear": True, "add_qkv_bias": True}
_UNTIED: dict[str, Any] = {"untie_embeddings_and_output_weights": True}

_HUB_PRESETS = (
    _hub("llama3.1-8b", "Llama 3.1 8B", "meta-llama/Llama-3.1-8B", layers=32, hidden=4096, heads=32, seq=8192,
         vocab=128256, ffn=14336, groups=8, theta=500000, eps=1e-5, positions=131072, **_LLAMA31),
    _hub("llama3.1-70b", "Llama 3.1 70B", "meta-llama/Llama-3.1-70B", layers=80, hidden=8192, heads=64, seq=8192,
         vocab=128256, ffn=28672, groups=8, theta=500000, eps=1e-5, positions=131072, **_LLAMA31),
    _hub("qwen2.5-0.5b", "Qwen2.5 0.5B", "Qwen/Qwen2.5-0.5B", note=", tied embeddings", layers=24, hidden=896,
         heads=14, seq=4096, vocab=151936, ffn=4864, groups=2, theta=1000000, eps=1e-6, positions=32768, **_QWEN25),
    _hub("qwen2.5-7b", "Qwen2.5 7B", "Qwen/Qwen2.5-7B", layers=28, hidden=3584, heads=28, seq=4096, vocab=152064,
         ffn=18944, groups=4, theta=1000000, eps=1e-6, positions=131072, **_QWEN25, **_UNTIED),
    _hub("qwen2.5-72b", "Qwen2.5 72B", "Qwen/Qwen2.5-72B", layers=80, hidden=8192, heads=64, seq=4096, vocab=152064,
         ffn=29568, groups=8, theta=1000000, eps=1e-5, positions=131072, **_QWEN25, **_UNTIED),
    _hub("mistral-7b", "Mistral 7B", "mistralai/Mistral-7B-v0.1", note=", at its 4096-token sliding window",
         layers=32, hidden=4096, heads=32, seq=4096, vocab=32000, ffn=14336, groups=8, theta=10000, eps=1e-5,
         positions=32768, window_size="4095,0", disable_bias_linear=True, **_UNTIED),
)  # fmt: skip
"""Llama 3.1 8B and 70B, Qwen2.5 0.5B, 7B and 72B, and Mistral 7B (see the module docstring)."""


_GPT3 = "GPT-3 (Brown et al. 2020, Table 2.1)"
_MEGATRON = "Narayanan et al. 2021, Table 1"

PRESETS: Mapping[str, ModelPreset] = MappingProxyType(
    {
        p.name: p
        for p in (
            ModelPreset(
                name="gpt3-126m",
                description=f"{_GPT3} Small",
                num_layers=12,
                hidden_size=768,
                num_attention_heads=12,
                seq_length=2048,
                vocab_size=50257,
                global_batch_size=256,
            ),
            ModelPreset(
                name="gpt3-350m",
                description=f"{_GPT3} Medium",
                num_layers=24,
                hidden_size=1024,
                num_attention_heads=16,
                seq_length=2048,
                vocab_size=50257,
                global_batch_size=256,
            ),
            ModelPreset(
                name="gpt3-1.3b",
                description=f"{_GPT3} XL, 16 heads of 128 as in Megatron-LM/NeMo",
                num_layers=24,
                hidden_size=2048,
                num_attention_heads=16,
                seq_length=2048,
                vocab_size=50257,
                global_batch_size=512,
            ),
            ModelPreset(
                name="gpt3-2.7b",
                description=f"{_GPT3} 2.7B",
                num_layers=32,
                hidden_size=2560,
                num_attention_heads=32,
                seq_length=2048,
                vocab_size=50257,
                global_batch_size=512,
            ),
            ModelPreset(
                name="gpt3-6.7b",
                description=f"{_GPT3} 6.7B",
                num_layers=32,
                hidden_size=4096,
                num_attention_heads=32,
                seq_length=2048,
                vocab_size=50257,
                global_batch_size=1024,
            ),
            ModelPreset(
                name="gpt3-13b",
                description=f"{_GPT3} 13B, d_model 5120 as in Megatron-LM/NeMo",
                num_layers=40,
                hidden_size=5120,
                num_attention_heads=40,
                seq_length=2048,
                vocab_size=50257,
                global_batch_size=1024,
            ),
            ModelPreset(
                name="gpt3-175b",
                description=f"{_GPT3} 175B",
                num_layers=96,
                hidden_size=12288,
                num_attention_heads=96,
                seq_length=2048,
                vocab_size=50257,
                global_batch_size=1536,
            ),
            ModelPreset(
                name="megatron-530b",
                description=f"{_MEGATRON}, 529.6B (the MT-NLG shape)",
                num_layers=105,
                hidden_size=20480,
                num_attention_heads=128,
                seq_length=2048,
                vocab_size=51200,
                global_batch_size=2520,
            ),
            ModelPreset(
                name="megatron-1t",
                description=f"{_MEGATRON}, 1008B",
                num_layers=128,
                hidden_size=25600,
                num_attention_heads=160,
                seq_length=2048,
                vocab_size=51200,
                global_batch_size=3072,
            ),
            *_HUB_PRESETS,
            ModelPreset(
                name="gpt-tiny",
                description="A tiny GPT for CPU rehearsals of a layout (this project's recipes and demo)",
                num_layers=4,
                hidden_size=64,
                num_attention_heads=4,
                seq_length=64,
                vocab_size=1023,
                global_batch_size=8,
            ),
        )
    }
)


def get_preset(name: str) -> ModelPreset:
    """The preset called ``name``; a ValueError listing the known ones otherwise."""
    try:
        return PRESETS[name.lower()]
    except KeyError:
        raise ValueError(f"unknown --model {name!r}; choose one of {', '.join(PRESETS)}") from None

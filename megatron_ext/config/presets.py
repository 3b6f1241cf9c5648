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
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
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
    global_batch_size: int
    """Sequences per step in the source."""

    def model_flags(self) -> dict[str, Any]:
        """The shape as ``ModelArgs`` field values (``pretrain_gpt.py`` flag names)."""
        return {
            "num_layers": self.num_layers,
            "hidden_size": self.hidden_size,
            "num_attention_heads": self.num_attention_heads,
            "seq_length": self.seq_length,
            "vocab_size": self.vocab_size,
        }


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

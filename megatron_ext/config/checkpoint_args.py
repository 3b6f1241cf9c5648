"""``--use-checkpoint-args``: the flags a checkpoint gives back, as Megatron-LM's ``load_args_from_checkpoint``
(``megatron/training/checkpointing.py``) takes them. Pure: the saved arguments are read by the entry.

Megatron-LM sets each listed argument from the checkpoint either when the command line leaves it unset
(``force=False``: the sizes) or always (``force=True``: the architecture switches), skipping values the
checkpoint does not have. Its own names map to this project's fields (``add_bias_linear`` is the inverse of
``--disable-bias-linear``); the ones it lists that this project does not have are not listed here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

ModelArg = tuple[str, str, bool]
"""(argument group, field, forced)."""

MODEL_ARGS: tuple[ModelArg, ...] = (
    ("model", "num_layers", False),
    ("model", "hidden_size", False),
    ("model", "ffn_hidden_size", False),
    ("model", "seq_length", False),
    ("model", "num_attention_heads", False),
    ("model", "num_query_groups", True),
    ("model", "group_query_attention", True),
    ("model", "kv_channels", False),
    ("model", "max_position_embeddings", False),
    ("model", "position_embedding_type", True),
    ("model", "rotary_base", True),
    ("model", "rotary_percent", True),
    ("model", "disable_bias_linear", True),
    ("model", "add_qkv_bias", True),
    ("model", "squared_relu", True),
    ("model", "swiglu", True),
    ("model", "untie_embeddings_and_output_weights", True),
    ("model", "apply_layernorm_1p", True),
    ("model", "normalization", True),
    ("model", "apply_query_key_layer_scaling", True),
    ("model", "attention_dropout", True),
    ("model", "hidden_dropout", True),
    ("data", "tiktoken_pattern", True),
)
"""What Megatron-LM always takes, in its order."""

TOKENIZER_ARGS: tuple[ModelArg, ...] = (("data", "tokenizer_model", True), ("data", "tokenizer_type", True))
"""Unless ``--no-use-tokenizer-model-from-checkpoint-args``."""

PARALLEL_ARGS: tuple[ModelArg, ...] = (
    ("parallel", "tensor_model_parallel_size", True),
    ("parallel", "pipeline_model_parallel_size", True),
    ("parallel", "virtual_pipeline_model_parallel_size", True),
    ("parallel", "num_layers_per_virtual_pipeline_stage", False),
)
"""With ``--use-mp-args-from-checkpoint-args``."""


def with_checkpoint_args(
    given: Mapping[str, Mapping[str, Any]], saved: Mapping[str, Mapping[str, Any]], *, tokenizer: bool, parallel: bool
) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """``given`` (the flags of the command line, by group) with the checkpoint's ``saved`` arguments taken as
    Megatron-LM takes them; and the fields that changed, as ``name=value`` notes."""
    merged = {group: dict(values) for group, values in given.items()}
    taken: list[str] = []
    rules = MODEL_ARGS + (TOKENIZER_ARGS if tokenizer else ()) + (PARALLEL_ARGS if parallel else ())
    for group, name, forced in rules:
        value = saved.get(group, {}).get(name)
        if value is None or (not forced and name in merged.get(group, {})):
            continue
        value = tuple(value) if isinstance(value, list) else value
        if merged.setdefault(group, {}).get(name, object()) != value:
            merged[group][name] = value
            taken.append(f"{name}={value}")
    return merged, taken

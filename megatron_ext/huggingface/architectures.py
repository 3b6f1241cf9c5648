"""Which of our models have a Hugging Face ``transformers`` architecture, and their configs both ways.

Two architectures carry over exactly (same functions, same weights):

- **Llama** (``LlamaForCausalLM``): rotary positions on every head dimension, SwiGLU,
  RMSNorm, grouped-query attention or not, biases or not, tied or untied output.
  Megatron-Core's rotary embedding (not interleaved) is ``rotate_half`` on the two
  halves of each head, as in ``transformers``' Llama.
- **GPT-2** (``GPT2LMHeadModel``): learned absolute positions, GeLU (exact, erf: the
  ``gelu`` activation; GPT-2's own ``gelu_new`` is the tanh approximation), LayerNorm,
  biases, as many key/value heads as query heads.

Anything else is refused with every feature that does not carry over.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from megatron_ext.config.arguments import ModelArgs

LLAMA = "llama"
GPT2 = "gpt2"
ARCHITECTURES = {LLAMA: "LlamaForCausalLM", GPT2: "GPT2LMHeadModel"}
"""``model_type`` → the ``transformers`` class written to and read from ``config.json``."""


class ConversionError(ValueError):
    """A model or checkpoint that cannot be converted, with what does not carry over."""


def architecture(model: ModelArgs) -> str:
    """``LLAMA`` or ``GPT2`` for a model that converts exactly; ConversionError names every obstacle."""
    rope = model.position_embedding_type == "rope"
    problems = []
    if model.position_embedding_type not in ("rope", "learned_absolute"):
        problems.append(f"--position-embedding-type {model.position_embedding_type} (neither rope nor learned)")
    if model.apply_layernorm_1p:
        problems.append("--apply-layernorm-1p (zero-centred norm weights)")
    if model.qk_layernorm:
        problems.append("--qk-layernorm (neither Llama nor GPT-2 normalizes queries and keys)")
    if model.squared_relu:
        problems.append("--squared-relu (neither Llama's SwiGLU nor GPT-2's GeLU)")
    if rope:
        if not model.swiglu:
            problems.append("rotary positions without --swiglu (Llama's MLP is SwiGLU)")
        if model.normalization != "RMSNorm":
            problems.append("rotary positions with LayerNorm (Llama normalizes with RMSNorm)")
        if model.rotary_percent != 1.0:
            problems.append(f"--rotary-percent {model.rotary_percent:g} (Llama rotates every head dimension)")
    else:
        if model.swiglu:
            problems.append("learned positions with --swiglu (GPT-2's MLP is GeLU)")
        if model.normalization != "LayerNorm":
            problems.append("learned positions with RMSNorm (GPT-2 normalizes with LayerNorm)")
        if model.disable_bias_linear:
            problems.append("learned positions with --disable-bias-linear (GPT-2's linear layers have biases)")
        if model.effective_num_query_groups != model.num_attention_heads:
            problems.append("grouped-query attention with learned positions (GPT-2 has a key/value head per head)")
        if model.effective_kv_channels * model.num_attention_heads != model.hidden_size:
            problems.append("--kv-channels × heads ≠ --hidden-size (GPT-2's heads split the hidden size)")
    if problems:
        raise ConversionError(
            "this model has no Hugging Face architecture that computes the same function: "
            + "; ".join(problems)
            + ". Supported: Llama (--position-embedding-type rope --swiglu --normalization RMSNorm) and GPT-2 "
            "(learned absolute positions, GeLU, LayerNorm, biases)"
        )
    return LLAMA if rope else GPT2


@dataclass(frozen=True)
class TokenIds:
    """The special tokens ``config.json`` and ``generation_config.json`` name."""

    bos: int | None
    eos: int | None


def hf_config(model: ModelArgs, *, padded_vocab_size: int, tokens: TokenIds, dtype: str) -> dict[str, Any]:
    """``config.json`` of ``model`` (whose architecture is ``architecture(model)``); the vocabulary is the
    padded one, as the embedding and output layer have that many rows."""
    arch = architecture(model)
    common = {
        "architectures": [ARCHITECTURES[arch]],
        "model_type": arch,
        "vocab_size": padded_vocab_size,
        "tie_word_embeddings": not model.untie_embeddings_and_output_weights,
        "bos_token_id": tokens.bos,
        "eos_token_id": tokens.eos,
        "initializer_range": model.init_method_std,
        "dtype": dtype,
        "torch_dtype": dtype,  # transformers 4's name
        "use_cache": True,
    }
    max_positions = model.max_position_embeddings or model.seq_length
    if arch == LLAMA:
        return common | {
            "hidden_size": model.hidden_size,
            "intermediate_size": model.effective_ffn_hidden_size,
            "num_hidden_layers": model.num_layers,
            "num_attention_heads": model.num_attention_heads,
            "num_key_value_heads": model.effective_num_query_groups,
            "head_dim": model.effective_kv_channels,
            "hidden_act": "silu",
            "max_position_embeddings": max_positions,
            "rms_norm_eps": model.norm_epsilon,
            "rope_theta": float(model.rotary_base),  # transformers 4
            "rope_parameters": {"rope_theta": float(model.rotary_base), **rope_scaling(model)},  # transformers 5
            **({"rope_scaling": dict(LLAMA3_ROPE)} if model.use_rope_scaling else {}),  # transformers 4
            "attention_bias": not model.disable_bias_linear,
            "mlp_bias": not model.disable_bias_linear,
            "attention_dropout": model.attention_dropout,
        }
    return common | {
        "n_embd": model.hidden_size,
        "n_inner": model.effective_ffn_hidden_size,
        "n_layer": model.num_layers,
        "n_head": model.num_attention_heads,
        "n_positions": max_positions,
        "activation_function": "gelu",
        "layer_norm_epsilon": model.norm_epsilon,
        "resid_pdrop": model.hidden_dropout,
        "embd_pdrop": model.hidden_dropout,
        "attn_pdrop": model.attention_dropout,
        "scale_attn_weights": True,
    }


LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}  # fmt: skip
"""Llama 3.1's rope scaling: what Megatron-Core's ``RotaryEmbedding._apply_scaling`` computes (its defaults, which
``--use-rope-scaling`` takes) in ``transformers``' terms (``_compute_llama3_parameters``)."""


def rope_scaling(model: ModelArgs) -> dict[str, Any]:
    """The rope type of ``config.json``'s ``rope_parameters`` (without ``rope_theta``)."""
    return dict(LLAMA3_ROPE) if model.use_rope_scaling else {"rope_type": "default"}


def model_flags(config: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The architecture and our model arguments (``ModelArgs`` fields) of a ``transformers`` ``config.json``;
    ConversionError names whatever our models do not compute the same way."""
    arch = config.get("model_type")
    if arch not in ARCHITECTURES:
        raise ConversionError(
            f"model_type {arch!r} is not supported; supported: "
            + ", ".join(f"{k} ({v})" for k, v in ARCHITECTURES.items())
        )
    problems: list[str] = []
    try:
        flags = _flags(arch, config, problems)
    except (KeyError, TypeError, ValueError) as exc:
        if problems:
            raise ConversionError(
                f"this {ARCHITECTURES[arch]} cannot be imported exactly: " + "; ".join(problems)
            ) from exc
        raise ConversionError(f"config.json of a {ARCHITECTURES[arch]} lacks or mangles {exc}") from exc
    if problems:
        raise ConversionError(f"this {ARCHITECTURES[arch]} cannot be imported exactly: " + "; ".join(problems))
    flags["untie_embeddings_and_output_weights"] = not _value(arch, config, "tie_word_embeddings")
    flags["init_method_std"] = float(_value(arch, config, "initializer_range"))
    return arch, flags


TRANSFORMERS_DEFAULTS: dict[str, dict[str, Any]] = {
    LLAMA: {
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "rms_norm_eps": 1e-6,
        "attention_dropout": 0.0,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "initializer_range": 0.02,
    },
    GPT2: {
        "activation_function": "gelu_new",
        "scale_attn_weights": True,
        "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False,
        "add_cross_attention": False,
        "layer_norm_epsilon": 1e-5,
        "resid_pdrop": 0.1,
        "attn_pdrop": 0.1,
        "tie_word_embeddings": True,
        "initializer_range": 0.02,
    },
}
"""What ``transformers`` uses for each optional ``config.json`` key this importer reads (its ``LlamaConfig``'s and
``GPT2Config``'s defaults; a test compares them): a missing key means that, never the value we would like."""


def _value(arch: str, config: dict[str, Any], key: str) -> Any:
    """``config[key]``, or transformers' default when the key is missing."""
    return config.get(key, TRANSFORMERS_DEFAULTS[arch][key])


def _flags(arch: str, config: dict[str, Any], problems: list[str]) -> dict[str, Any]:
    """``model_flags``' reading of each architecture's fields (``problems`` gets what does not carry over)."""

    def expect(key: str, allowed: tuple[Any, ...], why: str) -> None:
        value = _value(arch, config, key)
        if value not in allowed:
            missing = "" if key in config else " (transformers' default: the key is absent)"
            problems.append(f"{key}={value!r}{missing} ({why})")

    if arch == LLAMA:
        rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type == "llama3":
            differ = [
                f"{key}={rope.get(key)!r} (Megatron-Core's is {value!r})"
                for key, value in LLAMA3_ROPE.items()
                if key != "rope_type" and float(rope.get(key, -1)) != value
            ]
            if differ:
                problems.append("llama3 rope scaling with " + ", ".join(differ))
        elif rope_type != "default":
            problems.append(
                f"rope type {rope_type!r} (the plain rotary embedding and Llama 3.1's scaling are implemented here)"
            )
        theta = rope.get("rope_theta", _value(arch, config, "rope_theta"))
        if float(theta) != int(theta):
            problems.append(f"rope_theta={theta} (--rotary-base is an integer)")
        expect("hidden_act", ("silu",), "Megatron's SwiGLU gates with SiLU")
        if config.get("partial_rotary_factor", 1.0) not in (1.0, None):
            problems.append(
                f"partial_rotary_factor={config['partial_rotary_factor']!r} (rope on every head dimension only)"
            )
        if bool(_value(arch, config, "attention_bias")) != bool(_value(arch, config, "mlp_bias")):
            problems.append("attention_bias ≠ mlp_bias (--disable-bias-linear sets both)")
        heads = int(config["num_attention_heads"])
        groups = int(config.get("num_key_value_heads") or heads)
        head_dim = int(config.get("head_dim") or config["hidden_size"] // heads)
        flags: dict[str, Any] = {
            "num_layers": int(config["num_hidden_layers"]),
            "hidden_size": int(config["hidden_size"]),
            "ffn_hidden_size": int(config["intermediate_size"]),
            "num_attention_heads": heads,
            "group_query_attention": groups != heads,
            "num_query_groups": groups if groups != heads else None,
            "kv_channels": head_dim if head_dim * heads != int(config["hidden_size"]) else None,
            "max_position_embeddings": int(config["max_position_embeddings"]),
            "seq_length": int(config["max_position_embeddings"]),
            "position_embedding_type": "rope",
            "rotary_base": int(theta),
            "use_rope_scaling": rope_type == "llama3",
            "swiglu": True,
            "normalization": "RMSNorm",
            "norm_epsilon": float(_value(arch, config, "rms_norm_eps")),
            "disable_bias_linear": not _value(arch, config, "attention_bias"),
            "attention_dropout": float(_value(arch, config, "attention_dropout")),
            "hidden_dropout": 0.0,
        }
    else:
        expect("activation_function", ("gelu",), "Megatron's GeLU is the exact one; gelu_new is the tanh approximation")
        expect("scale_attn_weights", (True,), "Megatron scales attention scores by 1/sqrt(head dim)")
        expect("scale_attn_by_inverse_layer_idx", (False,), "not in Megatron")
        expect("reorder_and_upcast_attn", (False,), "not in Megatron")
        expect("add_cross_attention", (False,), "a decoder-only GPT has no cross attention")
        hidden = int(config["n_embd"])
        flags = {
            "num_layers": int(config["n_layer"]),
            "hidden_size": hidden,
            "ffn_hidden_size": int(config.get("n_inner") or 4 * hidden),
            "num_attention_heads": int(config["n_head"]),
            "max_position_embeddings": int(config["n_positions"]),
            "seq_length": int(config["n_positions"]),
            "position_embedding_type": "learned_absolute",
            "normalization": "LayerNorm",
            "norm_epsilon": float(_value(arch, config, "layer_norm_epsilon")),
            "hidden_dropout": float(_value(arch, config, "resid_pdrop")),
            "attention_dropout": float(_value(arch, config, "attn_pdrop")),
        }
    return flags

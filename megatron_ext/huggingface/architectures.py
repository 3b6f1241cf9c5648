"""Which of our models have a Hugging Face ``transformers`` architecture, and their configs both ways.

Five architectures carry over exactly (same functions, same weights):

- **Llama** (``LlamaForCausalLM``): rotary positions on every head dimension (Llama 3.1's rope scaling, or
  linear rope scaling: ``--rotary-seq-len-interpolation-factor``), SwiGLU, RMSNorm, grouped-query attention or
  not, biases or not, tied or untied output.
  Megatron-Core's rotary embedding (not interleaved) is ``rotate_half`` on the two halves of each head, as
  in ``transformers``' Llama.
- **Qwen2** (``Qwen2ForCausalLM``, Qwen2.5's too): Llama with biases on the query, key and value projections
  only (Megatron-Core's ``add_qkv_bias``).
- **Mistral** (``MistralForCausalLM``): Llama without biases and with a sliding window. It is the same
  function where the window covers the sequence (``--window-size``), and refused where it does not.
- **Qwen3** (``Qwen3ForCausalLM``): Llama without biases, with each head's queries and keys RMS-normalized
  before the rotary embedding (Megatron-Core's ``--qk-layernorm``).
- **GPT-2** (``GPT2LMHeadModel``): learned absolute positions, GeLU, LayerNorm, biases, as many key/value heads
  as query heads. The exact (erf) GeLU is the ``gelu`` activation; GPT-2's own ``gelu_new`` (and
  ``gelu_pytorch_tanh``, the same function) is its tanh approximation, ``--openai-gelu``.

Anything else is refused, naming every feature that does not carry over.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from megatron_ext.config.arguments import ModelArgs

LLAMA = "llama"
QWEN2 = "qwen2"
QWEN3 = "qwen3"
MISTRAL = "mistral"
GPT2 = "gpt2"
ARCHITECTURES = {
    LLAMA: "LlamaForCausalLM",
    QWEN2: "Qwen2ForCausalLM",
    QWEN3: "Qwen3ForCausalLM",
    MISTRAL: "MistralForCausalLM",
    GPT2: "GPT2LMHeadModel",
}
"""``model_type`` → the ``transformers`` class written to and read from ``config.json``."""

ROTARY = (LLAMA, QWEN2, QWEN3, MISTRAL)
"""The Llama family: one reading of their configs, one weight layout."""


class ConversionError(ValueError):
    """A model or checkpoint that cannot be converted, with what does not carry over."""


def architecture(model: ModelArgs) -> str:
    """The ``model_type`` of a model that converts exactly; ConversionError names every obstacle.

    Rotary models are Llama, unless they have Qwen2's query/key/value-only biases (``--add-qkv-bias
    --disable-bias-linear``), Qwen3's query and key norms (``--qk-layernorm``) or Mistral's sliding window
    (``--window-size``); learned positions are GPT-2.
    """
    rope = model.position_embedding_type == "rope"
    problems = []
    if model.position_embedding_type not in ("rope", "learned_absolute"):
        problems.append(f"--position-embedding-type {model.position_embedding_type} (neither rope nor learned)")
    if model.apply_layernorm_1p:
        problems.append("--apply-layernorm-1p (zero-centred norm weights)")
    if model.squared_relu:
        problems.append("--squared-relu (neither Llama's SwiGLU nor GPT-2's GeLU)")
    qkv_bias_only = model.add_qkv_bias and model.disable_bias_linear
    if rope:
        if not model.swiglu:
            problems.append("rotary positions without --swiglu (Llama's MLP is SwiGLU)")
        if model.normalization != "RMSNorm":
            problems.append("rotary positions with LayerNorm (Llama normalizes with RMSNorm)")
        if model.rotary_percent != 1.0:
            problems.append(f"--rotary-percent {model.rotary_percent:g} (Llama rotates every head dimension)")
        if model.use_rope_scaling and model.rotary_seq_len_interpolation_factor is not None:
            problems.append("--use-rope-scaling with --rotary-seq-len-interpolation-factor (transformers scales the "
                            "rotary embedding one way: llama3 or linear)")  # fmt: skip
        if model.window_size is not None and not model.disable_bias_linear:
            problems.append("--window-size with biases (Mistral's linear layers have none)")
        if model.window_size is not None and qkv_bias_only:
            problems.append("--window-size with --add-qkv-bias (Mistral has no biases, Qwen2 no window here)")
        if model.qk_layernorm and (not model.disable_bias_linear or model.add_qkv_bias or model.window_size):
            problems.append("--qk-layernorm with biases or a window (Qwen3, which normalizes queries and keys, has "
                            "neither)")  # fmt: skip
        if model.qk_layernorm and model.normalization != "RMSNorm":
            problems.append("--qk-layernorm with LayerNorm (Qwen3's query and key norms are RMSNorm)")
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
        if model.window_size is not None:
            problems.append("--window-size with learned positions (GPT-2 attends over the whole context)")
        if model.qk_layernorm:
            problems.append("--qk-layernorm with learned positions (GPT-2 does not normalize queries and keys)")
    if problems:
        raise ConversionError(
            "this model has no Hugging Face architecture that computes the same function: "
            + "; ".join(problems)
            + ". Supported: Llama (--position-embedding-type rope --swiglu --normalization RMSNorm), Qwen2 (the "
            "same with --disable-bias-linear --add-qkv-bias), Qwen3 (with --disable-bias-linear --qk-layernorm), "
            "Mistral (with --disable-bias-linear --window-size) and GPT-2 (learned absolute positions, GeLU or "
            "--openai-gelu, LayerNorm, biases)"
        )
    if not rope:
        return GPT2
    if model.window_size is not None:
        return MISTRAL
    if model.qk_layernorm:
        return QWEN3
    return QWEN2 if qkv_bias_only else LLAMA


@dataclass(frozen=True)
class TokenIds:
    """The special tokens ``config.json`` and ``generation_config.json`` name."""

    bos: int | None
    eos: int | None


def sliding_window(model: ModelArgs) -> int | None:
    """``transformers``' ``sliding_window`` (tokens a query sees, itself included) of ``--window-size``."""
    return None if model.window_left is None else model.window_left + 1


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
    if arch == GPT2:
        return common | {
            "n_embd": model.hidden_size,
            "n_inner": model.effective_ffn_hidden_size,
            "n_layer": model.num_layers,
            "n_head": model.num_attention_heads,
            "n_positions": max_positions,
            "activation_function": GELU_TANH[0] if model.openai_gelu else GELU_EXACT[0],
            "layer_norm_epsilon": model.norm_epsilon,
            "resid_pdrop": model.hidden_dropout,
            "embd_pdrop": model.hidden_dropout,
            "attn_pdrop": model.attention_dropout,
            "scale_attn_weights": True,
        }
    scaling = rope_scaling(model)
    rotary = common | {
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
        "rope_parameters": {"rope_theta": float(model.rotary_base), **scaling},  # transformers 5
        **({"rope_scaling": scaling} if scaling["rope_type"] != "default" else {}),  # transformers 4
        "attention_dropout": model.attention_dropout,
    }
    no_window = {"use_sliding_window": False, "sliding_window": None, "max_window_layers": model.num_layers}
    if arch == QWEN2:
        return rotary | no_window
    if arch == QWEN3:
        return rotary | no_window | {"attention_bias": False}
    if arch == MISTRAL:
        return rotary | {"sliding_window": sliding_window(model)}
    return rotary | {"attention_bias": not model.disable_bias_linear, "mlp_bias": not model.disable_bias_linear}


LLAMA3_ROPE = {"rope_type": "llama3", "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}  # fmt: skip
"""Llama 3.x's rope scaling: what Megatron-Core's ``RotaryEmbedding._apply_scaling`` computes (its fixed frequency
factors and original context) in ``transformers``' terms (``_compute_llama3_parameters``); the ``factor`` is
``--rope-scaling-factor`` (8 in Llama 3.1, 32 in Llama 3.2)."""


def rope_scaling(model: ModelArgs) -> dict[str, Any]:
    """The rope type of ``config.json``'s ``rope_parameters`` (without ``rope_theta``): Llama 3's, linear position
    interpolation (``transformers`` divides the frequencies by the factor, Megatron-Core the positions), or none."""
    if model.use_rope_scaling:
        return {"rope_type": "llama3", "factor": model.rope_scaling_factor, **LLAMA3_ROPE}
    if model.rotary_seq_len_interpolation_factor is not None:
        return {"rope_type": "linear", "factor": float(model.rotary_seq_len_interpolation_factor)}
    return {"rope_type": "default"}


GELU_EXACT = ("gelu", "gelu_python")
"""``transformers``' names of the exact (erf) GeLU: Megatron-Core's GeLU MLP without ``--openai-gelu``."""
GELU_TANH = ("gelu_new", "gelu_pytorch_tanh", "gelu_python_tanh", "gelu_fast")
"""``transformers``' names of GeLU's tanh approximation, 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))):
Megatron-Core's ``openai_gelu`` (``--openai-gelu``). The first is GPT-2's own, and the one an export writes."""


OTHER_ARCHITECTURES: dict[str, str] = {
    "gemma": "embeddings scaled by √hidden, RMSNorm scaling by 1 + weight and a tanh-GeLU gate (GeGLU)",
    "gemma2": "embeddings scaled by √hidden, RMSNorm by 1 + weight, GeGLU, norms after attention and MLP, "
    "logit soft-capping and a sliding window on alternate layers",
    "gemma3_text": "embeddings scaled by √hidden, RMSNorm by 1 + weight, GeGLU, norms after attention and MLP, "
    "query/key norms and sliding windows on most layers",
    "phi3": "fused qkv_proj and gate_up_proj weights (and LongRoPE scaling in the long-context models)",
    "mixtral": "a mixture of experts in every MLP",
    "qwen2_moe": "a mixture of experts with a shared expert",
    "deepseek_v3": "multi-head latent attention and a mixture of experts",
    "gpt_neox": "attention and MLP in parallel, partial rotary embedding, LayerNorm",
    "phi": "attention and MLP in parallel, partial rotary embedding, LayerNorm, GeLU",
    "falcon": "attention and MLP in parallel (new decoder architecture), multi-query attention, LayerNorm, GeLU",
    "starcoder2": "LayerNorm with biases, a GeLU MLP and a sliding window",
    "olmo2": "norms after attention and MLP (not before), and RMSNorm of the whole query and key vectors",
}
"""What another ``model_type`` computes that the five architectures here do not: its refusal names the
features, not only the type."""


def model_flags(config: dict[str, Any], *, seq_length: int | None = None) -> tuple[str, dict[str, Any]]:
    """The architecture and our model arguments (``ModelArgs`` fields) of a ``transformers`` ``config.json``;
    ConversionError names whatever our models do not compute the same way. ``seq_length`` is the length to train
    at (default: ``max_position_embeddings``); a sliding window shorter than it is refused."""
    arch = config.get("model_type")
    if arch not in ARCHITECTURES:
        features = OTHER_ARCHITECTURES.get(str(arch))
        raise ConversionError(
            f"model_type {arch!r}"
            + (f": {features}" if features else " is not one of the architectures read here")
            + ". Imported exactly: "
            + ", ".join(f"{k} ({v})" for k, v in ARCHITECTURES.items())
        )
    problems: list[str] = []
    if config.get("quantization_config"):
        method = (
            config["quantization_config"].get("quant_method", "?")
            if isinstance(config["quantization_config"], dict)
            else "?"
        )
        problems.append(f"quantization_config ({method}): quantized weights; import the model's bf16 or fp32 release")
    try:
        flags = (
            _gpt2_flags(config, problems, seq_length)
            if arch == GPT2
            else _rotary_flags(arch, config, problems, seq_length)
        )
    except (KeyError, TypeError, ValueError) as exc:
        if problems:
            raise ConversionError(
                f"this {ARCHITECTURES[arch]} cannot be imported exactly: " + "; ".join(problems)
            ) from exc
        raise ConversionError(f"config.json of a {ARCHITECTURES[arch]} mangles {exc}") from exc
    if problems:
        raise ConversionError(f"this {ARCHITECTURES[arch]} cannot be imported exactly: " + "; ".join(problems))
    flags["untie_embeddings_and_output_weights"] = not _value(arch, config, "tie_word_embeddings")
    flags["init_method_std"] = float(_value(arch, config, "initializer_range"))
    return arch, flags


_ROTARY_DEFAULTS: dict[str, Any] = {
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-6,
    "attention_dropout": 0.0,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "initializer_range": 0.02,
    "head_dim": None,
}
TRANSFORMERS_DEFAULTS: dict[str, dict[str, Any]] = {
    LLAMA: _ROTARY_DEFAULTS
    | {
        "vocab_size": 32000,
        "intermediate_size": 11008,
        "num_key_value_heads": None,
        "max_position_embeddings": 2048,
        "attention_bias": False,
        "mlp_bias": False,
    },
    QWEN2: _ROTARY_DEFAULTS
    | {
        "vocab_size": 151936,
        "intermediate_size": 22016,
        "num_key_value_heads": 32,
        "max_position_embeddings": 32768,
        "use_sliding_window": False,
        "sliding_window": 4096,
        "max_window_layers": 28,
        "layer_types": None,
    },
    QWEN3: _ROTARY_DEFAULTS
    | {
        "vocab_size": 151936,
        "intermediate_size": 22016,
        "num_key_value_heads": 32,
        "head_dim": 128,
        "max_position_embeddings": 32768,
        "attention_bias": False,
        "use_sliding_window": False,
        "sliding_window": 4096,
        "max_window_layers": 28,
        "layer_types": None,
    },
    MISTRAL: _ROTARY_DEFAULTS
    | {
        "vocab_size": 32000,
        "intermediate_size": 14336,
        "num_key_value_heads": 8,
        "max_position_embeddings": 131072,
        "sliding_window": 4096,
    },
    GPT2: {
        "vocab_size": 50257,
        "n_embd": 768,
        "n_layer": 12,
        "n_head": 12,
        "n_inner": None,
        "n_positions": 1024,
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
"""What ``transformers`` uses for each ``config.json`` key this importer reads, when the key is absent (its
``LlamaConfig``'s, ``Qwen2Config``'s, ``Qwen3Config``'s, ``MistralConfig``'s and ``GPT2Config``'s defaults; a test
compares them):
a missing key means that, never the value we would like. None: computed from other keys (``head_dim`` is hidden
÷ heads, ``num_key_value_heads`` the heads, ``n_inner`` 4 × hidden)."""


READ_ELSEWHERE = frozenset(
    {"rope_parameters", "rope_scaling", "rope_theta", "original_max_position_embeddings", "partial_rotary_factor",
     "layer_types", "dtype", "torch_dtype", "hidden_size", "num_attention_heads", "num_hidden_layers",
     "max_position_embeddings", "auto_map", "quantization_config"}
)  # fmt: skip
"""Keys that decide the function and are read apart from ``TRANSFORMERS_DEFAULTS``, that ``transformers``
derives, or that must not follow a model exported from here (GPT-2's aliases of its sizes, a remote-code
``auto_map``, a quantization): an export writes what it needs from the checkpoint, never these from the
imported model's original."""


def padded_vocab_size(config: dict[str, Any]) -> int:
    """The rows of the embedding ``config.json`` describes (transformers' default where the key is absent)."""
    return int(_value(str(config.get("model_type")), config, "vocab_size"))


GPT2_ALIASES = {"n_embd": "hidden_size", "n_head": "num_attention_heads", "n_layer": "num_hidden_layers",
                "n_positions": "max_position_embeddings"}  # fmt: skip
"""``GPT2Config.attribute_map``: a config.json may name GPT-2's sizes by the common names."""


def _value(arch: str, config: dict[str, Any], key: str) -> Any:
    """``config[key]`` (or its GPT-2 alias), or transformers' default when the key is missing."""
    if arch == GPT2 and key not in config and GPT2_ALIASES.get(key) in config:
        return config[GPT2_ALIASES[key]]
    return config.get(key, TRANSFORMERS_DEFAULTS[arch][key])


def _expect(
    arch: str, config: dict[str, Any], problems: list[str], key: str, allowed: tuple[Any, ...], why: str
) -> None:
    """A problem unless ``key`` (or its default) is one of ``allowed``."""
    value = _value(arch, config, key)
    if value not in allowed:
        missing = "" if key in config else " (transformers' default: the key is absent)"
        problems.append(f"{key}={value!r}{missing} ({why})")


def _rope(arch: str, config: dict[str, Any], problems: list[str]) -> dict[str, Any]:
    """``--rotary-base``, ``--use-rope-scaling`` and ``--rope-scaling-factor`` (llama3) or
    ``--rotary-seq-len-interpolation-factor`` (linear) of ``rope_parameters`` (transformers 5) or ``rope_theta``
    and ``rope_scaling`` (transformers 4)."""
    # transformers' order (``convert_rope_params_to_dict``): rope_scaling over rope_parameters, and a top-level
    # rope_theta or original_max_position_embeddings over the dict's.
    rope = dict(config.get("rope_scaling") or config.get("rope_parameters") or {})
    for key in ("rope_theta", "original_max_position_embeddings"):
        if config.get(key) is not None:
            rope[key] = config[key]
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    scaling: dict[str, Any] = {}
    if rope_type == "llama3":
        differ = [
            f"{key}={rope.get(key)!r} (Megatron-Core's is {value!r})"
            for key, value in LLAMA3_ROPE.items()
            if key != "rope_type" and float(rope.get(key, -1)) != value
        ]
        if differ:
            problems.append("llama3 rope scaling with " + ", ".join(differ))
        scaling = {"use_rope_scaling": True, "rope_scaling_factor": float(rope["factor"])}
    elif rope_type == "linear":
        factor = float(rope["factor"])
        if factor != int(factor) or factor < 1:
            problems.append(f"linear rope scaling by {factor:g} (--rotary-seq-len-interpolation-factor is an integer)")
        scaling = {"rotary_seq_len_interpolation_factor": int(factor)}
    elif rope_type != "default":
        problems.append(
            f"rope type {rope_type!r} (the plain rotary embedding, Llama 3.x's scaling and linear scaling are "
            "implemented here)"
        )
    theta = rope.get("rope_theta", TRANSFORMERS_DEFAULTS[arch]["rope_theta"])
    if float(theta) != int(theta):
        problems.append(f"rope_theta={theta} (--rotary-base is an integer)")
    return {"rotary_base": int(theta), **scaling}


def _rotary_flags(arch: str, config: dict[str, Any], problems: list[str], seq_length: int | None) -> dict[str, Any]:
    """Llama, Qwen2, Qwen3 and Mistral: one layer, differing in biases, query and key norms and the window."""
    rope = _rope(arch, config, problems)
    _expect(arch, config, problems, "hidden_act", ("silu",), "Megatron's SwiGLU gates with SiLU")
    if config.get("partial_rotary_factor", 1.0) not in (1.0, None):
        problems.append(
            f"partial_rotary_factor={config['partial_rotary_factor']!r} (rope on every head dimension only)"
        )
    window: int | None = None
    biases: dict[str, bool] = {"disable_bias_linear": True}
    if arch == LLAMA:
        if bool(_value(arch, config, "attention_bias")) != bool(_value(arch, config, "mlp_bias")):
            problems.append("attention_bias ≠ mlp_bias (--disable-bias-linear sets both)")
        biases = {"disable_bias_linear": not _value(arch, config, "attention_bias")}
    elif arch in (QWEN2, QWEN3):
        if arch == QWEN2:
            biases = {"disable_bias_linear": True, "add_qkv_bias": True}  # q/k/v biases, none elsewhere
        else:
            biases = {"disable_bias_linear": True, "qk_layernorm": True}
            _expect(arch, config, problems, "attention_bias", (False,), "biases on the attention projections "
                    "without the MLP's: --add-qkv-bias covers Q/K/V, not the output projection")  # fmt: skip
        sliding = [i for i, t in enumerate(config.get("layer_types") or []) if t == "sliding_attention"]
        if _value(arch, config, "use_sliding_window") and _value(arch, config, "sliding_window") is not None:
            first = int(_value(arch, config, "max_window_layers"))
            sliding = sliding or list(range(first, int(_value(arch, config, "num_hidden_layers"))))
        if sliding:
            problems.append(
                f"a sliding window on layers {sliding[0]}–{sliding[-1]} only (use_sliding_window, max_window_layers, "
                "layer_types): a window on some layers is not implemented here"
            )
    else:
        window = _value(arch, config, "sliding_window")
    if arch in (QWEN2, QWEN3) and "head_dim" in config and config["head_dim"] is None:
        problems.append("head_dim=null (transformers cannot build this config: give the head size)")
    hidden = int(_value(arch, config, "hidden_size"))
    heads = int(_value(arch, config, "num_attention_heads"))
    groups = int(_value(arch, config, "num_key_value_heads") or heads)
    head_dim = int(_value(arch, config, "head_dim") or hidden // heads)
    positions = int(_value(arch, config, "max_position_embeddings"))
    seq = seq_length or positions
    if window is not None and int(window) < seq:
        where = "--seq-length" if seq_length else "max_position_embeddings; import with --seq-length {} or less"
        problems.append(
            f"sliding window {window} is shorter than the sequence length {seq} ({where.format(window)}): "
            "Megatron-Core's local attention has no sliding window"
        )
    return biases | {
        "num_layers": int(_value(arch, config, "num_hidden_layers")),
        "hidden_size": hidden,
        "ffn_hidden_size": int(_value(arch, config, "intermediate_size")),
        "num_attention_heads": heads,
        "group_query_attention": groups != heads,
        "num_query_groups": groups if groups != heads else None,
        "kv_channels": head_dim if head_dim * heads != hidden else None,
        "max_position_embeddings": positions,
        "seq_length": seq,
        "position_embedding_type": "rope",
        **rope,
        "swiglu": True,
        "normalization": "RMSNorm",
        "norm_epsilon": float(_value(arch, config, "rms_norm_eps")),
        "attention_dropout": float(_value(arch, config, "attention_dropout")),
        "hidden_dropout": 0.0,
        # Mistral without a window (v0.2, v0.3) keeps its type: "-1,0", unbounded.
        **({} if arch != MISTRAL else {"window_size": "-1,0" if window is None else f"{int(window) - 1},0"}),
    }


def _gpt2_flags(config: dict[str, Any], problems: list[str], seq_length: int | None) -> dict[str, Any]:
    """GPT-2: learned positions, GeLU (exact, or its tanh approximation with ``--openai-gelu``), LayerNorm,
    biases."""

    def expect(key: str, allowed: tuple[Any, ...], why: str) -> None:
        _expect(GPT2, config, problems, key, allowed, why)

    expect("activation_function", GELU_EXACT + GELU_TANH, "Megatron's GPT MLP is GeLU: exact, or its tanh "
           "approximation with --openai-gelu")  # fmt: skip
    expect("scale_attn_weights", (True,), "Megatron scales attention scores by 1/sqrt(head dim)")
    expect("scale_attn_by_inverse_layer_idx", (False,), "not in Megatron")
    expect("reorder_and_upcast_attn", (False,), "not in Megatron")
    expect("add_cross_attention", (False,), "a decoder-only GPT has no cross attention")
    hidden = int(_value(GPT2, config, "n_embd"))
    return {
        "num_layers": int(_value(GPT2, config, "n_layer")),
        "hidden_size": hidden,
        "ffn_hidden_size": int(_value(GPT2, config, "n_inner") or 4 * hidden),
        "num_attention_heads": int(_value(GPT2, config, "n_head")),
        "max_position_embeddings": int(_value(GPT2, config, "n_positions")),
        "seq_length": seq_length or int(_value(GPT2, config, "n_positions")),
        "position_embedding_type": "learned_absolute",
        **({"openai_gelu": True} if _value(GPT2, config, "activation_function") in GELU_TANH else {}),
        "normalization": "LayerNorm",
        "norm_epsilon": float(_value(GPT2, config, "layer_norm_epsilon")),
        "hidden_dropout": float(_value(GPT2, config, "resid_pdrop")),
        "attention_dropout": float(_value(GPT2, config, "attn_pdrop")),
    }

"""The ``config.json`` of the models continued pretraining starts from, as published on the Hugging Face Hub (the
keys that describe the model; token ids and versions left out). Facts for tests: the presets of these models and
the import's printed flags at their real shapes are checked against them."""

from __future__ import annotations

from typing import Any

_LLAMA31 = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "attention_bias": False, "attention_dropout": 0.0,
    "hidden_act": "silu", "initializer_range": 0.02, "max_position_embeddings": 131072, "mlp_bias": False,
    "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True, "vocab_size": 128256,
    "bos_token_id": 128000, "eos_token_id": 128001,
}  # fmt: skip
_QWEN25 = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "attention_dropout": 0.0, "hidden_act": "silu",
    "initializer_range": 0.02, "rope_theta": 1000000.0, "torch_dtype": "bfloat16", "use_cache": True,
    "use_sliding_window": False, "bos_token_id": 151643, "eos_token_id": 151643,
}  # fmt: skip

HUB_CONFIGS: dict[str, dict[str, Any]] = {
    "llama3.1-8b": _LLAMA31 | {"hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
                               "num_hidden_layers": 32},
    "llama3.1-70b": _LLAMA31 | {"hidden_size": 8192, "intermediate_size": 28672, "num_attention_heads": 64,
                                "num_hidden_layers": 80},
    "qwen2.5-0.5b": _QWEN25 | {"hidden_size": 896, "intermediate_size": 4864, "max_position_embeddings": 32768,
                               "max_window_layers": 24, "num_attention_heads": 14, "num_hidden_layers": 24,
                               "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "sliding_window": 32768,
                               "tie_word_embeddings": True, "vocab_size": 151936},
    "qwen2.5-7b": _QWEN25 | {"hidden_size": 3584, "intermediate_size": 18944, "max_position_embeddings": 131072,
                             "max_window_layers": 28, "num_attention_heads": 28, "num_hidden_layers": 28,
                             "num_key_value_heads": 4, "rms_norm_eps": 1e-06, "sliding_window": 131072,
                             "tie_word_embeddings": False, "vocab_size": 152064},
    "qwen2.5-72b": _QWEN25 | {"hidden_size": 8192, "intermediate_size": 29568, "max_position_embeddings": 131072,
                              "max_window_layers": 80, "num_attention_heads": 64, "num_hidden_layers": 80,
                              "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "sliding_window": 131072,
                              "tie_word_embeddings": False, "vocab_size": 152064},
    "mistral-7b": {
        "architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_act": "silu", "hidden_size": 4096,
        "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 32768,
        "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
        "rope_theta": 10000.0, "sliding_window": 4096, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "use_cache": True, "vocab_size": 32000, "bos_token_id": 1, "eos_token_id": 2,
    },
}  # fmt: skip
"""By preset name (``megatron_ext.config.presets``): meta-llama/Llama-3.1-8B and -70B, Qwen/Qwen2.5-0.5B, -7B and
-72B, mistralai/Mistral-7B-v0.1."""

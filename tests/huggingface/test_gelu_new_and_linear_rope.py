"""GPT-2 as published (``gelu_new``: GeLU's tanh approximation, ``--openai-gelu``) and Llama with linear rope scaling
(``--rotary-seq-len-interpolation-factor``), in from ``transformers`` and back out.

- Which flags give which activation: GeLU as Megatron-LM builds it (exact on CPU; on GPU Megatron-Core's fused
  bias-GeLU, which is the tanh approximation, unless ``--no-bias-gelu-fusion``); ``--openai-gelu`` is the tanh
  approximation unfused (``openai_gelu``) and fused (the bias-GeLU kernel) alike, and equals every
  ``transformers`` name of it.
- Models built by ``transformers`` itself (tests/huggingface/native.py, one process): a GPT-2 whose config.json
  has no ``activation_function`` (transformers' default, gelu_new), one with gelu_new and one with
  gelu_pytorch_tanh, and a Llama scaled linearly by 4. Megatron-Core's logits are ``transformers``' within 1e-5 of
  the largest (fp32), greedy continuations are the same, and the export of the import is the original, bit for bit,
  its activation and rope scaling included.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from megatron_ext.config.arguments import ConfigError
from megatron_ext.config.training_config import parse_args
from megatron_ext.training import model as training_model  # before Megatron-Core: its fusions eager on CPU, as in runs
from tests.conftest import REPO, run_forked

GPT2_SHAPE = {
    "vocab_size": 1536, "n_embd": 128, "n_layer": 2, "n_head": 4, "n_positions": 128, "bos_token_id": 1,
    "eos_token_id": 2,
    # Weights large enough that the MLP's inputs reach where the two GeLUs differ most (|x| ≈ 2): importing gelu_new
    # as the exact GeLU moves the logits by far more than the 1e-5 compared.
    "initializer_range": 0.1,
}  # fmt: skip
LLAMA_SHAPE = {
    "vocab_size": 1536, "hidden_size": 128, "intermediate_size": 344, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256, "rms_norm_eps": 1e-5,
}  # fmt: skip
JOBS: dict[str, dict[str, Any]] = {
    "gpt2-as-published": {
        "model_type": "gpt2", "config": GPT2_SHAPE,
        "drop_keys": ["activation_function"],  # transformers' default: gelu_new
        "dtype": "float32", "seq": 64, "generation": {"eos_token_id": 2},
    },
    "gpt2-gelu-new-untied": {
        "model_type": "gpt2", "config": GPT2_SHAPE | {"activation_function": "gelu_new", "tie_word_embeddings": False},
        "dtype": "float32", "seq": 64, "generation": {"eos_token_id": 2},
    },
    "gpt2-gelu-pytorch-tanh": {
        "model_type": "gpt2", "config": GPT2_SHAPE | {"activation_function": "gelu_pytorch_tanh"},
        "dtype": "float32", "seq": 64, "generation": {"eos_token_id": 2},
    },
    "llama-linear-rope": {
        "model_type": "llama",
        "config": LLAMA_SHAPE | {"rope_parameters": {"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0}},
        "dtype": "float32", "seq": 64, "generation": {"eos_token_id": 2},
    },
}  # fmt: skip
"""Each job's transformers config (``drop_keys``: left out of its config.json), dtype and generation config."""


def _arguments(argv: list[str], device: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The TransformerConfig's arguments of ``argv`` on ``device`` (a GPU's: the fusions on by default)."""
    monkeypatch.setattr(training_model, "use_transformer_engine", lambda cfg, device: False)
    return training_model.transformer_config_arguments(parse_args(["--mock-data", *argv]), torch.device(device))


@pytest.mark.unit
def test_each_gelu_flag_gives_its_function_on_cpu_and_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """GeLU is Megatron-LM's: F.gelu, fused with the bias on GPU (the tanh approximation) unless
    --no-bias-gelu-fusion; ``--openai-gelu`` is Megatron-Core's openai_gelu, or on GPU (with a bias, unless
    --no-bias-gelu-fusion) the fused bias-GeLU, which computes it."""
    from megatron.core.activations import squared_relu
    from megatron.core.transformer.utils import openai_gelu

    def chosen(argv: list[str], device: str) -> tuple[Any, bool]:
        args = _arguments(argv, device, monkeypatch)
        return args["activation_func"], args["bias_activation_fusion"]

    assert chosen([], "cpu") == (F.gelu, False)
    assert chosen([], "cuda") == (F.gelu, True)  # Megatron-LM's default on GPU
    for device in ("cpu", "cuda"):
        assert chosen(["--no-bias-gelu-fusion"], device) == (F.gelu, False)
        assert chosen(["--squared-relu"], device) == (squared_relu, False)  # Megatron-Core fuses no squared ReLU
        assert chosen(["--openai-gelu", "--no-bias-gelu-fusion"], device) == (openai_gelu, False)
        assert chosen(["--openai-gelu", "--disable-bias-linear"], device) == (openai_gelu, False)
    assert chosen(["--openai-gelu"], "cpu") == (openai_gelu, False)
    assert chosen(["--openai-gelu"], "cuda") == (F.gelu, True)
    assert chosen(["--swiglu"], "cuda") == (F.silu, True)
    assert chosen(["--swiglu", "--no-bias-swiglu-fusion"], "cuda") == (F.silu, False)


@pytest.mark.unit
def test_the_tanh_gelu_is_transformers_and_the_fused_kernels() -> None:
    """openai_gelu is each of transformers' names of the tanh approximation, and Megatron-Core's fused bias-GeLU
    (forward and gradient) is openai_gelu of the biased input; the exact names are F.gelu."""
    from megatron.core.fusions.fused_bias_gelu import bias_gelu_impl
    from megatron.core.transformer.utils import openai_gelu
    from transformers.activations import ACT2FN

    from megatron_ext.huggingface.architectures import GELU_EXACT, GELU_TANH

    x = torch.linspace(-8, 8, 20001)
    assert (openai_gelu(x) - F.gelu(x)).abs().max() > 1e-4  # the approximation differs from the exact GeLU
    for name in GELU_TANH:
        assert torch.allclose(ACT2FN[name](x), openai_gelu(x), rtol=1e-6, atol=1e-6), name
    for name in GELU_EXACT:
        assert torch.allclose(ACT2FN[name](x), F.gelu(x), rtol=1e-6, atol=2e-6), name  # erf in Python: rounding
    y = torch.randn(64, 48, generator=torch.Generator().manual_seed(0)) * 3
    bias = torch.randn(48, generator=torch.Generator().manual_seed(1))
    fused_in, plain_in = y.clone().requires_grad_(), y.clone().requires_grad_()
    fused, plain = bias_gelu_impl(fused_in, bias), openai_gelu(plain_in + bias)
    assert torch.allclose(fused, plain, rtol=0, atol=1e-6)
    fused.sum().backward()
    plain.sum().backward()
    assert fused_in.grad is not None and plain_in.grad is not None
    assert torch.allclose(fused_in.grad, plain_in.grad, rtol=0, atol=1e-5)


@pytest.mark.unit
@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--openai-gelu", "--swiglu"], "--openai-gelu approximates a GeLU MLP's activation and --swiglu replaces it"),
        (["--openai-gelu", "--squared-relu"], "and --squared-relu replaces it; give one"),
        (["--rotary-seq-len-interpolation-factor", "2"], "scales the rotary embedding: give --position-embedding"),
    ],
)
def test_contradicting_flags_are_refused_naming_the_fix(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_args(["--mock-data", *argv], world_size=1)


@pytest.mark.unit
def test_linear_rope_scaling_is_the_same_angles_in_megatron_core_and_transformers() -> None:
    """Megatron-Core's rotary embedding with seq_len_interpolation_factor 4 divides the positions by 4; transformers'
    linear scaling (the exported ``rope_parameters``) divides the frequencies: the same angles."""
    import transformers
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from megatron_ext.config.arguments import ModelArgs
    from megatron_ext.huggingface.architectures import TokenIds, hf_config

    m = ModelArgs(num_layers=2, hidden_size=128, num_attention_heads=4, position_embedding_type="rope", swiglu=True,
                  normalization="RMSNorm", disable_bias_linear=True, rotary_seq_len_interpolation_factor=4)  # fmt: skip
    ours = RotaryEmbedding(m.effective_kv_channels, rotary_percent=1.0, seq_len_interpolation_factor=4,
                           use_cpu_initialization=True)  # fmt: skip
    config = transformers.LlamaConfig(**hf_config(m, padded_vocab_size=128, tokens=TokenIds(1, 2), dtype="float32"))
    theirs, attention_factor = ROPE_INIT_FUNCTIONS["linear"](config, torch.device("cpu"))
    assert attention_factor == 1.0
    angles = torch.outer(torch.arange(256, dtype=torch.float32), theirs.float())
    assert torch.allclose(ours.get_freqs_non_repeated(256), angles, rtol=1e-6, atol=1e-6)
    plain = RotaryEmbedding(m.effective_kv_channels, rotary_percent=1.0, use_cpu_initialization=True)
    assert not torch.allclose(plain.get_freqs_non_repeated(256), angles)  # the scaling does change the angles


GPT2_PUBLISHED = {
    "activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"], "attn_pdrop": 0.1, "bos_token_id": 50256,
    "embd_pdrop": 0.1, "eos_token_id": 50256, "initializer_range": 0.02, "layer_norm_epsilon": 1e-05,
    "model_type": "gpt2", "n_ctx": 1024, "n_embd": 768, "n_head": 12, "n_layer": 12, "n_positions": 1024,
    "resid_pdrop": 0.1, "summary_activation": None, "summary_first_dropout": 0.1, "summary_proj_to_labels": True,
    "summary_type": "cls_index", "summary_use_proj": True,
    "task_specific_params": {"text-generation": {"do_sample": True, "max_length": 50}}, "vocab_size": 50257,
}  # fmt: skip
"""openai-community/gpt2's config.json as published on the Hugging Face Hub."""


@pytest.mark.unit
def test_the_published_gpt2_config_imports_with_openai_gelu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The import's dry run of GPT-2 124M's own config.json prints --openai-gelu among the flags that continue it,
    and pretrain_gpt.py takes them."""
    from megatron_ext.cli import convert_checkpoint
    from tests.huggingface.test_real_shapes import printed_command

    (tmp_path / "gpt2").mkdir()
    (tmp_path / "gpt2" / "config.json").write_text(json.dumps(GPT2_PUBLISHED))
    argv = ["from-hf", "--input", str(tmp_path / "gpt2"), "--save", str(tmp_path / "ckpt"), "--dry-run"]
    assert convert_checkpoint.main(argv) == 0
    command = printed_command(capsys.readouterr().out)
    assert "--openai-gelu" in command, command
    cfg = parse_args([*command[3:], "--mock-data"], world_size=1)
    m = cfg.model
    assert m.openai_gelu and (m.num_layers, m.hidden_size, m.num_attention_heads, m.seq_length) == (12, 768, 12, 1024)
    assert (m.position_embedding_type, m.normalization, m.disable_bias_linear) == (
        "learned_absolute",
        "LayerNorm",
        False,
    )
    assert not m.untie_embeddings_and_output_weights and m.vocab_size == 50257


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    work = tmp_path_factory.mktemp("tanh-linear")
    jobs = [spec | {"name": name, "work": str(work / name)} for name, spec in JOBS.items()]
    (work / "jobs.json").write_text(json.dumps(jobs))
    proc = run_forked(REPO / "tests" / "huggingface" / "native.py", [str(work / "jobs.json")])
    assert proc.returncode == 0, proc.stderr[-4000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    return {name: found[i] for i, name in enumerate(JOBS)}


@pytest.mark.distributed
@pytest.mark.parametrize("name", list(JOBS))
def test_transformers_models_import_exactly_and_export_back(results: dict[str, dict[str, Any]], name: str) -> None:
    result, job = results[name], JOBS[name]
    assert result["max_abs"] <= 1e-5 * result["max_logit"], result
    assert result["ours"] == result["theirs"], result
    assert result["parameters"] == result["estimated_parameters"], result
    gpt2 = job["model_type"] == "gpt2"
    wanted = ["--openai-gelu"] if gpt2 else ["--rotary-seq-len-interpolation-factor", "4"]
    flags = result["flags"]
    assert any(flags[i : i + len(wanted)] == wanted for i in range(len(flags))), flags
    export = result["export"]
    assert export["tensors"] > 0 and export["tensors_differ"] == [], export
    assert export["generation"][0] == export["generation"][1]
    changed = export["config_changed"]
    if gpt2:
        # gelu_new written explicitly where the original said it by default or by its other name.
        original = job["config"].get("activation_function") if "drop_keys" not in job else None
        if original == "gelu_new":
            assert "activation_function" not in changed, changed
        else:
            assert changed.pop("activation_function") == [original, "gelu_new"], changed
        # Keys transformers writes at their defaults, which ours leaves out (or, n_inner, states: 4 × n_embd).
        defaults = {"add_cross_attention", "reorder_and_upcast_attn", "scale_attn_by_inverse_layer_idx", "n_inner"}
        assert set(changed) <= defaults | {"torch_dtype", "use_cache"}, changed
    else:
        assert changed.pop("rope_scaling", [None, {"rope_type": "linear", "factor": 4.0}]) == [
            None,
            {"rope_type": "linear", "factor": 4.0},
        ], changed
        assert set(changed) <= {"head_dim", "rope_theta", "torch_dtype", "attention_bias", "mlp_bias", "use_cache"}

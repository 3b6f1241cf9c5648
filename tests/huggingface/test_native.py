"""Models built by ``transformers`` itself, in and out: Llama 3.1 and 3.2 (rope scaling by 8 and 32, untied and
tied), Qwen2.5 (q/k/v biases, tied and untied), Qwen3 (query and key norms), Mistral (a sliding window that
covers the sequence) and a bf16 Llama.

Small but realistic shapes (grouped-query attention, 64-dimension heads, a vocabulary of a few thousand), random
weights with norms and biases away from their initial values. For each: Megatron-Core's logits equal
``transformers``' (fp32: within 1e-5 of the largest), greedy continuations are the same, the export of the imported
checkpoint is the original bit for bit and dtype for dtype with its ``generation_config.json`` kept, and a run
continued under a parallel layout (TP2, PP2 with uneven stages, DP2) starts at ``transformers``' loss on the same
batch. The comparisons run in one process (tests/huggingface/native.py); the continued runs are pretrain_gpt.py
under torchrun, with the flags the import printed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, read_metrics, run_forked, run_pretrain
from tests.data.helpers import shared_data, tool

pytestmark = pytest.mark.distributed

SHAPE = {
    "vocab_size": 1536, "hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256, "rms_norm_eps": 1e-5,
}  # fmt: skip
TRAIN = ["--mock-data", "--train-iters", "1", "--micro-batch-size", "2", "--global-batch-size", "4", "--lr", "1e-5",
         "--device", "cpu", "--seed", "1234", "--eval-iters", "0"]  # fmt: skip
JOBS: dict[str, dict[str, Any]] = {
    "llama-3.1": {
        "model_type": "llama",
        "config": SHAPE | {
            "max_position_embeddings": 131072,
            "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
            "bos_token_id": 1, "eos_token_id": [2, 3],
        },
        "dtype": "float32", "seq": 64, "seq_length": 64,
        "generation": {"bos_token_id": 1, "eos_token_id": [2, 3], "temperature": 0.6, "top_p": 0.9, "do_sample": True},
        "extra": ["--pipeline-model-parallel-size", "2", "--decoder-first-pipeline-num-layers", "3", *TRAIN],
        "tokenizer": True,  # a SentencePiece tokenizer.model beside the weights
    },
    "llama-3.2-tied": {
        "model_type": "llama",
        "config": SHAPE | {
            "max_position_embeddings": 131072, "tie_word_embeddings": True,
            "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
        },
        "dtype": "float32", "seq": 64, "seq_length": 64, "generation": {"eos_token_id": [2, 3]},
    },
    "qwen2.5-tied": {
        "model_type": "qwen2",
        "config": SHAPE | {"tie_word_embeddings": True, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6},
                           "max_window_layers": 4, "sliding_window": 256, "eos_token_id": 4},
        "dtype": "float32", "seq": 64, "generation": {"eos_token_id": [4, 5], "repetition_penalty": 1.1},
        "extra": ["--tensor-model-parallel-size", "2", *TRAIN],
    },
    "qwen2.5-untied": {
        "model_type": "qwen2",
        "config": SHAPE | {"tie_word_embeddings": False, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}},
        "dtype": "float32", "seq": 64, "generation": {"eos_token_id": 4},
    },
    "qwen3": {
        "model_type": "qwen3",
        "config": SHAPE | {"head_dim": 64, "num_attention_heads": 8, "rope_parameters": {"rope_type": "default",
                                                                                          "rope_theta": 1e6}},
        "dtype": "float32", "seq": 64, "generation": {"eos_token_id": [4, 5]},
        "extra": ["--tensor-model-parallel-size", "2", *TRAIN],
    },
    "mistral": {
        "model_type": "mistral",
        "config": SHAPE | {"sliding_window": 64, "head_dim": 64, "num_attention_heads": 8},
        "dtype": "float32", "seq": 64, "seq_length": 64, "generation": {"bos_token_id": 1, "eos_token_id": 2},
        "extra": TRAIN,  # DP2: two processes, no model parallelism
    },
    "llama-bf16": {
        "model_type": "llama",
        "config": SHAPE | {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}},
        "dtype": "bfloat16", "seq": 64, "generation": {"eos_token_id": 2},
    },
}  # fmt: skip
"""Each job's transformers config, dtype, generation config and (``extra``) the continued run's own flags."""


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    work = tmp_path_factory.mktemp("native")
    sentencepiece = str(shared_data(tmp_path_factory)["model"])
    jobs = [
        spec
        | {"name": name, "work": str(work / name), "tokenizer_model": sentencepiece if "tokenizer" in spec else None}
        for name, spec in JOBS.items()
    ]
    (work / "jobs.json").write_text(json.dumps(jobs))
    proc = run_forked(REPO / "tests" / "huggingface" / "native.py", [str(work / "jobs.json")])
    assert proc.returncode == 0, proc.stderr[-4000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    return {name: found[i] | {"work": jobs[i]["work"]} for i, name in enumerate(JOBS)}


@pytest.mark.parametrize("name", list(JOBS))
def test_logits_and_greedy_text_are_transformers(results: dict[str, dict[str, Any]], name: str) -> None:
    result = results[name]
    # bf16: both sides round every matmul to 8 bits of mantissa, in different orders.
    # The layout calculator counts the same parameters (Qwen2's q/k/v biases, a tied output layer).
    assert result["parameters"] == result["estimated_parameters"], result
    if JOBS[name]["dtype"] == "float32":
        assert result["max_abs"] <= 1e-5 * result["max_logit"], result
        assert result["ours"] == result["theirs"], result
    else:
        # bf16: both sides round every product to 8 bits of mantissa, in different orders (measured 1e-2 of the
        # largest logit); a near tie in a greedy step may go either way.
        assert result["max_abs"] <= 3e-2 * result["max_logit"], result
        assert result["dtypes"] == ["torch.bfloat16"], result  # loaded as the run computes, norms included


@pytest.mark.parametrize("name", list(JOBS))
def test_the_export_of_an_import_is_the_original(results: dict[str, dict[str, Any]], name: str) -> None:
    """Every tensor bit for bit in its dtype (a bf16 model's norms included), the config's keys kept (the padded
    vocabulary and the dtype are the original's), the original generation_config.json whole."""
    export = results[name]["export"]
    assert export["tensors"] > 0 and export["tensors_differ"] == [], export
    assert export["dtypes"] == [f"torch.{JOBS[name]['dtype']}"], export
    # What may differ: keys transformers writes at defaults, where ours are explicit, and never a value that
    # changes the model. The test names them, so that a new difference is looked at.
    explicit = {"head_dim", "rope_theta", "rope_scaling", "torch_dtype", "use_sliding_window", "sliding_window",
                "max_window_layers", "layer_types", "attention_bias", "mlp_bias", "use_cache"}  # fmt: skip
    assert set(export["config_changed"]) <= explicit, export["config_changed"]
    original, again = export["generation"]
    assert again == original


def test_continued_pretraining_starts_at_transformers_loss(results: dict[str, dict[str, Any]], tmp_path: Path) -> None:
    """Under TP2 (Qwen2.5's q/k/v biases and Qwen3's query and key norms, over ranks), PP2 with stages of 3 and 1
    layers (Llama 3.1, with its
    SentencePiece tokenizer) and DP2 (Mistral), with exactly the flags the import printed. The export of the
    continued Llama 3.1 keeps the original's list of end ids and generation_config.json."""
    for name in (n for n in JOBS if "extra" in JOBS[n]):
        result = results[name]
        metrics, save = tmp_path / f"{name}.jsonl", tmp_path / f"{name}-continued"
        run_pretrain([*result["argv"], "--metrics-file", str(metrics), "--save", str(save)], nproc=2)
        first = next(r for r in read_metrics(metrics) if r.get("iteration") == 1 and "lm_loss" in r)
        assert first["lm_loss"] == pytest.approx(result["hf_loss"], rel=1e-5), (name, first, result["hf_loss"])
    assert "GPTSentencePieceTokenizer" in results["llama-3.1"]["argv"]
    tool(
        "convert_checkpoint",
        "to-hf",
        "--load",
        str(tmp_path / "llama-3.1-continued"),
        "--output",
        str(tmp_path / "hf"),
        forked=True,
    )
    original = Path(results["llama-3.1"]["work"]) / "hf"
    for file in ("generation_config.json", "tokenizer.model"):
        assert (tmp_path / "hf" / file).read_bytes() == (original / file).read_bytes(), file
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["eos_token_id"] == [2, 3] and config["bos_token_id"] == 1, config

"""Fill-in-the-middle (``--fim-data``): the samples are those Megatron-LM's GPTFIMDataset makes.

A local Hugging Face tokenizer with the FIM sentinels, the shared corpus preprocessed with it, then the train split
built two ways: by this project from its flags (``training/datasets.py``), and as Megatron-LM builds it, with
Megatron-Core's own tokenizer of the directory and ``GPTFIMDatasetConfig`` filled by hand. The same token ids for
every sample; sentinels in them (the rearrangement happened); refusals named; and a training run on them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from megatron_ext.config.arguments import ConfigError
from megatron_ext.config.training_config import TrainingConfig, parse_args
from megatron_ext.data.preflight import preflight
from tests.conftest import MODEL, read_metrics, run_pretrain
from tests.data.helpers import shared_data, tool

SENTINELS = ["<|endoftext|>", "<fim_prefix>", "<fim_middle>", "<fim_suffix>", "<fim_pad>"]


@pytest.fixture(scope="module")
def fim_data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A byte-level BPE tokenizer directory with the FIM sentinels as special tokens, and the corpus in it."""
    import tokenizers
    from tokenizers import pre_tokenizers

    corpus = shared_data(tmp_path_factory)["corpus"]
    root = tmp_path_factory.mktemp("fim")
    texts = [json.loads(line)["text"] for line in corpus.read_text(encoding="utf-8").splitlines()[:300]]
    tk = tokenizers.Tokenizer(tokenizers.models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=700, special_tokens=SENTINELS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tk.train_from_iterator(texts, trainer)
    model = root / "tok"
    model.mkdir()
    tk.save(str(model / "tokenizer.json"))
    (model / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>"}))
    tool("preprocess_data", "--input", str(corpus), "--output-prefix", str(root / "code"), "--tokenizer-type",
         "HuggingFaceTokenizer", "--tokenizer-model", str(model), "--append-eod", "--workers", "1", "--quiet")  # fmt: skip
    return {"model": model, "prefix": root / "code_text_document", "root": root}


def _flags(data: dict[str, Path], *extra: str) -> list[str]:
    return [*MODEL, "--data-path", str(data["prefix"]), "--tokenizer-type", "HuggingFaceTokenizer",
            "--tokenizer-model", str(data["model"]), "--split", "98,1,1", "--train-iters", "8", "--fim-data",
            *extra]  # fmt: skip


def _checked(argv: list[str]) -> Any:
    return preflight(parse_args(argv, world_size=1), full=True)


def _megatron_lm_train_split(cfg: TrainingConfig, cache: Path) -> Any:
    """The train split as Megatron-LM 0.19 builds it from the same flags: Megatron-Core's Hugging Face tokenizer
    (its ``build_tokenizer`` defaults) and GPTFIMDatasetConfig with Megatron-LM's fields."""
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.tokenizers import MegatronTokenizer
    from megatron.training.datasets.fim_dataset import GPTFIMDataset, GPTFIMDatasetConfig

    from megatron_ext.config import iterations

    d = cfg.data
    tokenizer = MegatronTokenizer.from_pretrained(
        tokenizer_path=str(d.tokenizer_model), metadata_path={"library": "huggingface"},
        additional_special_tokens=[], include_special_tokens=True,
    )  # fmt: skip
    config = GPTFIMDatasetConfig(
        random_seed=cfg.optim.seed, sequence_length=cfg.model.seq_length, blend=([str(d.data_path[0])], None),
        split="98,1,1", path_to_cache=str(cache), tokenizer=tokenizer, reset_position_ids=False,
        reset_attention_mask=False, eod_mask_loss=False, create_attention_mask=False,
        fim_rate=d.fim_rate, fim_spm_rate=d.fim_spm_rate, fim_split_sample=d.fim_split_sample,
        fim_fragment_rate=d.fim_fragment_rate, fim_no_prefix=d.fim_no_prefix,
        fim_extra_tokens={"prefix": "<fim_prefix>", "middle": "<fim_middle>", "suffix": "<fim_suffix>",
                          "pad": "<fim_pad>", "eod": "<|endoftext|>"},
    )  # fmt: skip
    sizes = iterations.split_samples(cfg.run, cfg.batch, cfg.layout)
    return BlendedMegatronDatasetBuilder(GPTFIMDataset, sizes, lambda: True, config).build()[0]


@pytest.mark.unit
@pytest.mark.parametrize("extra", [[], ["--fim-rate", "1.0", "--fim-spm-rate", "0.3", "--fim-no-prefix", "Return"]])
def test_fim_samples_are_megatron_lms_token_for_token(fim_data: dict[str, Path], extra: list[str]) -> None:
    from megatron_ext.training.datasets import build_datasets

    checked = _checked([*_flags(fim_data, *extra), "--data-cache-path", str(fim_data["root"] / f"ours{len(extra)}")])
    ours = build_datasets(checked.cfg, checked.tokenizer).train
    theirs = _megatron_lm_train_split(checked.cfg, fim_data["root"] / f"theirs{len(extra)}")
    assert len(ours) == len(theirs) > 0
    samples = [ours[i]["tokens"].numpy() for i in range(len(ours))]
    for i, sample in enumerate(samples):
        assert np.array_equal(sample, theirs[i]["tokens"].numpy()), f"sample {i}"
    prefix = checked.tokenizer.token_id("<fim_prefix>")
    rearranged = sum(prefix in sample for sample in samples)
    assert rearranged > len(samples) // 4  # the documents were rearranged (rate 0.5 or 1 per document)


@pytest.mark.unit
def test_what_fim_cannot_do_is_refused_naming_the_fix(fim_data: dict[str, Path]) -> None:
    with pytest.raises(ConfigError, match="--fim-data rearranges real documents: give --data-path"):
        parse_args(["--mock-data", "--fim-data", "--tokenizer-type", "HuggingFaceTokenizer"])
    with pytest.raises(ConfigError, match="--fim-rate and --fim-spm-rate above 0"):
        parse_args(_flags(fim_data, "--fim-spm-rate", "0"))
    with pytest.raises(ConfigError, match="--tokenizer-type GPTSentencePieceTokenizer is not offered"):
        parse_args([*MODEL, "--data-path", "x", "--fim-data", "--tokenizer-type", "GPTSentencePieceTokenizer"])
    with pytest.raises(ConfigError, match="--fim-middle-token '<mid>' is not a token of the tokenizer"):
        _checked(_flags(fim_data, "--fim-middle-token", "<mid>"))


@pytest.mark.distributed
def test_a_run_trains_on_fim_samples(fim_data: dict[str, Path], tmp_path: Path) -> None:
    metrics = tmp_path / "m.jsonl"
    run_pretrain([*_flags(fim_data, "--lr", "3e-3"), "--metrics-file", str(metrics)])
    losses = [r["lm_loss"] for r in read_metrics(metrics) if "lm_loss" in r]
    assert len(losses) == 8 and losses[-1] < losses[0]

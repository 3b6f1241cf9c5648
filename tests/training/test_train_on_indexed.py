"""pretrain_gpt.py on indexed datasets made by tools/preprocess_data.py: blends, splits, checks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from megatron_ext.config.arguments import ConfigError
from megatron_ext.config.training_config import TrainingConfig, parse_args
from megatron_ext.data import sources as data_sources
from megatron_ext.data.indexed import IndexedDatasetFiles, IndexedWriter
from megatron_ext.data.preflight import preflight
from megatron_ext.data.tokenizers import NullTokenizer
from tests.conftest import MODEL, SavedRun, blend_flags, read_metrics, run_pretrain, run_script, tokenizer_flags


def check(argv: list[str]) -> TrainingConfig:
    """What pretrain_gpt.py does before it starts: parse (pure), then check the data (preflight)."""
    return preflight(parse_args(argv), full=True).cfg


@pytest.fixture(scope="module")
def datasets(indexed_datasets: dict[str, Path]) -> dict[str, Path]:
    return indexed_datasets


@pytest.mark.unit
def test_vocabulary_comes_from_the_tokenizer(datasets: dict[str, Path]) -> None:
    proc = run_script(
        [
            *MODEL,
            "--data-path",
            str(datasets["a"]),
            *tokenizer_flags(datasets),
            "--tensor-model-parallel-size",
            "2",
            "--world-size",
            "2",
            "--dry-run",
        ]
    )
    assert proc.returncode == 0, proc.stderr
    assert "padded vocabulary: 1,024" in proc.stdout  # 1,000 pieces → multiple of 128 × TP2
    # --vocab-size sizes only the NullTokenizer; with a real tokenizer it is ignored, as in Megatron-LM.
    cfg = check([*MODEL, "--data-path", str(datasets["a"]), *tokenizer_flags(datasets), "--vocab-size", "50257"])
    assert (cfg.vocab_size, cfg.padded_vocab_size) == (1000, 1024)


@pytest.mark.unit
@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--data-path", "{root}/nope_text_document"], "missing"),
        (["--data-path", "0.5", "{a}", "0.5"], "a weight without its prefix"),
        (["--data-path", "0.5", "{a}", "{b}", "0.5"], "mixes weights and prefixes"),
        (["--data-path", "{a}", "--tokenizer-type", "NullTokenizer", "--vocab-size", "50"], "different tokenizer"),
        (["--data-path", "{a}", "--tokenizer-model", "{root}/missing.model"], "does not exist"),
        (["--data-path", "{a}", "--train-data-path", "{b}"], "mutually exclusive"),
        (["--valid-data-path", "{b}"], "need --train-data-path"),
        # 0.1% of 237 documents rounds to none: Megatron-Core would index the test split forever.
        (["--data-path", "{a}", "--eval-iters", "1"], "the test split of .* holds no document: --split 969,30,1"),
    ],
)
def test_bad_data_options_fail_before_training(datasets: dict[str, Path], flags: list[str], message: str) -> None:
    args = [f.format(root=datasets["root"], a=datasets["a"], b=datasets["b"]) for f in flags]
    if "--tokenizer-type" not in args:
        args = [*tokenizer_flags(datasets), *args]
    with pytest.raises(ConfigError, match=message):
        check([*MODEL, *args])


@pytest.mark.unit
def test_damaged_dataset_is_a_config_error(datasets: dict[str, Path], tmp_path: Path) -> None:
    for ext in ("bin", "idx"):
        (tmp_path / f"cut.{ext}").write_bytes(Path(f"{datasets['a']}.{ext}").read_bytes())
    with open(tmp_path / "cut.bin", "r+b") as f:
        f.truncate(100)
    # pretrain_gpt.py itself: exit code 2 and one line naming the problem, before any process group.
    proc = run_script([*MODEL, "--data-path", str(tmp_path / "cut"), *tokenizer_flags(datasets), "--dry-run"])
    assert proc.returncode == 2 and "the .bin is truncated" in proc.stderr


def write_dataset(prefix: Path, dtype: type, *, vocab: int = 1000, docs: int = 200, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 50, size=docs)
    writer = IndexedWriter(prefix, dtype)
    writer.add_documents(rng.integers(0, vocab, size=int(lengths.sum())), lengths)
    writer.commit()
    return prefix


def corrupt_pointer(prefix: Path, sequence: int) -> None:
    """Overwrite one sequence pointer in the middle of the index (the ends stay consistent)."""
    files = IndexedDatasetFiles.open(prefix)
    offset = 34 + 4 * files.num_sequences + 8 * sequence
    del files
    with open(f"{prefix}.idx", "r+b") as f:
        f.seek(offset)
        f.write(np.int64(12345).tobytes())


@pytest.mark.unit
def test_ranks_other_than_0_check_datasets_in_constant_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every rank checks header, sizes and the end of the last sequence against the .bin size; only
    global rank 0 (RANK, default 0) verifies every pointer and samples token ids."""
    tok = NullTokenizer(1000)  # ids 0..999
    good = write_dataset(tmp_path / "good", np.uint16)
    bad_pointer = write_dataset(tmp_path / "bad_pointer", np.uint16)
    corrupt_pointer(bad_pointer, 100)
    truncated = write_dataset(tmp_path / "truncated", np.uint16)
    with open(f"{truncated}.bin", "r+b") as f:
        f.truncate(f.seek(0, 2) - 2)
    other_tokenizer = write_dataset(tmp_path / "other_tokenizer", np.uint16, vocab=30000)

    monkeypatch.setenv("RANK", "7")
    for prefix in (good, bad_pointer, other_tokenizer):  # what only the full checks can see passes here
        data_sources.check_dataset(str(prefix), tok)
    with pytest.raises(data_sources.DataError, match=r"the \.bin is truncated"):
        data_sources.check_dataset(str(truncated), tok)
    reads: list[str] = []
    monkeypatch.setattr(IndexedDatasetFiles, "verify", lambda self, **kw: reads.append("verify") or [])
    data_sources.check_dataset(str(good), tok)
    assert reads == []

    monkeypatch.undo()
    for rank in ("0", None):
        if rank is None:
            monkeypatch.delenv("RANK", raising=False)
        else:
            monkeypatch.setenv("RANK", rank)
        data_sources.check_dataset(str(good), tok)
        with pytest.raises(data_sources.DataError, match="sequence 100: pointer 12345"):
            data_sources.check_dataset(str(bad_pointer), tok)
        with pytest.raises(data_sources.DataError, match=r"holds token id \d+, beyond the vocabulary"):
            data_sources.check_dataset(str(other_tokenizer), tok)


@pytest.mark.unit
def test_full_dataset_checks_in_dry_run(datasets: dict[str, Path], tmp_path: Path) -> None:
    """pretrain_gpt.py --dry-run (one process, no RANK) runs the full checks: a bad pointer in the middle of
    the index is an error there, while a non-zero rank's start-up check lets it pass."""
    for ext in ("bin", "idx"):
        (tmp_path / f"ptr.{ext}").write_bytes(Path(f"{datasets['a']}.{ext}").read_bytes())
    corrupt_pointer(tmp_path / "ptr", 50)
    proc = run_script([*MODEL, "--data-path", str(tmp_path / "ptr"), *tokenizer_flags(datasets), "--dry-run"])
    assert proc.returncode == 2 and "sequence 50: pointer 12345" in proc.stderr, proc.stderr


@pytest.mark.unit
def test_token_dtype_must_only_hold_the_vocabulary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """int32 tokens for a small vocabulary (as other tools write them) are valid; a dtype that cannot hold
    every id of the tokenizer is not."""
    monkeypatch.setenv("RANK", "0")
    tok = NullTokenizer(1000)
    for dtype in (np.int32, np.int64, np.uint16, np.int16):
        data_sources.check_dataset(str(write_dataset(tmp_path / np.dtype(dtype).name, dtype)), tok)
    small = write_dataset(tmp_path / "uint8", np.uint8, vocab=200)
    with pytest.raises(data_sources.DataError, match="uint8 tokens, which cannot hold the ids of NullTokenizer"):
        data_sources.check_dataset(str(small), tok)
    data_sources.check_dataset(str(small), NullTokenizer(256))  # 256 ids fit in uint8


@pytest.mark.unit
def test_blend_weights_reach_megatron_cores_blended_dataset(datasets: dict[str, Path]) -> None:
    """'0.7 A 0.3 B' draws 70% of the training and validation samples from A, through Megatron-Core's
    BlendedDataset.
    No --data-cache-path: without a process group Megatron-Core builds the blend's indices in memory."""
    from megatron.core.datasets.blended_dataset import BlendedDataset

    from megatron_ext.training.datasets import build_datasets

    cfg = parse_args(
        [
            *MODEL,
            *blend_flags(datasets),
            *tokenizer_flags(datasets),
            "--train-iters",
            "50",
            "--eval-iters",
            "4",
        ]
    )
    checked = preflight(cfg, full=True)
    built = build_datasets(checked.cfg, checked.tokenizer)
    # Weights ignored would give 50% (equal) or A's share of the tokens (by size): both far from 70%.
    sizes = [int(IndexedDatasetFiles.open(datasets[k]).lengths.sum()) for k in ("a", "b")]
    assert abs(sizes[0] / sum(sizes) - 0.7) > 0.05
    for split, expected_samples in ((built.train, 50 * 8), (built.valid, 4 * 8)):
        assert isinstance(split, BlendedDataset)
        assert [d.dataset.path_prefix for d in split.datasets] == [str(datasets["a"]), str(datasets["b"])]
        assert len(split) >= expected_samples
        counts = np.bincount(np.asarray(split.dataset_index), minlength=2)
        assert abs(counts[0] / counts.sum() - 0.7) < 0.01, counts
        # Every sample is one of that source's own samples.
        for i in range(0, len(split), 37):
            source, index = int(split.dataset_index[i]), int(split.dataset_sample_index[i])
            assert np.array_equal(split[i]["tokens"], split.datasets[source][index]["tokens"])


@pytest.mark.distributed
def test_pipeline_trains_on_a_weighted_blend(pipeline_run: SavedRun) -> None:
    """PP2 × VP2 on '0.7 A 0.3 B' with a 90/8/2 split: the loss goes down, validation and test run."""
    metrics, cache = pipeline_run.metrics, pipeline_run.data_cache
    rows = read_metrics(metrics)
    losses = [r["lm_loss"] for r in rows if "lm_loss" in r]
    valid = [r["valid_loss"] for r in rows if "valid_loss" in r]
    assert len(losses) == 16 and len(valid) == 2
    assert sum(losses[-4:]) / 4 < sum(losses[:4]) / 4 - 0.5
    assert valid[-1] < valid[0]
    # The test split is evaluated once, after training (as Megatron-LM does).
    (test,) = [r for r in rows if "test_loss" in r]
    assert test["iteration"] == 16 and test["test_loss"] < losses[0]
    # Megatron-Core built its sample/shuffle indices once (rank 0) into --data-cache-path.
    assert any(cache.rglob("*shuffle_index.npy"))
    # The training run's own blend (the train split's BlendedDataset index in the cache) is 0.7 / 0.3.
    (train_index,) = [np.load(p) for p in cache.rglob("*-BlendedDataset-train-dataset_index.npy")]
    counts = np.bincount(train_index, minlength=2)
    assert abs(counts[0] / counts.sum() - 0.7) < 0.01, counts


@pytest.mark.distributed
def test_per_token_loss_weighs_every_token_of_the_step_alike(tmp_path: Path) -> None:
    """--calculate-per-token-loss: the step's gradient is that of the mean over all its tokens. With
    --eod-mask-loss on documents of 1 to 49 tokens the microbatches count different numbers of tokens, so four
    microbatches of one sequence must give the gradient of one microbatch of four; Megatron-LM's default, the
    mean of the microbatches' means, does not. (The default --split leaves the test split of these 400
    documents empty: without evaluation it is not built, so the run starts.)"""
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 50, size=400)
    tokens = rng.integers(0, 999, size=int(lengths.sum()))
    tokens[np.cumsum(lengths) - 1] = 999  # every document ends with NullTokenizer(1000)'s end-of-document id
    writer = IndexedWriter(tmp_path / "short", np.uint16)
    writer.add_documents(tokens, lengths)
    writer.commit()
    data = ["--data-path", str(tmp_path / "short"), "--tokenizer-type", "NullTokenizer", "--vocab-size", "1000"]

    def first_grad_norm(micro_batch: int, *flags: str) -> float:
        metrics = tmp_path / f"mbs{micro_batch}{''.join(flags)}.jsonl"
        run_pretrain(
            [*MODEL, *data, "--eod-mask-loss", "--micro-batch-size", str(micro_batch), "--global-batch-size", "4",
             "--train-iters", "1", "--metrics-file", str(metrics), *flags],
        )  # fmt: skip
        (norm,) = [r["grad_norm"] for r in read_metrics(metrics) if "grad_norm" in r]
        return float(norm)

    whole_batch = first_grad_norm(4)
    # fp32 on CPU: the same sum in another order (about 1e-7); the default differs by about 5e-4.
    assert first_grad_norm(1, "--calculate-per-token-loss") == pytest.approx(whole_batch, rel=1e-6)
    assert abs(first_grad_norm(1) - whole_batch) > 1e-4 * whole_batch


@pytest.mark.distributed
def test_document_masking_trains_alike_on_every_pipeline_stage(tmp_path: Path) -> None:
    """--reset-attention-mask on documents of 1 to 19 tokens (several per 64-token sample): PP2 × VP2, whose
    middle chunks read the batch for its mask only, gives the losses and gradient norms of one process; without
    the mask they differ, so the mask reaches the layers (tests/training/test_document_masking.py: per token).
    --dataloader-inter-document-masking (the documents as packed sequences) under PP2 × VP2 trains alike too."""
    rng = np.random.default_rng(1)
    lengths = rng.integers(1, 20, size=600)
    tokens = rng.integers(0, 999, size=int(lengths.sum()))
    tokens[np.cumsum(lengths) - 1] = 999  # NullTokenizer(1000)'s end of document
    writer = IndexedWriter(tmp_path / "short", np.uint16)
    writer.add_documents(tokens, lengths)
    writer.commit()
    flags = [*MODEL, "--data-path", str(tmp_path / "short"), "--tokenizer-type", "NullTokenizer", "--vocab-size",
             "1000", "--lr", "1e-3", "--train-iters", "4"]  # fmt: skip
    seed = tmp_path / "seed"
    run_pretrain([*flags, "--train-iters", "0", "--save", str(seed)])

    def train(name: str, nproc: int, *extra: str) -> list[tuple[float, float]]:
        metrics = tmp_path / f"{name}.jsonl"
        run_pretrain([*flags, "--load", str(seed), "--metrics-file", str(metrics), *extra], nproc=nproc)
        return [(r["lm_loss"], r["grad_norm"]) for r in read_metrics(metrics) if "lm_loss" in r]

    masked = ["--reset-attention-mask", "--reset-position-ids"]
    one = train("one", 1, *masked)
    pipeline = train("pp2-vp2", 2, *masked, "--pipeline-model-parallel-size", "2",
                     "--num-layers-per-virtual-pipeline-stage", "1")  # fmt: skip
    assert len(one) == 4
    for (loss, norm), (pp_loss, pp_norm) in zip(one, pipeline, strict=True):
        assert pp_loss == pytest.approx(loss, rel=1e-5) and pp_norm == pytest.approx(norm, rel=1e-5)
    unmasked = train("unmasked", 1, "--reset-position-ids")
    assert abs(unmasked[0][0] - one[0][0]) > 1e-3
    # The same boundaries as packed sequences (THD, SDPA per document): each micro-batch's two samples become one
    # sequence of 128 tokens, also between the stages (fails if the receive buffers keep the [s, b, h] shape).
    packed = train("packed-pp2-vp2", 2, "--dataloader-inter-document-masking", "--pipeline-model-parallel-size", "2",
                   "--num-layers-per-virtual-pipeline-stage", "1")  # fmt: skip
    for (loss, norm), (packed_loss, packed_norm) in zip(one, packed, strict=True):
        assert packed_loss == pytest.approx(loss, rel=1e-5) and packed_norm == pytest.approx(norm, rel=1e-5)

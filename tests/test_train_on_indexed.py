"""pretrain_gpt.py on indexed datasets made by tools/preprocess_data.py: blends, splits, checks."""

from __future__ import annotations

from pathlib import Path

import pytest

from megatron_ext.arguments import ConfigError, parse_args
from tests.conftest import read_metrics, run_pretrain, run_script
from tests.data_helpers import shared_data, tool

MODEL = "--num-layers 4 --hidden-size 64 --num-attention-heads 4 --seq-length 64 --micro-batch-size 2 --global-batch-size 8 --hidden-dropout 0 --attention-dropout 0 --device cpu --seed 1234".split()


@pytest.fixture(scope="module")
def datasets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two datasets (halves of the shared corpus) and the tokenizer they were made with."""
    shared = shared_data(tmp_path_factory)
    root = tmp_path_factory.mktemp("train-on-indexed")
    lines = shared["corpus"].read_text(encoding="utf-8").splitlines(keepends=True)
    half = len(lines) // 2
    out = {"model": shared["model"], "root": root}
    for name, part in (("a", lines[:half]), ("b", lines[half:])):
        (root / f"{name}.jsonl").write_text("".join(part), encoding="utf-8")
        tool(
            "preprocess_data",
            "--input",
            str(root / f"{name}.jsonl"),
            "--output-prefix",
            str(root / name),
            "--tokenizer-type",
            "GPTSentencePieceTokenizer",
            "--tokenizer-model",
            str(shared["model"]),
            "--append-eod",
            "--workers",
            "2",
            "--quiet",
        )
        out[name] = root / f"{name}_text_document"
    return out


def tokenizer_flags(ds: dict[str, Path]) -> list[str]:
    return ["--tokenizer-type", "GPTSentencePieceTokenizer", "--tokenizer-model", str(ds["model"])]


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
    cfg = parse_args([*MODEL, "--data-path", str(datasets["a"]), *tokenizer_flags(datasets), "--vocab-size", "50257"])
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
    ],
)
def test_bad_data_options_fail_before_training(datasets: dict[str, Path], flags: list[str], message: str) -> None:
    args = [f.format(root=datasets["root"], a=datasets["a"], b=datasets["b"]) for f in flags]
    if "--tokenizer-type" not in args:
        args = [*tokenizer_flags(datasets), *args]
    with pytest.raises(ConfigError, match=message):
        parse_args([*MODEL, *args])


@pytest.mark.unit
def test_damaged_dataset_is_a_config_error(datasets: dict[str, Path], tmp_path: Path) -> None:
    for ext in ("bin", "idx"):
        (tmp_path / f"cut.{ext}").write_bytes(Path(f"{datasets['a']}.{ext}").read_bytes())
    with open(tmp_path / "cut.bin", "r+b") as f:
        f.truncate(100)
    # pretrain_gpt.py itself: exit code 2 and one line naming the problem, before any process group.
    proc = run_script([*MODEL, "--data-path", str(tmp_path / "cut"), *tokenizer_flags(datasets), "--dry-run"])
    assert proc.returncode == 2 and "the .bin is truncated" in proc.stderr


@pytest.mark.distributed
def test_pipeline_trains_on_a_weighted_blend(datasets: dict[str, Path], tmp_path: Path) -> None:
    """PP2 × VP2 on '0.7 A 0.3 B' with a 90/8/2 split: the loss goes down, validation and test run."""
    metrics = tmp_path / "metrics.jsonl"
    cache = tmp_path / "index-cache"
    run_pretrain(
        [
            *MODEL,
            "--data-path",
            "0.7",
            str(datasets["a"]),
            "0.3",
            str(datasets["b"]),
            "--split",
            "90,8,2",
            "--data-cache-path",
            str(cache),
            *tokenizer_flags(datasets),
            "--pipeline-model-parallel-size",
            "2",
            "--num-layers-per-virtual-pipeline-stage",
            "1",
            "--lr",
            "3e-3",
            "--lr-warmup-iters",
            "2",
            "--train-iters",
            "16",
            "--eval-interval",
            "8",
            "--eval-iters",
            "2",
            "--log-interval",
            "1",
            "--metrics-file",
            str(metrics),
        ],
        nproc=2,
    )
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

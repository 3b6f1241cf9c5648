"""A run's identity: tokenizers and datasets told apart by content, not by size or path."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from megatron_ext.checkpoint.run_identity import (
    RunIdentity,
    data_differences,
    data_identity,
    tokenizer_difference,
    tokenizer_identity,
)
from megatron_ext.config.training_config import parse_args
from megatron_ext.data.tokenizers import GPTSentencePieceTokenizer, NullTokenizer

pytestmark = pytest.mark.unit


def _train_sentencepiece(text: str, prefix: Path) -> Path:
    import sentencepiece

    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(text.splitlines()),
        model_prefix=str(prefix),
        vocab_size=200,
        model_type="bpe",
        minloglevel=2,
    )
    return prefix.with_suffix(".model")


@pytest.fixture(scope="module")
def two_models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two 200-piece SentencePiece models trained on different halves of the standard library's docstrings."""
    root = tmp_path_factory.mktemp("sp")
    docs = [m.__doc__ for m in list(sys.modules.values()) if isinstance(getattr(m, "__doc__", None), str)]
    docs = sorted(d for d in docs if d and len(d) > 200)
    a = _train_sentencepiece("\n".join(docs[0::2]), root / "a")
    b = _train_sentencepiece("\n".join(docs[1::2]), root / "b")
    return a, b


def test_the_same_file_elsewhere_is_the_same_tokenizer(two_models: tuple[Path, Path], tmp_path: Path) -> None:
    a, _ = two_models
    moved = tmp_path / "moved.model"
    shutil.copy(a, moved)
    saved = tokenizer_identity(GPTSentencePieceTokenizer(a))
    assert tokenizer_difference(saved, tokenizer_identity(GPTSentencePieceTokenizer(moved))) is None


def test_another_model_of_the_same_size_is_another_tokenizer(two_models: tuple[Path, Path]) -> None:
    a, b = two_models
    ta, tb = GPTSentencePieceTokenizer(a), GPTSentencePieceTokenizer(b)
    assert ta.vocab_size == tb.vocab_size  # what was recorded before: it cannot tell them apart
    difference = tokenizer_difference(tokenizer_identity(ta), tokenizer_identity(tb))
    assert difference is not None
    assert f"trained with the tokenizer GPTSentencePieceTokenizer at {a.resolve()} (vocabulary 200" in difference
    assert f"this one is GPTSentencePieceTokenizer at {b.resolve()} (vocabulary 200" in difference


def test_null_tokenizers_differ_by_size() -> None:
    assert tokenizer_difference(tokenizer_identity(NullTokenizer(255)), tokenizer_identity(NullTokenizer(255))) is None
    assert tokenizer_difference(tokenizer_identity(NullTokenizer(255)), tokenizer_identity(NullTokenizer(300)))


def _data(tmp_path: Path, *argv: str) -> dict:
    return data_identity(parse_args([*argv, "--world-size", "1"]).data)


def test_data_differences(tmp_path: Path) -> None:
    for name, content in (("a", b"index of a"), ("b", b"index of b"), ("c", b"index of c")):
        (tmp_path / f"{name}.idx").write_bytes(content)
    a, b, c = (str(tmp_path / n) for n in "abc")
    saved = _data(tmp_path, "--data-path", "0.7", a, "0.3", b)
    assert data_differences(saved, saved) == []
    # Moved to another directory with the same contents: the same data.
    moved = tmp_path / "moved"
    moved.mkdir()
    for name in "ab":
        shutil.copy(tmp_path / f"{name}.idx", moved / f"{name}.idx")
    assert (
        data_differences(saved, _data(tmp_path, "--data-path", "0.7", str(moved / "a"), "0.3", str(moved / "b"))) == []
    )
    assert data_differences(saved, _data(tmp_path, "--data-path", "0.5", a, "0.5", b)) == [
        f"--data-path dataset 1 ({a}): weight 0.7 → 0.5",
        f"--data-path dataset 2 ({b}): weight 0.3 → 0.5",
    ]
    assert data_differences(saved, _data(tmp_path, "--data-path", "0.7", a, "0.3", c)) == [
        f"--data-path dataset 2: {c}.idx is not the checkpoint's {b}.idx"
    ]
    assert data_differences(saved, _data(tmp_path, "--data-path", "0.7", a, "0.3", b, "--split", "98,2,0")) == [
        "--split 969,30,1 → 98,2,0"
    ]
    assert data_differences(saved, _data(tmp_path, "--data-path", "0.7", a, "0.3", b, "--split", "96.9/3/0.1")) == []
    assert data_differences(saved, _data(tmp_path, "--mock-data")) == [
        "--mock-data: off → on",
        "--data-path: 2 datasets → 0",
    ]
    # A dataset rewritten in place (more documents, other sizes) is another dataset.
    (tmp_path / "b.idx").write_bytes(b"index of b, grown")
    assert data_differences(saved, _data(tmp_path, "--data-path", "0.7", a, "0.3", b)) == [
        f"--data-path dataset 2: {b}.idx is not the checkpoint's {b}.idx"
    ]


def test_identity_is_plain_values(two_models: tuple[Path, Path]) -> None:
    """Only plain values may be recorded: older checkpoints' common.pt is read with torch.load(weights_only=True)."""
    identity = RunIdentity.of(GPTSentencePieceTokenizer(two_models[0]), parse_args(["--mock-data"]).data)
    assert json.loads(json.dumps(identity.as_record())) == identity.as_record()


def test_the_tools_refuse_a_tokenizer_replaced_at_the_recorded_path(
    two_models: tuple[Path, Path], tmp_path: Path
) -> None:
    """generate.py and to-hf build the tokenizer from the recorded flags: a file swapped there is refused."""
    from megatron_ext.checkpoint.on_disk import CheckpointError
    from megatron_ext.inference.checkpoint import SavedCheckpoint, checked_tokenizer

    a, b = two_models
    recorded = tmp_path / "tokenizer.model"
    shutil.copy(a, recorded)
    cfg = parse_args(
        ["--mock-data", "--tokenizer-type", "GPTSentencePieceTokenizer", "--tokenizer-model", str(recorded)]
    )
    identity = RunIdentity.of(GPTSentencePieceTokenizer(recorded), cfg.data).as_record()
    ckpt = SavedCheckpoint(root=tmp_path, path=tmp_path / "iter_0000004", iteration=4, cfg=cfg, identity=identity)
    assert checked_tokenizer(ckpt).vocab_size == 200
    shutil.copy(b, recorded)  # same path, same size, other pieces
    with pytest.raises(CheckpointError, match=r"iter_0000004: the checkpoint was trained with the tokenizer .*"
                       r"--accept-tokenizer-change to use this one deliberately"):  # fmt: skip
        checked_tokenizer(ckpt)
    assert checked_tokenizer(ckpt, accept_change=True).vocab_size == 200
    # A checkpoint from before identities were recorded: only its vocabulary size can be checked.
    assert checked_tokenizer(dataclasses.replace(ckpt, identity=None)).vocab_size == 200
    assert os.path.samefile(recorded, checked_tokenizer(ckpt, accept_change=True).model_file)  # type: ignore[attr-defined]

"""TikTokenizer as Megatron-LM's CustomTikTokenizer: a vocabulary file of ranks trained here with tiktoken's own
trainer, ids after the special tokens, in preprocessing, training's flags and the checks of its input."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from megatron_ext.config.arguments import ConfigError
from megatron_ext.config.training_config import parse_args
from megatron_ext.data.tokenizer_base import TokenizerError
from megatron_ext.data.tokenizers import build_tokenizer
from tests.data.helpers import TIKTOKEN_MERGES, preprocess, reference_dataset, same_files, shared_data, tiktoken_vocab

pytestmark = pytest.mark.unit

MERGES = TIKTOKEN_MERGES


@pytest.fixture(scope="module")
def vocab(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiktoken_vocab(tmp_path_factory)


def test_ids_follow_the_special_tokens_and_the_text_comes_back(vocab: Path) -> None:
    tok = build_tokenizer("TikTokenizer", tokenizer_model=str(vocab), vocab_size=1000 + 256 + MERGES,
                          tiktoken_pattern="v2")  # fmt: skip
    assert (tok.vocab_size, tok.eod, tok.bos) == (1456, 2, 1)  # type: ignore[attr-defined]
    # The 256 single bytes are ranks 0..255: ids 1000..1255 (after <unk> <s> </s> and 997 fillers).
    assert tok.tokenize("\x00") == [1000] and tok.tokenize("A") == [1000 + ord("A")]
    text = "def parse(line):\n    return line.split('=', 1)  # 日本語 😀"
    ids = tok.tokenize(text)
    assert tok.detokenize(ids) == text and all(1000 <= i < 1456 for i in ids)
    assert len(ids) < len(text.encode())  # merges applied
    marker = tok.tokenize("</s>")  # a special token's spelling in the text is plain text (encode_ordinary)
    assert tok.eod not in marker and all(i >= 1000 for i in marker) and tok.detokenize(marker) == "</s>"
    assert [list(a) for a in tok.tokenize_batch([text, ""])] == [ids, []]


def test_the_vocabulary_and_flags_are_checked_as_megatron_lm_checks_them(vocab: Path, tmp_path: Path) -> None:
    def build(**flags: object) -> object:
        return build_tokenizer("TikTokenizer", tokenizer_model=str(vocab), tiktoken_pattern="v1", **flags)  # type: ignore[arg-type]

    with pytest.raises(TokenizerError, match="has 456 ranks; --vocab-size 131,072 with 1000 special tokens needs"):
        build()  # Megatron-LM's default vocabulary, 2**17
    with pytest.raises(TokenizerError, match="must include <unk> <s> </s>"):
        build(vocab_size=1456, special_tokens=["<s>", "</s>"])
    with pytest.raises(TokenizerError, match="--tiktoken-num-special-tokens 2 must be at least the 3 special tokens"):
        build(vocab_size=458, tiktoken_num_special_tokens=2)
    small = build(vocab_size=10 + 300, tiktoken_num_special_tokens=10, special_tokens=["<s>", "<unk>", "</s>", "<x>"])
    assert (small.vocab_size, small.eod, small.bos) == (310, 2, 0)  # type: ignore[attr-defined]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"rank": 0, "token_bytes": base64.b64encode(b"x").decode(), "token_str": "x"}]))
    with pytest.raises(TokenizerError, match="rank 0 must be the single byte 0"):
        build_tokenizer("TikTokenizer", tokenizer_model=str(bad), tiktoken_pattern="v2", vocab_size=1001)


def test_pretrain_flags_name_what_tiktokenizer_needs(vocab: Path) -> None:
    flags = ["--mock-data", "--tokenizer-type", "TikTokenizer", "--tokenizer-model", str(vocab)]
    with pytest.raises(ConfigError, match=r"TikTokenizer needs --tokenizer-model VOCAB\.json and --tiktoken-pattern"):
        parse_args(flags)
    cfg = parse_args([*flags, "--tiktoken-pattern", "v2", "--vocab-size", "1456", "--tiktoken-special-tokens",
                      "<unk>", "<s>", "</s>", "<pad>"])  # fmt: skip
    assert cfg.data.tokenizer_special_tokens == ("<unk>", "<s>", "</s>", "<pad>")
    assert any(
        note.startswith("--tiktoken-special-tokens: removed from Megatron-LM in core_v0.18.0; accepted: taken as "
                        "--tokenizer-special-tokens")
        for note in cfg.adjustments
    )  # fmt: skip


def test_preprocessing_writes_one_tokenize_call_per_document(
    vocab: Path, tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    shared = shared_data(tmp_path_factory)
    lines = shared["corpus"].read_text(encoding="utf-8").splitlines()[:300]
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    tok = build_tokenizer("TikTokenizer", tokenizer_model=str(vocab), vocab_size=1456, tiktoken_pattern="v2")
    ref = reference_dataset(lines, tok, tmp_path / "ref", append_eod=True)
    preprocess(tmp_path / "in.jsonl", tmp_path / "ours", vocab, "--append-eod", "--workers", "2", "--vocab-size",
               "1456", "--tiktoken-pattern", "v2", tokenizer_type="TikTokenizer")  # fmt: skip
    assert same_files(ref["text"], tmp_path / "ours_text_document")

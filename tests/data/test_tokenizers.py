"""Tokenizers: Megatron-LM's --tokenizer-type semantics (ids, vocabulary size, eod)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from megatron_ext.data.cut_rules import GPT2_PATTERN, gpt2_pattern
from megatron_ext.data.tokenizer_base import TokenizerError
from megatron_ext.data.tokenizers import (
    GPT2BPETokenizer,
    GPTSentencePieceTokenizer,
    HuggingFaceTokenizer,
    NullTokenizer,
    SentencePieceTokenizer,
    build_tokenizer,
    bytes_to_unicode,
)
from tests.data.helpers import shared_data

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def sp_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return shared_data(tmp_path_factory)["model"]


# ----------------------------------------------------------------- GPT-2 BPE
@pytest.fixture()
def gpt2_files(tmp_path: Path) -> tuple[Path, Path]:
    """A handmade byte-level BPE: enough merges to build 'hello' and ' world'."""
    merges = ["h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or", "Ġworl d", "Ġwor l"]
    symbols = ["[unused]", "!", "d", "e", "h", "l", "o", "r", "w", "Ġ", "Ċ"]
    symbols += [m.replace(" ", "") for m in merges] + ["<|endoftext|>"]
    vocab = {s: i for i, s in enumerate(symbols)}
    (tmp_path / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    (tmp_path / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n", encoding="utf-8")
    return tmp_path / "vocab.json", tmp_path / "merges.txt"


def test_gpt2_byte_map_is_gpt2s() -> None:
    mapping = bytes_to_unicode()
    assert len(set(mapping.values())) == 256
    assert mapping[ord(" ")] == "Ġ" and mapping[ord("\n")] == "Ċ" and mapping[ord("A")] == "A"


def test_gpt2_pattern_splits_like_gpt2() -> None:
    pat = gpt2_pattern()
    assert pat.findall("I'm 42 years old!!  Ok\n\n") == ["I", "'m", " 42", " years", " old", "!!", " ", " Ok", "\n\n"]
    # Unicode letters and numbers (\p{L}, \p{N}) beyond ASCII, and non-breaking space as whitespace.
    assert pat.findall("naïve 日本語 ½Ⅻ\u00a0x") == ["naïve", " 日本語", " ½Ⅻ", "\u00a0", "x"]
    # U+001C is not Unicode White_Space (it is for Python's \s): punctuation, as in the regex module.
    assert pat.findall("a\x1cb") == ["a", "\x1c", "b"]


def test_gpt2_pattern_uses_newer_unicode_like_megatron_lm() -> None:
    """Letters and digits of Unicode 15-16 split as Megatron-LM's `regex` splits them, whatever the
    interpreter's own Unicode version (Python 3.11's unicodedata is 14.0 and has them unassigned)."""
    text = (
        "a\U0001e030b"  # U+1E030 MODIFIER LETTER CYRILLIC SMALL A (Lm, Unicode 15): inside a word
        " \U00011f04\U00011f05"  # two Kawi letters (Lo, Unicode 15)
        " \U00011f50\U00011f51"  # KAWI DIGIT ZERO, ONE (Nd, Unicode 15): a number
        " \u1c89x"  # U+1C89 CYRILLIC CAPITAL LETTER TJE (Lu, Unicode 16)
        " 1\U0001ccf0"  # U+1CCF0 OUTLINED DIGIT ZERO (Nd, Unicode 16)
    )
    assert gpt2_pattern().findall(text) == [
        "a\U0001e030b",
        " \U00011f04\U00011f05",
        " \U00011f50\U00011f51",
        " \u1c89x",
        " 1\U0001ccf0",
    ]
    assert GPT2_PATTERN == r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def test_gpt2_bpe_merges_across_a_newer_letter(tmp_path: Path) -> None:
    """A merge of 'a' with the first UTF-8 byte of U+1E030 (a letter since Unicode 15) applies, because
    the word is one pre-token for Megatron-LM's `regex` pattern."""
    byte_chars = list(bytes_to_unicode().values())
    first = bytes_to_unicode()[0xF0]  # U+1E030 is F0 9E 80 B0 in UTF-8
    vocab = {c: i for i, c in enumerate([*byte_chars, "a" + first, "<|endoftext|>"])}
    (tmp_path / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    (tmp_path / "merges.txt").write_text(f"#version: 0.2\na {first}\n", encoding="utf-8")
    tok = GPT2BPETokenizer(tmp_path / "vocab.json", tmp_path / "merges.txt")
    rest = [vocab[bytes_to_unicode()[b]] for b in (0x9E, 0x80, 0xB0)]
    assert tok.tokenize("a\U0001e030") == [vocab["a" + first], *rest]
    assert tok.detokenize(tok.tokenize("a\U0001e030")) == "a\U0001e030"


def test_gpt2_bpe_ids_by_hand(gpt2_files: tuple[Path, Path]) -> None:
    tok = GPT2BPETokenizer(*gpt2_files)
    v = tok.encoder
    assert tok.vocab_size == len(v) and tok.eod == v["<|endoftext|>"] == len(v) - 1
    assert tok.tokenize("hello world") == [v["hello"], v["Ġworld"]]
    # "hell": h e → he, l l → ll, he ll → hell (lowest rank first).
    assert tok.tokenize("hell") == [v["hell"]]
    # Unknown pieces get id 0 (Megatron-LM's encoder.get(token, 0)); the special token is plain text.
    assert tok.tokenize("hello!?") == [v["hello"], v["!"], 0]
    assert tok.eod not in tok.tokenize("<|endoftext|>")
    assert tok.detokenize(tok.tokenize("hello world\n")) == "hello world\n"


def test_gpt2_merges_file_quirk(tmp_path: Path, gpt2_files: tuple[Path, Path]) -> None:
    # Megatron-LM drops the first line and whatever follows the last newline.
    vocab, merges = gpt2_files
    no_newline = tmp_path / "merges_nonl.txt"
    no_newline.write_text(merges.read_text().rstrip("\n"), encoding="utf-8")
    assert len(GPT2BPETokenizer(vocab, no_newline).bpe_ranks) == len(GPT2BPETokenizer(vocab, merges).bpe_ranks) - 1


def test_gpt2_missing_files_are_clear(tmp_path: Path) -> None:
    with pytest.raises(TokenizerError, match="--vocab-file"):
        build_tokenizer("GPT2BPETokenizer", vocab_file=str(tmp_path / "nope.json"), merge_file=None)


# ------------------------------------------------------------- SentencePiece
def test_gpt_sentencepiece_is_plain_sentencepiece(sp_model: Path) -> None:
    tok = GPTSentencePieceTokenizer(sp_model)
    assert tok.vocab_size == len(tok.sp) == 1000
    assert tok.eod == tok.sp.eos_id() == 2
    texts = ["Return the value.", "", "  indented\n\tand tabs", "<special> marker", "ünïcödé ✓"]
    batch = tok.tokenize_batch(texts)
    assert [b.tolist() for b in batch] == [tok.tokenize(t) for t in texts]
    assert all(b.dtype == np.int32 for b in batch)
    # identity normalisation + byte fallback: exact round trip, even for unseen characters
    for t in texts:
        assert tok.detokenize(tok.tokenize(t)) == t
    # a user-defined symbol from tools/train_tokenizer.py is one piece
    assert tok.sp.piece_to_id("<special>") in tok.tokenize("<special> marker")


def test_sentencepiece_adds_megatron_special_tokens(sp_model: Path) -> None:
    tok = SentencePieceTokenizer(sp_model)
    n = len(tok.sp)
    # <CLS> <SEP> <EOD> <MASK> and <PAD> (the model has no pad piece) are appended; <s> and </s> exist.
    assert tok.vocab_size == n + 5
    assert tok.eod == n + 2
    assert tok.pad == n + 4
    sp = tok.sp
    text = "a<EOD>b</s>c<MASK>"
    expected = [*sp.encode("a"), n + 2, *sp.encode("b"), sp.eos_id(), *sp.encode("c"), n + 3]
    assert tok.tokenize(text) == expected
    assert tok.tokenize_batch([text, "plain"])[0].tolist() == expected
    assert tok.tokenize("plain text") == sp.encode("plain text")
    # Megatron-LM's detokenize puts spaces around special pieces.
    assert tok.detokenize([*sp.encode("a"), n + 2, *sp.encode("b")]) == "a <EOD> b"


def test_sentencepiece_missing_model_is_clear(tmp_path: Path) -> None:
    with pytest.raises(TokenizerError, match="does not exist"):
        build_tokenizer("GPTSentencePieceTokenizer", tokenizer_model=str(tmp_path / "nope.model"))
    with pytest.raises(TokenizerError, match="needs --tokenizer-model"):
        build_tokenizer("SentencePieceTokenizer")


# ----------------------------------------------------------------------- null
def test_null_tokenizer_matches_megatron_core() -> None:
    """Megatron-Core 0.19's NullTokenizer (Megatron-LM 0.17 and later): --vocab-size ids, end of document the last
    one unless --null-tokenizer-eod-id, padding -1 (GPTDataset's own) unless --null-tokenizer-pad-id."""
    from megatron.core.tokenizers.text.libraries.null_tokenizer import NullTokenizer as CoreNull

    ours, core = NullTokenizer(1024), CoreNull(1024)
    assert (ours.vocab_size, ours.eod, ours.pad) == (core.vocab_size, core.eod, core.pad_id) == (1024, 1023, -1)
    assert ours.tokenize("5 17 3") == core.text_to_ids("5 17 3") == [5, 17, 3]
    assert ours.detokenize([5, 17]) == "5 17"
    flags = {"null_tokenizer_eod_id": 0, "null_tokenizer_pad_id": 7}
    given, core_given = build_tokenizer("NullTokenizer", vocab_size=1024, **flags), CoreNull(1024, 0, 7)  # type: ignore[arg-type]
    assert (given.vocab_size, given.eod, given.pad) == (core_given.vocab_size, core_given.eod, core_given.pad_id)
    with pytest.raises(TokenizerError, match="--vocab-size"):
        build_tokenizer("NullTokenizer")
    with pytest.raises(
        TokenizerError, match=r"--null-tokenizer-eod-id 1024 is not an id of the vocabulary \(0 to 1023"
    ):
        build_tokenizer("NullTokenizer", vocab_size=1024, null_tokenizer_eod_id=1024)


# --------------------------------------------------------------- Hugging Face
def test_huggingface_without_libraries_is_clear(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "transformers", None)
    monkeypatch.setitem(sys.modules, "tokenizers", None)
    with pytest.raises(TokenizerError, match="pip install tokenizers"):
        HuggingFaceTokenizer(tmp_path)
    with pytest.raises(TokenizerError, match="local directory"):
        HuggingFaceTokenizer(tmp_path / "missing")


def test_huggingface_local_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tokenizers = pytest.importorskip("tokenizers")
    monkeypatch.setitem(sys.modules, "transformers", None)  # the `tokenizers` path
    vocab = {"[UNK]": 0, "</s>": 1, "hello": 2, "world": 3}
    tk = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tk.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    tok = HuggingFaceTokenizer(tmp_path)
    assert (tok.vocab_size, tok.eod) == (4, 1)
    assert tok.tokenize("hello world foo") == [2, 3, 0]
    assert [a.tolist() for a in tok.tokenize_batch(["hello", "world hello"])] == [[2], [3, 2]]


def test_unknown_type_names_the_choices() -> None:
    with pytest.raises(TokenizerError, match="GPTSentencePieceTokenizer"):
        build_tokenizer("Llama3Tokenizer")


def test_gpt2_bpe_equals_huggingface_byte_level_bpe(tmp_path: Path, sp_model: Path) -> None:
    """Our byte-level BPE against the `tokenizers` library's, on a vocabulary trained on real text."""
    tokenizers = pytest.importorskip("tokenizers")
    corpus = sp_model.parent / "corpus.jsonl"
    texts = [json.loads(line)["text"] for line in corpus.read_text(encoding="utf-8").splitlines()[:300]]
    tk = tokenizers.Tokenizer(tokenizers.models.BPE())
    tk.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=2000,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
    )
    tk.train_from_iterator(texts, trainer)
    tk.model.save(str(tmp_path))
    ours = GPT2BPETokenizer(tmp_path / "vocab.json", tmp_path / "merges.txt")
    # The last probe has letters and digits of Unicode 15-16, which `tokenizers` also knows.
    probe = [
        *texts[:50],
        "It's 3.14 — naïve café ½ 日本語\t x  y\r\n 🙂 'LL",
        "a\U0001e030b \U00011f50 \u1c89x 1\U0001ccf0",
    ]
    for text in probe:
        assert ours.tokenize(text) == tk.encode(text).ids
        assert ours.detokenize(ours.tokenize(text)) == text

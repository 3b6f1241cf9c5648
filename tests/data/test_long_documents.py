"""Long documents are tokenized in pieces, with exactly the ids of the whole document.

For every tokenizer type: property-based equality of ``tokenize_pieces`` (with tiny pieces, so that
short generated texts are cut many times) and ``tokenize`` on generated text (runs of spaces and
newlines, ``▁``, special strings, any Unicode, text without whitespace); which tokenizers may be cut
and which are tokenized whole (with the reason); the tool's bytes against Megatron-Core's builder fed
whole-document ids; and the worker's memory on a long document (a subprocess, against a control).
"""

from __future__ import annotations

import itertools
import json
import string
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from megatron_ext.data.cut_rules import GPT2_PATTERN, LLAMA3_PATTERN
from megatron_ext.data.preprocess_worker import LONG_DOCUMENT_CHARS
from megatron_ext.data.tokenizer_base import PIECE_CHARS, Tokenizer
from megatron_ext.data.tokenizers import (
    GPT2BPETokenizer,
    GPTSentencePieceTokenizer,
    HuggingFaceTokenizer,
    NullTokenizer,
    SentencePieceTokenizer,
)
from tests import waits
from tests.conftest import REPO, _env
from tests.data.helpers import reference_dataset, same_files, shared_data, tool
from tests.waits import RUN_S

pytestmark = pytest.mark.unit

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

# Pieces of generated text: words, numbers, whitespace of every kind and length, SentencePiece's "▁",
# special strings of the tokenizers, contractions, combining marks, astral characters, any Unicode.
_ATOMS = st.one_of(
    st.text(alphabet=string.ascii_letters, min_size=1, max_size=8),
    st.text(alphabet=string.digits, min_size=1, max_size=5),
    st.sampled_from([" ", "  ", " " * 17, "\n", "\n\n", "\t", "\r\n", " \n ", "\u00a0", "\u3000", "\u2581", " \u2581"]),
    st.sampled_from(["'s", "'LL", "<special>", "<EOD>", "<s>", "</s>", "<|endoftext|>", "café", "日本語", "🙂"]),
    st.sampled_from(["e\u0301", "ǅ", "½", "ﬁ", "\x00", "\x1c", "\u200b", "x\U0001e030"]),
    st.text(min_size=1, max_size=4),
)
TEXTS = st.one_of(
    st.lists(_ATOMS, max_size=60).map("".join),
    st.text(alphabet=st.characters(blacklist_categories=("Zs", "Zl", "Zp", "Cc", "Cs")), max_size=80),  # no whitespace
    st.lists(st.sampled_from(["a", "1", " ", "  ", "\n", "\u2581"]), max_size=80).map("".join),
)
PIECE_SIZES = st.sampled_from([1, 2, 3, 7, 16])


def _outcome(fn: Callable[[], Any]) -> tuple[str, Any]:
    """("ids", list) or ("error", its type and message): a text that fails must fail alike both ways."""
    try:
        return "ids", [int(i) for i in fn()]
    except Exception as exc:
        return "error", f"{type(exc).__name__}: {exc}"


def assert_pieces_equal_whole(tok: Tokenizer, text: str, piece_chars: int) -> None:
    # As the tool holds a whole document's ids when the batch call fails (an id beyond int32: int64).
    whole = _outcome(lambda: np.asarray(tok.tokenize(text), dtype=np.int64))
    pieces = _outcome(lambda: np.concatenate([np.zeros(0, np.int64), *tok.tokenize_pieces(text, piece_chars)]))
    if whole[0] == pieces[0] == "error" and whole != pieces:
        # A text with two faults: the pieces meet the first one in text order (NullTokenizer's "1" * 20, an id
        # beyond int64, before a later empty id), the whole text the one its tokenizer meets first. Each fault
        # alone must fail alike (test_null_pieces_fail_alike_on_a_single_fault).
        assert _several_faults(tok, text), (text, piece_chars, whole, pieces)
        return
    assert pieces == whole, (text, piece_chars)


def _several_faults(tok: Tokenizer, text: str) -> bool:
    """Whether ``text`` splits at spaces into more than one part that fails alone (NullTokenizer's ids)."""
    failing = 0
    for part in text.split(" "):
        try:
            np.asarray(tok.tokenize(part), dtype=np.int64)
        except Exception:
            failing += 1
    return failing > 1


# ------------------------------------------------------------------ tokenizers under test
@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The shared corpus and tokenizer, with a directory of this module's own for what it trains (``root``)."""
    return shared_data(tmp_path_factory) | {"root": tmp_path_factory.mktemp("long-documents")}


@pytest.fixture(scope="module")
def texts(data: dict[str, Path]) -> list[str]:
    return [json.loads(line)["text"] for line in data["corpus"].read_text(encoding="utf-8").splitlines()]


def _train_sp(texts: list[str], prefix: Path, **options: Any) -> Path:
    import sentencepiece

    settings: dict[str, Any] = {"vocab_size": 400, **options}
    if not prefix.with_suffix(".model").exists():
        sentencepiece.SentencePieceTrainer.train(
            sentence_iterator=iter(line for t in texts[:300] for line in t.splitlines() if line.strip()),
            model_prefix=str(prefix),
            byte_fallback=True,
            minloglevel=2,
            **settings,
        )
    return prefix.with_suffix(".model")


SP_MODELS: dict[str, tuple[dict[str, Any], bool | None]] = {
    # name: (trainer options, cut with the dummy-prefix rule (True), the space kept (False), or not at all (None))
    "bpe-identity-dummy-prefix-remove-spaces": (
        {"model_type": "bpe", "normalization_rule_name": "identity"},
        True,
    ),
    "bpe-identity-whitespace-pieces-split-digits": (
        {
            "model_type": "bpe",
            "normalization_rule_name": "identity",
            "remove_extra_whitespaces": False,
            "allow_whitespace_only_pieces": True,
            "split_digits": True,
            "user_defined_symbols": ["<special>"],
        },
        True,
    ),
    "bpe-identity-no-dummy-prefix": (
        {
            "model_type": "bpe",
            "normalization_rule_name": "identity",
            "add_dummy_prefix": False,
            "remove_extra_whitespaces": False,
        },
        False,
    ),
    "bpe-nmt-nfkc": ({"model_type": "bpe"}, None),
    "bpe-no-split-by-whitespace": (
        {"model_type": "bpe", "normalization_rule_name": "identity", "split_by_whitespace": False, "vocab_size": 1000},
        None,
    ),
    "unigram-identity": ({"model_type": "unigram", "normalization_rule_name": "identity"}, None),
}


@pytest.fixture(scope="module")
def sp_models(data: dict[str, Path], texts: list[str]) -> dict[str, Path]:
    return {name: _train_sp(texts, data["root"] / f"long-{name}", **opts) for name, (opts, _) in SP_MODELS.items()}


@pytest.fixture(scope="module")
def gpt2_files(data: dict[str, Path], texts: list[str]) -> tuple[Path, Path]:
    tokenizers = pytest.importorskip("tokenizers")
    directory = data["root"] / "long-gpt2"
    if not (directory / "merges.txt").exists():
        directory.mkdir(exist_ok=True)
        tk = tokenizers.Tokenizer(tokenizers.models.BPE())
        tk.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
        trainer = tokenizers.trainers.BpeTrainer(
            vocab_size=800,
            special_tokens=["<|endoftext|>"],
            initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
        )
        tk.train_from_iterator(texts[:300], trainer)
        tk.model.save(str(directory))
    return directory / "vocab.json", directory / "merges.txt"


def _hf_directory(texts: list[str], directory: Path, kind: str) -> Path:
    """A local Hugging Face tokenizer: byte-level BPE with GPT-2's pattern (``gpt2``), Llama 3's split
    before a byte-level step (``llama3``), both with BOS/EOS added by a template, or a word-level
    tokenizer split at whitespace (``wordlevel``, not cut)."""
    import tokenizers
    from tokenizers import pre_tokenizers, processors

    if (directory / "tokenizer.json").exists():
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    specials = ["<|endoftext|>", "<s>"]
    if kind == "wordlevel":
        tk = tokenizers.Tokenizer(tokenizers.models.WordLevel(unk_token="<unk>"))
        tk.pre_tokenizer = pre_tokenizers.Whitespace()
        trainer: Any = tokenizers.trainers.WordLevelTrainer(special_tokens=["<unk>", *specials])
    else:
        tk = tokenizers.Tokenizer(tokenizers.models.BPE())
        if kind == "gpt2":
            tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        else:
            tk.pre_tokenizer = pre_tokenizers.Sequence(
                [
                    pre_tokenizers.Split(tokenizers.Regex(LLAMA3_PATTERN), behavior="isolated"),
                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
                ]
            )
        trainer = tokenizers.trainers.BpeTrainer(
            vocab_size=800, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        )
    tk.train_from_iterator(texts[:300], trainer)
    tk.post_processor = processors.TemplateProcessing(
        single="<s> $A <|endoftext|>",
        special_tokens=[("<s>", tk.token_to_id("<s>")), ("<|endoftext|>", tk.token_to_id("<|endoftext|>"))],
    )
    tk.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>", "bos_token": "<s>"}))
    return directory


@pytest.fixture(scope="module")
def hf_dirs(data: dict[str, Path], texts: list[str]) -> dict[str, Path]:
    pytest.importorskip("tokenizers")
    return {
        kind: _hf_directory(texts, data["root"] / f"long-hf-{kind}", kind) for kind in ("gpt2", "llama3", "wordlevel")
    }


def _without_transformers(monkeypatch: pytest.MonkeyPatch, backend: str) -> None:
    if backend == "tokenizers":
        monkeypatch.setitem(sys.modules, "transformers", None)
    else:
        pytest.importorskip("transformers")


# ------------------------------------------------------------------ the cut itself
@pytest.mark.parametrize("drop", [True, False])
def test_pieces_are_cut_at_places_only_and_put_back_together_give_the_text(drop: bool) -> None:
    import re

    from megatron_ext.data.cut_rules import CutRule

    rule = CutRule(re.compile("(?<=[a-z]) (?=[a-z])"), drop=drop)
    text = "ab cd  ef gh\u2581ij kl " * 20 + "mn"
    for size in (1, 4, 10, 1000):
        pieces = list(rule.pieces(text, size))
        assert (" " if drop else "").join(pieces) == text
        assert all(len(p) >= size for p in pieces[:-1])
        assert len(pieces) == (1 if size >= len(text) else len(pieces)) and (len(pieces) > 1) == (size < len(text))
        for before, after in itertools.pairwise(pieces):  # each cut: a letter, the space, a letter
            assert before[-1].isalpha()
            assert after[0].isalpha() if drop else (after[0] == " " and after[1].isalpha())
    # within a span, the look-arounds stop at the span's ends
    assert list(rule.pieces("xx ab cd yy", 1, 3, 8)) == (["ab", "cd"] if drop else ["ab", " cd"])


def test_which_tokenizers_are_cut(
    data: dict[str, Path], sp_models: dict[str, Path], gpt2_files: tuple[Path, Path], hf_dirs: dict[str, Path]
) -> None:
    """The structural property: a rule where cutting is proven safe, one whole piece (and why) elsewhere."""
    for name, (_, drop) in SP_MODELS.items():
        for cls in (GPTSentencePieceTokenizer, SentencePieceTokenizer):
            tok = cls(sp_models[name])
            if drop is None:
                assert tok.cut_rule is None and tok.whole_reason, name
            else:
                assert tok.cut_rule is not None and tok.cut_rule.drop == drop, (name, tok.whole_reason)
    unigram = GPTSentencePieceTokenizer(sp_models["unigram-identity"])
    assert "unigram" in unigram.whole_reason and "float32" in unigram.whole_reason
    assert "character map" in GPTSentencePieceTokenizer(sp_models["bpe-nmt-nfkc"]).whole_reason
    assert "span a space" in GPTSentencePieceTokenizer(sp_models["bpe-no-split-by-whitespace"]).whole_reason
    assert GPTSentencePieceTokenizer(data["model"]).cut_rule is not None  # train_tokenizer.py's defaults
    assert NullTokenizer(10).cut_rule is not None and GPT2BPETokenizer(*gpt2_files).cut_rule is not None
    for kind, cut in (("gpt2", True), ("llama3", True), ("wordlevel", False)):
        hf = HuggingFaceTokenizer(hf_dirs[kind])
        assert (hf.cut_rule is not None) == cut, (kind, hf.whole_reason)
    assert "pre-tokeniser" in HuggingFaceTokenizer(hf_dirs["wordlevel"]).whole_reason


def test_a_long_text_is_tokenized_in_many_pieces(data: dict[str, Path], texts: list[str]) -> None:
    text = "\n\n".join(texts)[: 8 * PIECE_CHARS]
    tok = GPTSentencePieceTokenizer(data["model"])
    parts = list(tok.tokenize_pieces(text))
    assert len(parts) >= 7 and np.array_equal(np.concatenate(parts), tok.tokenize(text))
    unigram_like = NullTokenizer(10)
    unigram_like.cut_rule = None  # a tokenizer without a rule: one piece, the whole text
    assert len(list(unigram_like.tokenize_pieces("1 2 3 " * 100_000 + "4", 8))) == 1


# ------------------------------------------------------------------ equality, property-based
@pytest.mark.parametrize("name", sorted(SP_MODELS))
@pytest.mark.parametrize("cls", [GPTSentencePieceTokenizer, SentencePieceTokenizer], ids=lambda c: c.type_name)
@SETTINGS
@given(text=TEXTS, piece_chars=PIECE_SIZES)
def test_sentencepiece_pieces_equal_whole(
    sp_models: dict[str, Path], name: str, cls: type, text: str, piece_chars: int
) -> None:
    assert_pieces_equal_whole(_cached(cls, sp_models[name]), text, piece_chars)


@SETTINGS
@given(text=TEXTS, piece_chars=PIECE_SIZES)
def test_gpt2_pieces_equal_whole(gpt2_files: tuple[Path, Path], text: str, piece_chars: int) -> None:
    assert_pieces_equal_whole(_cached(GPT2BPETokenizer, *gpt2_files), text, piece_chars)


@SETTINGS
@given(
    text=st.lists(st.sampled_from(["1", "23", "999", " ", "  ", "1000", "x", "-1", "\n"]), max_size=40).map("".join),
    piece_chars=PIECE_SIZES,
)
def test_null_pieces_equal_whole(text: str, piece_chars: int) -> None:
    assert_pieces_equal_whole(NullTokenizer(1000), text, piece_chars)


@pytest.mark.parametrize("backend", ["tokenizers", "transformers"])
@pytest.mark.parametrize("kind", ["gpt2", "llama3", "wordlevel"])
@SETTINGS
@given(text=TEXTS, piece_chars=PIECE_SIZES)
def test_huggingface_pieces_equal_whole(
    hf_dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch, backend: str, kind: str, text: str, piece_chars: int
) -> None:
    _without_transformers(monkeypatch, backend)
    assert_pieces_equal_whole(_cached(HuggingFaceTokenizer, hf_dirs[kind], backend), text, piece_chars)


_TOKENIZERS: dict[tuple[Any, ...], Tokenizer] = {}


def _cached(cls: type, *args: Any) -> Any:
    """One tokenizer per class and files for all examples (``args`` may carry a backend name, which
    only keys the cache: the backend is chosen when the tokenizer is built)."""
    key = (cls, *args)
    if key not in _TOKENIZERS:
        _TOKENIZERS[key] = cls(*[a for a in args if isinstance(a, Path)])
    return _TOKENIZERS[key]


def test_long_real_text_pieces_equal_whole(
    data: dict[str, Path], texts: list[str], sp_models: dict[str, Path], gpt2_files: tuple[Path, Path]
) -> None:
    """Real text, default piece size, a document longer than LONG_DOCUMENT_CHARS."""
    text = "\n\n".join(texts)[: LONG_DOCUMENT_CHARS + 10_000]
    for tok in (
        GPTSentencePieceTokenizer(data["model"]),
        SentencePieceTokenizer(data["model"]),
        *(GPTSentencePieceTokenizer(m) for m in sp_models.values()),
        GPT2BPETokenizer(*gpt2_files),
    ):
        assert_pieces_equal_whole(tok, text, PIECE_CHARS)


def test_patterns_are_the_ones_tokenizer_json_files_carry() -> None:
    """The HF rule recognises a Split pre-tokeniser by its exact pattern text."""
    assert GPT2_PATTERN.startswith("'s|'t|") and LLAMA3_PATTERN.startswith("(?i:'s|'t|")
    assert r"\p{N}{1,3}" in LLAMA3_PATTERN and LLAMA3_PATTERN.endswith(r"\s+(?!\S)|\s+")


# ------------------------------------------------------------------ the tool: same bytes as whole documents
def _long_corpus(texts: list[str], path: Path, numbers: bool = False) -> list[str]:
    """Short documents around one longer than LONG_DOCUMENT_CHARS (special strings inside) and an empty
    one; or documents of numbers (for the NullTokenizer)."""
    if numbers:
        long_text = " ".join(str(i % 997) for i in range(LONG_DOCUMENT_CHARS // 3))
        short = [" ".join(str(j) for j in range(i, i + 9)) for i in range(20)]
    else:
        long_text = "<EOD> " + "\n\n".join(texts)[: LONG_DOCUMENT_CHARS + 5000] + " </s><s>  tail"
        short = texts[:20]
    docs = [*short[:10], long_text, *([] if numbers else [""]), *short[10:]]  # "" is no number list
    lines = [json.dumps({"text": d}) for d in docs]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert len(long_text) > LONG_DOCUMENT_CHARS
    return lines


@pytest.mark.parametrize(
    "tokenizer_type",
    [
        "GPTSentencePieceTokenizer",
        "SentencePieceTokenizer",
        "GPT2BPETokenizer",
        "HuggingFaceTokenizer",
        "NullTokenizer",
    ],
)
def test_tool_writes_the_bytes_of_whole_document_tokenization(
    data: dict[str, Path],
    texts: list[str],
    gpt2_files: tuple[Path, Path],
    hf_dirs: dict[str, Path],
    tmp_path: Path,
    tokenizer_type: str,
) -> None:
    inp = tmp_path / "in.jsonl"
    lines = _long_corpus(texts, inp, numbers=tokenizer_type == "NullTokenizer")
    flags = {
        "GPTSentencePieceTokenizer": ["--tokenizer-model", str(data["model"])],
        "SentencePieceTokenizer": ["--tokenizer-model", str(data["model"])],
        "GPT2BPETokenizer": ["--vocab-file", str(gpt2_files[0]), "--merge-file", str(gpt2_files[1])],
        "HuggingFaceTokenizer": ["--tokenizer-model", str(hf_dirs["gpt2"])],
        "NullTokenizer": ["--vocab-size", "1000"],
    }[tokenizer_type]
    from megatron_ext.data.tokenizers import build_tokenizer

    tok = build_tokenizer(
        tokenizer_type,
        tokenizer_model=flags[1] if flags[0] == "--tokenizer-model" else None,
        vocab_file=flags[1] if flags[0] == "--vocab-file" else None,
        merge_file=flags[3] if flags[0] == "--vocab-file" else None,
        vocab_size=1000 if tokenizer_type == "NullTokenizer" else None,
    )
    assert tok.cut_rule is not None
    ref = reference_dataset(lines, tok, tmp_path / "ref", append_eod=True)
    tool("preprocess_data", "--input", str(inp), "--output-prefix", str(tmp_path / "ours"), "--tokenizer-type",
         tokenizer_type, *flags, "--append-eod", "--workers", "2", "--chunk-mb", "0.01", "--quiet")  # fmt: skip
    assert same_files(ref["text"], tmp_path / "ours_text_document")


# ------------------------------------------------------------------ memory
_MEASURE = """
import resource, subprocess, sys
subprocess.run(sys.argv[1:], check=True)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
"""


def _peak_rss_mb(inp: Path, prefix: Path, model: Path) -> float:
    """Peak RSS of the tool's largest process (parent or worker), in MB, run in a fresh process."""
    env = _env()
    cmd = [sys.executable, str(REPO / "tools" / "preprocess_data.py"), "--input", str(inp), "--output-prefix",
           str(prefix), "--tokenizer-type", "GPTSentencePieceTokenizer", "--tokenizer-model", str(model),
           "--workers", "1", "--quiet"]  # fmt: skip
    out = waits.run([sys.executable, "-c", _MEASURE, *cmd], timeout=RUN_S, check=True, env=env)
    return int(out.stdout.split()[-1]) / 1e3


def test_memory_of_a_long_document_stays_near_that_of_its_text(
    data: dict[str, Path], texts: list[str], tmp_path: Path
) -> None:
    """A 4 MB document of ASCII text against the same text as ordinary documents: tokenized whole, the
    tokenizer alone took some 40 bytes per character (160 MB more than the control); in pieces the
    difference is the document's text and ids, a few bytes per character."""
    ascii_texts = [t.encode("ascii", "ignore").decode() for t in texts]
    long_text = ("\n\n".join(ascii_texts) * 8)[:4_000_000]
    (tmp_path / "long.jsonl").write_text(json.dumps({"text": long_text}) + "\n")
    with open(tmp_path / "control.jsonl", "w") as f:
        for i in range(0, len(long_text), 20_000):
            f.write(json.dumps({"text": long_text[i : i + 20_000]}) + "\n")
    control = _peak_rss_mb(tmp_path / "control.jsonl", tmp_path / "c", data["model"])
    long = _peak_rss_mb(tmp_path / "long.jsonl", tmp_path / "l", data["model"])
    assert long - control < 60, (long, control)


@pytest.mark.parametrize("text", ["11111111111110001000", "1 11111111111110001000 2", "1  2", "1 x 2", "-1 5"])
def test_null_pieces_fail_alike_on_a_single_fault(text: str) -> None:
    for piece_chars in (1, 2, 7):  # one fault: the same outcome, error message included
        assert_pieces_equal_whole(NullTokenizer(1000), text, piece_chars)

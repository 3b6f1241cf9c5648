r"""Tokenizers with Megatron-LM's ``--tokenizer-type`` names and semantics.

One module for the preprocessing tools and for training, so that the token
ids written into a dataset and the vocabulary the model is built with can never
disagree. Each class but NullTokenizer (0.19's) reproduces the *legacy* tokenizer of
Megatron-LM's ``megatron/training/tokenizer/tokenizer.py`` (before 0.17; docs/data.md: where
0.19's differ): the same ids, the same ``vocab_size`` (unpadded) and the same ``eod``:

=========================  =====================================================  ==========================
``--tokenizer-type``       vocabulary                                             ``eod``
=========================  =====================================================  ==========================
SentencePieceTokenizer     model pieces + ``<CLS> <SEP> <EOD> <MASK>`` and pad/    ``<EOD>``
                           bos/eos pieces when missing (appended in that order)
GPTSentencePieceTokenizer  model pieces                                           the model's eos id
GPT2BPETokenizer           ``vocab.json`` (byte-level BPE, ``merges.txt``)         ``<|endoftext|>``
HuggingFaceTokenizer       ``len(tokenizer)`` of a local directory                 its eos token
NullTokenizer              ``--vocab-size`` (ids are given as text)               ``--vocab-size`` - 1
=========================  =====================================================  ==========================

Besides ``tokenize(text)`` every tokenizer has ``tokenize_batch(texts)``,
which encodes many texts in one native call where the library allows it
(SentencePiece's batch encode, Hugging Face ``encode_batch``) and returns one
int32 array per text, and ``tokenize_pieces(text)``, which encodes a long text
a piece at a time so that the tokenizer's working memory does not grow with
it, with exactly the ids of ``tokenize(text)``.

Where a long text may be cut, for each tokenizer (its :attr:`Tokenizer.cut_rule`,
or the reason in :attr:`Tokenizer.whole_reason` that it is tokenized whole), is
decided and argued in :mod:`megatron_ext.data.cut_rules`.
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import re
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from megatron_ext.config.tokenizer_types import TOKENIZER_TYPES
from megatron_ext.data.cut_rules import (
    CutRule,
    gpt2_cut_rule,
    gpt2_pattern,
    huggingface_cut_rule,
    sentencepiece_cut_rule,
)
from megatron_ext.data.tiktokenizer import TikTokenizer
from megatron_ext.data.tokenizer_base import PIECE_CHARS, Tokenizer, TokenizerError


# --------------------------------------------------------------------- null
class NullTokenizer(Tokenizer):
    """Ids written as text ("5 17 3"), as Megatron-Core 0.19's (Megatron-LM 0.17 on): ``--vocab-size`` ids, the
    last the end of document unless ``--null-tokenizer-eod-id`` (before 0.17: an id added after them); ``pad``
    -1 (GPTDataset's own) unless ``--null-tokenizer-pad-id``."""

    type_name = "NullTokenizer"
    # ``text.split(" ")`` of ``A + " " + B`` is the split of A followed by that of B.
    cut_rule: CutRule | None = CutRule(re.compile(" "), drop=True)
    whole_reason = ""

    def __init__(self, vocab_size: int, *, eod_id: int | None = None, pad_id: int = -1) -> None:
        if vocab_size is None or int(vocab_size) <= 0:
            raise TokenizerError("NullTokenizer needs --vocab-size N (a positive number of ids)")
        self._size = int(vocab_size)
        self._eod = self._size - 1 if eod_id is None else int(eod_id)
        if not 0 <= self._eod < self._size:
            raise TokenizerError(f"--null-tokenizer-eod-id {self._eod} is not an id of the vocabulary (0 to "
                                 f"{self._size - 1}, --vocab-size {self._size}); give an id below --vocab-size")  # fmt: skip
        self._pad = int(pad_id)

    @property
    def vocab_size(self) -> int:
        return self._size

    @property
    def eod(self) -> int:
        return self._eod

    @property
    def pad(self) -> int:
        return self._pad

    def tokenize(self, text: str) -> list[int]:
        return [int(x) for x in text.split(" ")]

    def detokenize(self, ids: Sequence[int]) -> str:
        return " ".join(str(int(x)) for x in ids)


# ------------------------------------------------------------ sentencepiece
class _SentencePieceBase(Tokenizer):
    def __init__(self, model_file: str | os.PathLike[str]) -> None:
        path = Path(model_file)
        if not path.is_file():
            raise TokenizerError(
                f"SentencePiece model {path} does not exist; train one with tools/train_tokenizer.py "
                "or pass --tokenizer-model PATH.model"
            )
        import sentencepiece

        try:
            self.sp = sentencepiece.SentencePieceProcessor(model_file=str(path))
        except (RuntimeError, OSError) as exc:
            raise TokenizerError(f"{path} is not a SentencePiece model: {exc}") from exc
        self.model_file = str(path.resolve())
        # Piece ↔ id, as Megatron-LM builds it (later duplicates win, like its dict).
        self._vocab: dict[str, int] = {self.sp.id_to_piece(i): i for i in range(len(self.sp))}
        self.cut_rule, self.whole_reason = sentencepiece_cut_rule(self.sp, list(self._vocab))

    @property
    def definition_files(self) -> list[Path]:
        return [Path(self.model_file)]

    @property
    def unique_identifiers(self) -> OrderedDict[str, Any]:
        ids = super().unique_identifiers
        ids["model_file"] = self.model_file
        return ids

    def _encode_plain(self, texts: list[str]) -> list[np.ndarray]:
        # One native call for the batch; returns int32 buffers (no Python int lists).
        return self.sp.encode(texts, return_type="numpy", num_threads=1)


class GPTSentencePieceTokenizer(_SentencePieceBase):
    """Megatron-LM's ``_GPTSentencePieceTokenizer``: plain SentencePiece ids, eod = eos."""

    type_name = "GPTSentencePieceTokenizer"

    def __init__(self, model_file: str | os.PathLike[str]) -> None:
        super().__init__(model_file)
        if self.sp.eos_id() < 0:
            raise TokenizerError(
                f"{model_file} has no end-of-sentence piece (eos_id=-1); GPTSentencePieceTokenizer uses eos as "
                "end of document. Train with an eos piece (tools/train_tokenizer.py does) or use "
                "SentencePieceTokenizer, which adds <EOD>"
            )

    @property
    def vocab_size(self) -> int:
        return len(self._vocab)

    @property
    def eod(self) -> int:
        return int(self.sp.eos_id())

    @property
    def pad(self) -> int:
        return int(self.sp.pad_id())

    def tokenize(self, text: str) -> list[int]:
        return self.sp.encode(text)

    def tokenize_batch(self, texts: list[str]) -> list[np.ndarray]:
        return self._encode_plain(texts)

    def detokenize(self, ids: Sequence[int]) -> str:
        return self.sp.decode([int(i) for i in ids])


class Llama2Tokenizer(GPTSentencePieceTokenizer):
    """Megatron-LM's ``_Llama2Tokenizer``: the SentencePiece ids after the model's beginning-of-sequence id (its
    ``tokenize(s, bos=True, eos=False)``, so every document starts with it), eod = eos."""

    type_name = "Llama2Tokenizer"

    def __init__(self, model_file: str | os.PathLike[str]) -> None:
        super().__init__(model_file)
        if self.sp.bos_id() < 0:
            raise TokenizerError(
                f"{model_file} has no beginning-of-sentence piece (bos_id=-1), which Llama2Tokenizer starts every "
                "text with; use GPTSentencePieceTokenizer for plain ids"
            )

    @property
    def bos(self) -> int:
        return int(self.sp.bos_id())

    def tokenize(self, text: str) -> list[int]:
        return [self.bos, *self.sp.encode(text)]

    def tokenize_batch(self, texts: list[str]) -> list[np.ndarray]:
        bos = np.asarray([self.bos], dtype=np.int32)
        return [np.concatenate((bos, ids)) for ids in self._encode_plain(texts)]

    def tokenize_pieces(self, text: str, piece_chars: int = PIECE_CHARS) -> Iterator[np.ndarray]:
        if self.cut_rule is None:
            yield np.asarray(self.tokenize(text), dtype=np.int32)
            return
        yield np.asarray([self.bos], dtype=np.int32)  # once, before the first piece
        for piece in self.cut_rule.pieces(text, piece_chars):
            yield self._encode_plain([piece])[0]


class SentencePieceTokenizer(_SentencePieceBase):
    """Megatron-LM's ``_SentencePieceTokenizer``.

    Adds ``<CLS>``, ``<SEP>``, ``<EOD>``, ``<MASK>`` and the pad, bos and eos
    pieces (``<PAD>``/``<BOS>``/``<EOS>`` when the model has none) after the
    model's pieces when they are missing, and encodes every occurrence of one
    of those strings in the text as that single id.
    """

    type_name = "SentencePieceTokenizer"

    def __init__(self, model_file: str | os.PathLike[str]) -> None:
        super().__init__(model_file)
        self._inv_vocab = {i: p for p, i in self._vocab.items()}
        self._special: dict[str, int] = {}

        def add(piece: str) -> int:
            if piece not in self._vocab:
                new_id = len(self._vocab)
                self._vocab[piece] = new_id
                self._inv_vocab[new_id] = piece
            self._special[piece] = self._vocab[piece]
            return self._vocab[piece]

        self._cls, self._sep, self._eod, self._mask = (add(p) for p in ("<CLS>", "<SEP>", "<EOD>", "<MASK>"))
        self._pad = add(self._piece_or(self.sp.pad_id(), "<PAD>"))
        self._bos = add(self._piece_or(self.sp.bos_id(), "<BOS>"))
        self._eos = add(self._piece_or(self.sp.eos_id(), "<EOS>"))
        self._inv_special = {i: p for p, i in self._special.items()}
        # Leftmost match; at equal positions the earlier-added piece wins (as Megatron-LM's min()).
        self._special_re = re.compile("|".join(re.escape(p) for p in self._special))

    def _piece_or(self, piece_id: int, default: str) -> str:
        try:
            return self.sp.id_to_piece(piece_id)
        except IndexError:
            return default

    @property
    def vocab_size(self) -> int:
        return len(self._vocab)

    @property
    def eod(self) -> int:
        return self._eod

    @property
    def pad(self) -> int:
        return self._pad

    @property
    def eos(self) -> int:
        return self._eos

    def _tokenize_with_specials(self, text: str) -> list[int]:
        ids: list[int] = []
        pos = 0
        for match in self._special_re.finditer(text):
            ids.extend(self.sp.encode(text[pos : match.start()]))
            ids.append(self._special[match.group()])
            pos = match.end()
        ids.extend(self.sp.encode(text[pos:]))
        return ids

    def tokenize(self, text: str) -> list[int]:
        if self._special_re.search(text) is None:
            return self.sp.encode(text)
        return self._tokenize_with_specials(text)

    def tokenize_batch(self, texts: list[str]) -> list[np.ndarray]:
        out = self._encode_plain(texts)
        for i, text in enumerate(texts):
            if self._special_re.search(text) is not None:
                out[i] = np.asarray(self._tokenize_with_specials(text), dtype=np.int32)
        return out

    def tokenize_pieces(self, text: str, piece_chars: int = PIECE_CHARS) -> Iterator[np.ndarray]:
        """As :meth:`Tokenizer.tokenize_pieces`: the text between special strings is encoded alone (as
        :meth:`tokenize` does) and cut only within."""
        if self.cut_rule is None:
            yield from super().tokenize_pieces(text, piece_chars)
            return
        pos = 0
        for match in self._special_re.finditer(text):
            for piece in self.cut_rule.pieces(text, piece_chars, pos, match.start()):
                yield self._encode_plain([piece])[0]
            yield np.array([self._special[match.group()]], dtype=np.int32)
            pos = match.end()
        for piece in self.cut_rule.pieces(text, piece_chars, pos):
            yield self._encode_plain([piece])[0]

    def detokenize(self, ids: Sequence[int]) -> str:
        # Megatron-LM's rule: special pieces are joined with single spaces around them.
        text = ""
        last = 0
        ids = [int(i) for i in ids]
        for i, token in enumerate(ids):
            if token in self._inv_special:
                text += self.sp.decode(ids[last:i]) + " " + self._inv_special[token] + " "
                last = i + 1
        return text + self.sp.decode(ids[last:])


# ------------------------------------------------------------------- GPT-2
@functools.lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from bytes to printable characters.

    Printable Latin-1 bytes map to themselves; the other 68 bytes to U+0100 onwards,
    so that BPE never sees whitespace or control characters.
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    mapping = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


class GPT2BPETokenizer(Tokenizer):
    """Megatron-LM's ``_GPT2BPETokenizer``: byte-level BPE from ``vocab.json`` + ``merges.txt``.

    Megatron-Core 0.16.1 has no byte-level BPE of its own (its GPT-2 path goes
    through Hugging Face ``transformers``), so this is a direct implementation
    of the GPT-2 algorithm: split with GPT-2's pattern, map each piece's UTF-8
    bytes to characters, then apply merges by rank until none applies. Unknown
    pieces get id 0 and ``<|endoftext|>`` in text is not special, both as in
    Megatron-LM.
    """

    type_name = "GPT2BPETokenizer"

    def __init__(self, vocab_file: str | os.PathLike[str], merge_file: str | os.PathLike[str]) -> None:
        for flag, path in (("--vocab-file", vocab_file), ("--merge-file", merge_file)):
            if path is None or not Path(path).is_file():
                raise TokenizerError(f"GPT2BPETokenizer needs {flag} (a GPT-2 vocab.json / merges.txt); got {path}")
        with open(vocab_file, encoding="utf-8") as f:
            self.encoder: dict[str, int] = json.load(f)
        self.decoder = {v: k for k, v in self.encoder.items()}
        with open(merge_file, encoding="utf-8") as f:
            # As Megatron-LM: skip the "#version" line and whatever follows the last newline.
            lines = f.read().split("\n")[1:-1]
        self.bpe_ranks = {tuple(line.split()): rank for rank, line in enumerate(lines)}
        if "<|endoftext|>" not in self.encoder:
            raise TokenizerError(f"{vocab_file} has no <|endoftext|> token (GPT2BPETokenizer's end of document)")
        self._eod = self.encoder["<|endoftext|>"]
        self.byte_encoder = bytes_to_unicode()
        self.byte_decoder = {v: k for k, v in self.byte_encoder.items()}
        self.files = (str(Path(vocab_file).resolve()), str(Path(merge_file).resolve()))
        self._cache: dict[str, list[int]] = {}
        self.cut_rule, self.whole_reason = gpt2_cut_rule(), ""

    @property
    def vocab_size(self) -> int:
        return len(self.encoder)

    @property
    def eod(self) -> int:
        return self._eod

    @property
    def definition_files(self) -> list[Path]:
        return [Path(f) for f in self.files]

    @property
    def unique_identifiers(self) -> OrderedDict[str, Any]:
        ids = super().unique_identifiers
        ids["vocab_file"], ids["merge_file"] = self.files
        return ids

    def _bpe(self, token: str) -> list[str]:
        word = list(token)
        if len(word) < 2:
            return word
        ranks = self.bpe_ranks
        while len(word) > 1:
            # The lowest-ranked pair present; ties cannot happen (ranks are unique).
            best = min(itertools.pairwise(word), key=lambda pair: ranks.get(pair, float("inf")))
            if best not in ranks:
                break
            first, second = best
            merged: list[str] = []
            i = 0
            while i < len(word):
                if i < len(word) - 1 and word[i] == first and word[i + 1] == second:
                    merged.append(first + second)
                    i += 2
                else:
                    merged.append(word[i])
                    i += 1
            word = merged
        return word

    def _ids_of_piece(self, piece: str) -> list[int]:
        cached = self._cache.get(piece)
        if cached is None:
            mapped = "".join(self.byte_encoder[b] for b in piece.encode("utf-8"))
            cached = [self.encoder.get(t, 0) for t in self._bpe(mapped)]
            if len(self._cache) < 500_000:
                self._cache[piece] = cached
        return cached

    def tokenize(self, text: str) -> list[int]:
        ids: list[int] = []
        for piece in gpt2_pattern().findall(text):
            ids.extend(self._ids_of_piece(piece))
        return ids

    def detokenize(self, ids: Sequence[int]) -> str:
        text = "".join(self.decoder[int(i)] for i in ids)
        return bytearray(self.byte_decoder[c] for c in text).decode("utf-8", errors="replace")


# ------------------------------------------------------------ Hugging Face
class HuggingFaceTokenizer(Tokenizer):
    """Megatron-LM's ``_HuggingFaceTokenizer`` for a local directory (nothing is downloaded).

    Uses ``transformers.AutoTokenizer`` when installed (exactly Megatron-LM's
    path); otherwise the ``tokenizers`` library on the directory's
    ``tokenizer.json`` with the eos token of ``tokenizer_config.json`` or
    ``special_tokens_map.json``. Both add the tokenizer's special tokens
    (e.g. a BOS) as ``transformers``' ``__call__`` does. Neither is a
    dependency of this project: install one to use this type.
    """

    type_name = "HuggingFaceTokenizer"

    def __init__(self, path: str | os.PathLike[str]) -> None:
        directory = Path(path) if path is not None else None
        if directory is None or not directory.is_dir():
            raise TokenizerError(
                f"HuggingFaceTokenizer needs --tokenizer-model DIR, a local directory with tokenizer.json "
                f"(nothing is downloaded); got {path}"
            )
        self.directory = str(directory.resolve())
        self._hf: Any = None
        self._fast: Any = None
        transformers: Any
        try:
            import transformers
        except ImportError:
            transformers = None
        if transformers is not None:
            self._hf = transformers.AutoTokenizer.from_pretrained(self.directory, local_files_only=True)
            self._size = len(self._hf)
            eos = self._hf.eos_token_id
        else:
            try:
                import tokenizers
            except ImportError as exc:
                raise TokenizerError(
                    "HuggingFaceTokenizer needs `transformers` or `tokenizers` (neither is installed): "
                    "pip install tokenizers"
                ) from exc
            file = directory / "tokenizer.json"
            if not file.is_file():
                raise TokenizerError(f"{directory} has no tokenizer.json")
            self._fast = tokenizers.Tokenizer.from_file(str(file))
            self._size = self._fast.get_vocab_size(with_added_tokens=True)
            eos_token = self._eos_token_from_config(directory)
            eos = self._fast.token_to_id(eos_token) if eos_token is not None else None
        if eos is None:
            raise TokenizerError(
                f"{directory} defines no eos token (HuggingFaceTokenizer's end of document); set eos_token "
                "in tokenizer_config.json"
            )
        self._eod = int(eos)
        self._prefix: list[int] = []
        self._suffix: list[int] = []
        backend = self._fast if self._fast is not None else getattr(self._hf, "backend_tokenizer", None)
        if backend is None:
            self.whole_reason = "a slow (Python) Hugging Face tokenizer, without a tokenizer.json pipeline"
        else:
            self.cut_rule, self.whole_reason = huggingface_cut_rule(json.loads(backend.to_str()))
        if self.cut_rule is not None:
            wrap = self._special_wrap()
            if wrap is None:
                self.cut_rule = None
                self.whole_reason = "its post-processor does not just add the same special tokens around every text"
            else:
                self._prefix, self._suffix = wrap

    def _encode(self, texts: list[str], special: bool) -> list[list[int]]:
        """Ids of ``texts`` (one batch call), with the post-processor's special tokens or without."""
        if self._hf is not None:
            return [list(ids) for ids in self._hf(texts, add_special_tokens=special).input_ids]
        return [e.ids for e in self._fast.encode_batch(texts, add_special_tokens=special)]

    def _special_wrap(self) -> tuple[list[int], list[int]] | None:
        """(ids before, ids after) that the post-processor puts around any text, found on two probes;
        None when they differ or are not found."""
        found = set()
        probes = ["a", "the 2 words"]
        for full, plain in zip(self._encode(probes, True), self._encode(probes, False), strict=True):
            starts = [i for i in range(len(full) - len(plain) + 1) if plain and full[i : i + len(plain)] == plain]
            if len(starts) != 1:
                return None
            found.add((tuple(full[: starts[0]]), tuple(full[starts[0] + len(plain) :])))
        if len(found) != 1:
            return None
        before, after = found.pop()
        return list(before), list(after)

    def token_id(self, token: str) -> int | None:
        """The id of ``token`` as one token of the vocabulary (an added special token included), or None."""
        if self._hf is not None:
            found = self._hf.convert_tokens_to_ids(token)
            return int(found) if found is not None and self._hf.convert_ids_to_tokens(found) == token else None
        found = self._fast.token_to_id(token)
        return int(found) if found is not None else None

    @staticmethod
    def _eos_token_from_config(directory: Path) -> str | None:
        for name in ("tokenizer_config.json", "special_tokens_map.json"):
            file = directory / name
            if file.is_file():
                eos = json.loads(file.read_text(encoding="utf-8")).get("eos_token")
                if isinstance(eos, dict):
                    eos = eos.get("content")
                if eos:
                    return str(eos)
        return None

    @property
    def vocab_size(self) -> int:
        return self._size

    @property
    def eod(self) -> int:
        return self._eod

    DEFINITION_FILES = (
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "added_tokens.json",
        "tokenizer.model",
        "vocab.json",
        "merges.txt",
    )
    """The files a ``transformers`` tokenizer directory is made of (whichever it has): what decides its ids,
    and what an export copies."""

    @property
    def definition_files(self) -> list[Path]:
        return [Path(self.directory) / n for n in self.DEFINITION_FILES if (Path(self.directory) / n).is_file()]

    @property
    def unique_identifiers(self) -> OrderedDict[str, Any]:
        ids = super().unique_identifiers
        ids["directory"] = self.directory
        return ids

    def tokenize(self, text: str) -> list[int]:
        if self._hf is not None:
            return list(self._hf(text).input_ids)
        return list(self._fast.encode(text).ids)

    def tokenize_batch(self, texts: list[str]) -> list[np.ndarray]:
        if self._hf is not None:
            batch = self._hf(texts).input_ids
            return [np.asarray(ids, dtype=np.int32) for ids in batch]
        return [np.asarray(e.ids, dtype=np.int32) for e in self._fast.encode_batch(texts)]

    def tokenize_pieces(self, text: str, piece_chars: int = PIECE_CHARS) -> Iterator[np.ndarray]:
        """As :meth:`Tokenizer.tokenize_pieces`: pieces are encoded without the post-processor's special
        tokens, which are added once, around the whole."""
        if self.cut_rule is None:
            yield from super().tokenize_pieces(text, piece_chars)
            return
        yield np.asarray(self._prefix, dtype=np.int32)
        for piece in self.cut_rule.pieces(text, piece_chars):
            yield np.asarray(self._encode([piece], False)[0], dtype=np.int32)
        yield np.asarray(self._suffix, dtype=np.int32)

    def detokenize(self, ids: Sequence[int]) -> str:
        ids = [int(i) for i in ids]
        if self._hf is not None:
            return str(self._hf.decode(ids))
        return str(self._fast.decode(ids, skip_special_tokens=False))


# ------------------------------------------------------------------ factory
def build_tokenizer(
    tokenizer_type: str,
    *,
    tokenizer_model: str | None = None,
    vocab_file: str | None = None,
    merge_file: str | None = None,
    vocab_size: int | None = None,
    tiktoken_pattern: str | None = None,
    tiktoken_num_special_tokens: int = 1000,
    special_tokens: Sequence[str] | None = None,
    null_tokenizer_eod_id: int | None = None,
    null_tokenizer_pad_id: int = -1,
) -> Tokenizer:
    """The tokenizer Megatron-LM would build for these flags (a clear error if one is missing)."""
    sentencepiece: dict[str, type[_SentencePieceBase]] = {
        "SentencePieceTokenizer": SentencePieceTokenizer,
        "GPTSentencePieceTokenizer": GPTSentencePieceTokenizer,
        "Llama2Tokenizer": Llama2Tokenizer,
    }
    if tokenizer_type in sentencepiece:
        if not tokenizer_model:
            raise TokenizerError(f"--tokenizer-type {tokenizer_type} needs --tokenizer-model PATH.model")
        return sentencepiece[tokenizer_type](tokenizer_model)
    if tokenizer_type == "GPT2BPETokenizer":
        return GPT2BPETokenizer(vocab_file, merge_file)  # type: ignore[arg-type]
    if tokenizer_type == "HuggingFaceTokenizer":
        return HuggingFaceTokenizer(tokenizer_model)  # type: ignore[arg-type]
    if tokenizer_type == "TikTokenizer":
        if not tokenizer_model or not tiktoken_pattern:
            raise TokenizerError(
                "--tokenizer-type TikTokenizer needs --tokenizer-model VOCAB.json and --tiktoken-pattern"
            )
        return TikTokenizer(
            tokenizer_model,
            pattern=tiktoken_pattern,
            vocab_size=vocab_size,
            num_special_tokens=tiktoken_num_special_tokens,
            special_tokens=special_tokens,
        )
    if tokenizer_type == "NullTokenizer":
        if vocab_size is None:
            raise TokenizerError("--tokenizer-type NullTokenizer needs --vocab-size N")
        return NullTokenizer(vocab_size, eod_id=null_tokenizer_eod_id, pad_id=null_tokenizer_pad_id)
    raise TokenizerError(f"unknown --tokenizer-type {tokenizer_type!r}; choose one of {', '.join(TOKENIZER_TYPES)}")

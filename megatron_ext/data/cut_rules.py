r"""Where a text may be cut without changing its ids: one rule per tokenizer family, and the proofs.

This module holds the :class:`CutRule` of each tokenizer family (or the reason
there is none), the pre-tokenisation patterns the rules are proven for
(:data:`GPT2_PATTERN`, :data:`LLAMA3_PATTERN`) and the readers of the settings
a rule depends on (a SentencePiece model's protocol buffer, a Hugging Face
``tokenizer.json`` pipeline). The tokenizers themselves are in
:mod:`megatron_ext.data.tokenizers`.

Where a text may be cut (each tokenizer's
:attr:`~megatron_ext.data.tokenizer_base.Tokenizer.cut_rule`): only where the
tokenizer provably gives the pieces the ids it gives the whole, so that
:meth:`~megatron_ext.data.tokenizer_base.Tokenizer.tokenize_pieces` can encode a
long text a piece at a time with exactly the ids of ``tokenize(text)``.

* ``NullTokenizer``: at any space: ``text.split(" ")`` of ``A + " " + B`` is
  the split of ``A`` followed by the split of ``B``.
* ``GPT2BPETokenizer``: before a space that has a non-space character on each
  side (``\S``, by the same ``regex`` tables as the pattern). BPE merges only
  within one match of GPT-2's pattern, and the pattern cannot match across
  such a place: every alternative that takes a non-space character stops
  before a space, the one at the space takes it with the characters after
  it (`` ?\p{L}+``, `` ?\p{N}+`` or `` ?[^\s\p{L}\p{N}]+``), and the
  pattern has no look-behind and no look-ahead past a whitespace run, so the
  matches before the place do not depend on what follows it.
* SentencePiece BPE models (both SentencePiece types) with the identity
  normaliser (no character map; a map such as NFKC can rewrite characters
  around a space), whitespace escaped as ``▁`` and not a suffix, and a
  vocabulary in which ``▁`` begins a piece or the piece is all ``▁``: at a
  space between two characters that are neither a space nor ``▁``. The
  normalised text of the whole is then the normalised pieces put together
  (the dummy-prefix ``▁`` of the next piece stands for the dropped space;
  without a dummy prefix the space begins the next piece, which needs
  ``remove_extra_whitespaces`` off), no piece of the vocabulary spans the
  ``▁`` (so no merge does), and BPE merges by piece score, ties left first,
  so the merges on each side happen in the same order alone as together.
  ``SentencePieceTokenizer`` first splits at its special strings, as
  ``tokenize`` does, and cuts only between them.
* ``HuggingFaceTokenizer`` (a fast tokenizer) without a normaliser, whose
  pre-tokeniser is byte-level with GPT-2's pattern, or GPT-2's or Llama 3's
  pattern as an isolated split before a byte-level step, a BPE model without
  dropout, and no added token that contains a space or strips the
  whitespace after it: before a space between two ASCII letters or digits
  (the same argument as GPT-2's, for both patterns; ASCII, so the pattern
  engine's Unicode tables do not matter). The model encodes each
  pre-tokenised word alone, so words encoded in pieces are the same; the
  special tokens of its post-processor (e.g. a BOS) are added once, around
  the whole.

Everywhere else a long text is tokenized whole (one piece), with the reason in
:attr:`~megatron_ext.data.tokenizer_base.Tokenizer.whole_reason`: SentencePiece
unigram models (the Viterbi search adds float32 path scores from the start of
the text, so the choice between near-equal segmentations depends on everything
before: cutting changes ids on real text), other SentencePiece normalisers or
model types, and Hugging Face tokenizers with a normaliser or another
pre-tokeniser.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class CutRule:
    """Where a text may be cut so that its pieces, tokenized one by one, give the ids of the whole.

    ``places`` (a compiled ``re``/``regex`` pattern) matches one separator
    character at each such place; the separator is dropped (``drop``) or
    begins the next piece.
    """

    places: Any
    drop: bool

    def pieces(self, text: str, piece_chars: int, start: int = 0, end: int | None = None) -> Iterator[str]:
        """``text[start:end]`` in pieces of at least ``piece_chars`` characters, each ending at the first
        place after that many (the last piece: whatever is left; the whole span if it has no place).
        The span is searched as if it were the whole text (look-arounds stop at its ends)."""
        end = len(text) if end is None else end
        while end - start > piece_chars:
            place = self.places.search(text, start + piece_chars, end)
            if place is None:
                break
            yield text[start : place.start()]
            start = place.end() if self.drop else place.start()
        yield text[start:end]


# ------------------------------------------------------------ sentencepiece
def _varint(data: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, i


def _proto_fields(data: bytes) -> dict[int, Any]:
    """The last value of each field of a serialized protocol buffer message (varints as ints,
    length-delimited fields as bytes). Enough to read a few settings of a SentencePiece model
    without the ``protobuf`` package."""
    fields: dict[int, Any] = {}
    i = 0
    while i < len(data):
        key, i = _varint(data, i)
        number, kind = key >> 3, key & 7
        value: Any
        if kind == 0:
            value, i = _varint(data, i)
        elif kind == 2:
            size, i = _varint(data, i)
            value, i = data[i : i + size], i + size
        elif kind in (1, 5):
            size = 8 if kind == 1 else 4
            value, i = data[i : i + size], i + size
        else:
            raise ValueError(f"unsupported protocol buffer wire type {kind}")
        fields[number] = value
    return fields


_SP_SPACE = "\u2581"  # "▁", SentencePiece's escaped space
_SP_BPE = 2  # TrainerSpec.ModelType


def sentencepiece_cut_rule(sp: Any, pieces: Sequence[str]) -> tuple[CutRule | None, str]:
    """The cut rule for a SentencePiece model (see the module's docstring), or None and why not.

    Reads ``ModelProto.trainer_spec`` (2: model_type 3, treat_whitespace_as_suffix 24) and
    ``normalizer_spec`` (3: precompiled_charsmap 2, add_dummy_prefix 3, remove_extra_whitespaces 4,
    escape_whitespaces 5), with the defaults of ``sentencepiece_model.proto``.
    """
    try:
        model = _proto_fields(sp.serialized_model_proto())
        trainer = _proto_fields(model.get(2, b""))
        normalizer = _proto_fields(model.get(3, b""))
    except (ValueError, IndexError) as exc:
        return None, f"its model file could not be read for its settings ({exc})"
    if trainer.get(3, 1) != _SP_BPE:
        kind = {1: "unigram", 3: "word", 4: "char"}.get(trainer.get(3, 1), "unknown")
        why = (
            "the Viterbi search adds float32 path scores from the start of the text, so the choice between "
            "near-equal segmentations depends on all the text before it"
            if kind == "unigram"
            else "only BPE models are cut"
        )
        return None, f"a SentencePiece {kind} model: {why}"
    if normalizer.get(2, b""):
        return None, "a SentencePiece normaliser with a character map (e.g. NFKC) can rewrite text across a space"
    if not normalizer.get(5, 1) or trainer.get(24, 0):
        return None, "a SentencePiece model that does not escape whitespace as a prefix '▁'"
    dummy_prefix, remove_spaces = bool(normalizer.get(3, 1)), bool(normalizer.get(4, 1))
    if not dummy_prefix and remove_spaces:
        return None, "a SentencePiece model that removes leading spaces without adding a dummy prefix"
    for piece in pieces:
        if " " in piece or (_SP_SPACE in piece[1:] and piece.strip(_SP_SPACE)):
            return None, f"its vocabulary has a piece ({piece!r}) that can span a space"
    if sp.piece_to_id(_SP_SPACE) == sp.unk_id():
        return None, "'▁' is not in its vocabulary (unknown pieces are merged across a cut)"
    places = re.compile(f"(?<=[^ {_SP_SPACE}]) (?=[^ {_SP_SPACE}])")
    return CutRule(places, drop=dummy_prefix), ""


# ------------------------------------------------------------------- GPT-2

# Megatron-LM's (and OpenAI's GPT-2) pre-tokenisation pattern, compiled with the `regex` module as
# Megatron-LM's gpt2_tokenization.py does: \p{L}/\p{N}/\s follow regex's Unicode tables, not the
# interpreter's, so the split (and the ids) do not depend on the Python version.
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


@functools.lru_cache(maxsize=1)
def gpt2_pattern() -> Any:
    """GPT-2's pre-tokenisation pattern, compiled with ``regex`` exactly as Megatron-LM compiles it."""
    import regex

    return regex.compile(GPT2_PATTERN)


@functools.lru_cache(maxsize=1)
def gpt2_cut_rule() -> CutRule:
    """Before a space with a non-space character on each side, ``\\S`` by the tables of ``regex``
    (those of :data:`GPT2_PATTERN`); the space begins the next piece."""
    import regex

    return CutRule(regex.compile(r"(?<=\S) (?=\S)"), drop=False)


# ------------------------------------------------------------ Hugging Face
# Llama 3's pre-tokenisation pattern (tiktoken's cl100k), as its tokenizer.json writes it.
LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"
    r"\s+(?!\S)|\s+"
)
_ASCII_CUT = CutRule(re.compile("(?<=[A-Za-z0-9]) (?=[A-Za-z0-9])"), drop=False)


def _hf_split_pattern(step: dict[str, Any]) -> str | None:
    """The pattern of a ``Split`` pre-tokeniser that isolates its matches, else None."""
    if step.get("type") != "Split" or step.get("behavior") != "Isolated" or step.get("invert"):
        return None
    pattern = step.get("pattern") or {}
    return pattern.get("Regex")


def huggingface_cut_rule(config: dict[str, Any]) -> tuple[CutRule | None, str]:
    """The cut rule for a ``tokenizers`` pipeline (its ``tokenizer.json``), or None and why not."""
    if config.get("normalizer") is not None:
        return None, f"a Hugging Face normaliser ({config['normalizer'].get('type')}) can rewrite text across a space"
    pre = config.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
    kinds = [step.get("type") for step in steps]
    if kinds == ["ByteLevel"] and steps[0].get("use_regex", True):
        pass  # GPT-2's pattern
    elif (
        kinds == ["Split", "ByteLevel"]
        and _hf_split_pattern(steps[0]) in (GPT2_PATTERN, LLAMA3_PATTERN)
        and not steps[1].get("use_regex", True)
    ):
        pass
    else:
        return (
            None,
            f"a Hugging Face pre-tokeniser ({' + '.join(map(str, kinds)) or 'none'}) not known to split at spaces",
        )
    model = config.get("model") or {}
    if model.get("type") != "BPE" or model.get("dropout"):
        return None, f"a Hugging Face {model.get('type')} model{' with dropout' if model.get('dropout') else ''}"
    for token in config.get("added_tokens") or []:
        if " " in token.get("content", "") or token.get("rstrip"):
            return None, f"an added token ({token.get('content')!r}) contains a space or strips the space after it"
    post = config.get("post_processor") or {}
    processors = post.get("processors", []) if post.get("type") == "Sequence" else [post] if post else []
    for processor in processors:
        if processor.get("type") not in ("ByteLevel", "TemplateProcessing", "RobertaProcessing", "BertProcessing"):
            return None, f"a Hugging Face post-processor ({processor.get('type')}) that may do more than add tokens"
    return _ASCII_CUT, ""

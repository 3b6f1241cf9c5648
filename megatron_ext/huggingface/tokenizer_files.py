"""The tokenizer files of a ``transformers`` directory, written from our tokenizer types and read back.

- ``GPTSentencePieceTokenizer`` and ``Llama2Tokenizer``: its SentencePiece model as ``tokenizer.model``, and a
  ``tokenizer.json`` that gives the same ids (``sentencepiece_bpe_json``) with a
  ``PreTrainedTokenizerFast`` config adding no BOS/EOS (ours adds none; Llama2Tokenizer's
  ``tokenizer.json`` puts the BOS id first, as it does). Two differences
  remain: ``transformers`` reads the control pieces' text (``<s>``, ``</s>``) in the input as
  those tokens, where SentencePiece encodes it as characters; and text right after a
  user-defined piece (``--user-defined-symbols``) gets the word-start ``▁`` SentencePiece
  only puts at the start of the text (``transformers`` normalizes the text between added
  tokens piece by piece).
- ``GPT2BPETokenizer``: ``vocab.json`` and ``merges.txt`` with a ``GPT2Tokenizer`` config.
- ``TikTokenizer``: a byte-level BPE ``tokenizer.json`` that gives the same ids (``tiktoken_bpe_json``), the
  vocabulary file of ranks as ``tiktoken_vocab.json`` and its settings in ``tokenizer_config.json``, so that an
  import gives the TikTokenizer flags back. As with SentencePiece, ``transformers`` reads a special token's
  spelling in the input (``</s>``) as that token, where ``tiktoken``'s ``encode_ordinary`` encodes it as text.
- ``HuggingFaceTokenizer``: the tokenizer files of its directory, as they are.

``SentencePieceTokenizer`` (which appends Megatron's own special pieces after the
model's) and ``NullTokenizer`` are exported without tokenizer files, and the note says so.
"""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from megatron_ext.config.data_args import DataArgs
from megatron_ext.data.tiktokenizer import REQUIRED_SPECIAL, TikTokenizer
from megatron_ext.data.tokenizer_base import Tokenizer
from megatron_ext.data.tokenizers import HuggingFaceTokenizer
from megatron_ext.huggingface.architectures import TokenIds

HF_TOKENIZER_FILES = HuggingFaceTokenizer.DEFINITION_FILES
"""The files a ``transformers`` tokenizer is made of (whichever it has)."""

TIKTOKEN_VOCAB = "tiktoken_vocab.json"
"""A TikTokenizer's vocabulary file of ranks (Megatron-LM's format), beside the ``tokenizer.json`` made from it."""
TIKTOKEN_SETTINGS = "megatron_tiktoken"
"""The TikTokenizer flags, in the ``tokenizer_config.json`` we write (transformers ignores the key)."""

SENTENCEPIECE_PLAIN = ("GPTSentencePieceTokenizer", "Llama2Tokenizer")
"""The SentencePiece types whose ids a ``tokenizer.json`` reproduces (Llama2Tokenizer's with a BOS first)."""

GPT2_EOS = "<|endoftext|>"
MARKER = "megatron_tokenizer_type"
"""Our tokenizer type, in the ``tokenizer_config.json`` we write (transformers ignores it): import restores it."""


@dataclass(frozen=True)
class WrittenTokenizer:
    ids: TokenIds
    files: tuple[str, ...]
    note: str
    """What was written, or why nothing was."""


def _json(path: Path, value: dict[str, Any]) -> None:
    path.write_text(json.dumps(value, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def write_tokenizer(tokenizer: Tokenizer, data: DataArgs, directory: Path, *, max_length: int) -> WrittenTokenizer:
    """Write ``tokenizer``'s files (the run's data flags say where its own files are) into ``directory``."""
    kind = data.tokenizer_type
    if kind in SENTENCEPIECE_PLAIN:
        sp: Any = tokenizer.sp  # type: ignore[attr-defined]
        shutil.copyfile(str(data.tokenizer_model), directory / "tokenizer.model")
        spec = sentencepiece_bpe_json(str(data.tokenizer_model))
        if kind == "Llama2Tokenizer":
            spec = with_bos(spec, bos_piece=str(sp.id_to_piece(int(sp.bos_id()))), bos_id=int(sp.bos_id()))
        (directory / "tokenizer.json").write_text(spec, encoding="utf-8")

        def piece(i: int) -> str | None:
            return str(sp.id_to_piece(i)) if i >= 0 else None

        bos = int(sp.bos_id())
        _json(
            directory / "tokenizer_config.json",
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                MARKER: kind,
                "bos_token": piece(bos),
                "eos_token": piece(tokenizer.eod),
                "unk_token": piece(int(sp.unk_id())),
                "clean_up_tokenization_spaces": False,
                "model_max_length": max_length,
            },
        )
        files: tuple[str, ...] = ("tokenizer.model", "tokenizer.json", "tokenizer_config.json")
        bos_note = ", after the beginning-of-sequence id as Llama2Tokenizer" if kind == "Llama2Tokenizer" else ""
        note = f"{kind}: tokenizer.json (the same ids as the SentencePiece model{bos_note}) and tokenizer.model"
        return WrittenTokenizer(TokenIds(bos if bos >= 0 else None, tokenizer.eod), files, note)
    if kind == "GPT2BPETokenizer":
        shutil.copyfile(str(data.vocab_file), directory / "vocab.json")
        shutil.copyfile(str(data.merge_file), directory / "merges.txt")
        _json(
            directory / "tokenizer_config.json",
            {
                "tokenizer_class": "GPT2Tokenizer",
                "bos_token": GPT2_EOS,
                "eos_token": GPT2_EOS,
                "unk_token": GPT2_EOS,
                "add_prefix_space": False,
                "model_max_length": max_length,
            },
        )
        files = ("vocab.json", "merges.txt", "tokenizer_config.json")
        return WrittenTokenizer(TokenIds(tokenizer.eod, tokenizer.eod), files, "GPT-2 BPE vocab.json and merges.txt")
    if kind == "HuggingFaceTokenizer":
        source = Path(str(data.tokenizer_model))
        files = tuple(name for name in HF_TOKENIZER_FILES if (source / name).is_file())
        for name in files:
            shutil.copyfile(source / name, directory / name)
        hf_bos = getattr(getattr(tokenizer, "_hf", None), "bos_token_id", None)
        return WrittenTokenizer(TokenIds(hf_bos, tokenizer.eod), files, f"the tokenizer files of {source}")
    if isinstance(tokenizer, TikTokenizer):
        shutil.copyfile(tokenizer.vocab_file, directory / TIKTOKEN_VOCAB)
        (directory / "tokenizer.json").write_text(tiktoken_bpe_json(tokenizer), encoding="utf-8")
        special = tokenizer.special_tokens
        _json(
            directory / "tokenizer_config.json",
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                MARKER: kind,
                TIKTOKEN_SETTINGS: {
                    "tiktoken_pattern": tokenizer.pattern,
                    "tiktoken_num_special_tokens": tokenizer.num_special_tokens,
                    "tokenizer_special_tokens": [t for t in special if not t.startswith("<SPECIAL_")],
                    "vocab_size": tokenizer.vocab_size,
                },
                "bos_token": special[tokenizer.bos],
                "eos_token": special[tokenizer.eod],
                "unk_token": "<unk>",
                "clean_up_tokenization_spaces": False,
                # Megatron-LM's TikTokenizer encodes "<s>" in a text as ordinary text (tiktoken's
                # encode_ordinary); transformers would otherwise match a special token's text.
                "split_special_tokens": True,
                "model_max_length": max_length,
            },
        )
        files = (TIKTOKEN_VOCAB, "tokenizer.json", "tokenizer_config.json")
        note = f"TikTokenizer: tokenizer.json (the same ids, byte-level BPE) and its ranks as {TIKTOKEN_VOCAB}"
        return WrittenTokenizer(TokenIds(tokenizer.bos, tokenizer.eod), files, note)
    why = {
        "SentencePieceTokenizer": "it appends Megatron's own special pieces after the SentencePiece model's",
    }.get(kind, "it has no vocabulary")
    return WrittenTokenizer(
        TokenIds(None, tokenizer.eod), (), f"no tokenizer files: {kind} has no transformers equivalent ({why})"
    )


ORIGIN_FILES = ("config.json", "generation_config.json")
"""The imported model's own files, kept beside its tokenizer's copy (as in a ``transformers`` directory): an export
of the checkpoint, or of a run continued from it, keeps their fields (a list of end ids, sampling defaults)."""


def tokenizer_directory(data: DataArgs) -> Path | None:
    """The directory of a run's tokenizer files (None for a tokenizer without files)."""
    named = data.tokenizer_model or data.vocab_file
    if named is None:
        return None
    path = Path(str(named))
    return path if path.is_dir() else path.parent


def keep_originals(source: Path, directory: Path) -> None:
    """Copy ``source``'s ``ORIGIN_FILES`` into ``directory`` (an import's ``tokenizer/``, made here if the model
    has no tokenizer)."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in ORIGIN_FILES:
        if (source / name).is_file():
            shutil.copyfile(source / name, directory / name)


def original_files(data: DataArgs, imported: Path, *, model_type: str) -> dict[str, dict[str, Any]]:
    """``ORIGIN_FILES`` that an import kept, by name: beside the run's tokenizer (so a continued run's export
    finds them), else in ``imported`` (the ``tokenizer/`` of a checkpoint imported without a tokenizer). Only a
    ``config.json`` of ``model_type`` makes them the model's originals; otherwise (another model's files beside a
    tokenizer taken from it) there are none."""
    directory = tokenizer_directory(data) or imported
    found = {}
    for name in ORIGIN_FILES:
        if (directory / name).is_file():
            value = json.loads((directory / name).read_text(encoding="utf-8"))
            if isinstance(value, dict):
                found[name] = value
    return found if found.get("config.json", {}).get("model_type") == model_type else {}


TokenizerFlags = dict[str, Any]
"""Tokenizer flags by field name (``DataArgs``'s, and ``vocab_size`` for a tokenizer sized by it), typed."""


def read_tokenizer_flags(directory: Path, copy_to: Path, *, copy: bool = True) -> TokenizerFlags | None:
    """Our tokenizer flags for the tokenizer files of a ``transformers`` directory, after copying them to
    ``copy_to`` (the flags name the copies; ``copy=False``: where the copies would be); None when the directory
    has no tokenizer.

    The type we exported (``MARKER``) comes back; otherwise a ``tokenizer.json`` is a ``HuggingFaceTokenizer``
    (what ``transformers`` itself loads); else a ``tokenizer.model`` is a SentencePiece model with plain ids
    (what ``write_tokenizer`` writes); else ``vocab.json`` with ``merges.txt`` is GPT-2's BPE.
    """
    present = [name for name in (*HF_TOKENIZER_FILES, TIKTOKEN_VOCAB) if (directory / name).is_file()]
    if not present:
        return None
    if copy:
        copy_to.mkdir(parents=True, exist_ok=True)
        for name in present:
            shutil.copyfile(directory / name, copy_to / name)
    config = directory / "tokenizer_config.json"
    settings = json.loads(config.read_text(encoding="utf-8")) if config.is_file() else {}
    ours = settings.get(MARKER)
    if ours == "TikTokenizer" and TIKTOKEN_VOCAB in present:
        tiktoken = settings.get(TIKTOKEN_SETTINGS, {})
        flags: TokenizerFlags = {"tokenizer_type": ours, "tokenizer_model": str(copy_to / TIKTOKEN_VOCAB)}
        special = tuple(tiktoken.get("tokenizer_special_tokens") or REQUIRED_SPECIAL)
        flags.update(
            tiktoken_pattern=tiktoken.get("tiktoken_pattern"),
            vocab_size=tiktoken.get("vocab_size"),
            tiktoken_num_special_tokens=tiktoken.get("tiktoken_num_special_tokens", 1000),
            tokenizer_special_tokens=None if special == REQUIRED_SPECIAL else special,
        )
        return flags
    if ours in SENTENCEPIECE_PLAIN and "tokenizer.model" in present:
        return {"tokenizer_type": ours, "tokenizer_model": str(copy_to / "tokenizer.model")}
    if "tokenizer.json" in present:
        return {"tokenizer_type": "HuggingFaceTokenizer", "tokenizer_model": str(copy_to)}
    if "tokenizer.model" in present:
        return {"tokenizer_type": "GPTSentencePieceTokenizer", "tokenizer_model": str(copy_to / "tokenizer.model")}
    if "vocab.json" in present and "merges.txt" in present:
        return {
            "tokenizer_type": "GPT2BPETokenizer",
            "vocab_file": str(copy_to / "vocab.json"),
            "merge_file": str(copy_to / "merges.txt"),
        }
    return None


SP_SEGMENTS = "▁+[^▁]*|[^▁]+"
"""SentencePiece's words, which BPE never merges across: a new one starts at a space that follows a non-space
(a run of spaces and the word after it are one word)."""


def sentencepiece_bpe_json(model_file: str) -> str:
    """A ``tokenizers`` ``tokenizer.json`` that encodes and decodes as the SentencePiece BPE model ``model_file``
    does (plain ids, as ``GPTSentencePieceTokenizer``): same vocabulary and ids, merges ranked by the merged
    piece's score (SentencePiece merges the best-scoring pair first), byte fallback, user-defined pieces
    matched whole, and SentencePiece's own whitespace handling (checked on the model itself: dummy prefix,
    extra whitespace kept or collapsed). Loading it needs neither sentencepiece nor protobuf."""
    import sentencepiece
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

    sp = sentencepiece.SentencePieceProcessor(model_file=model_file)
    size = len(sp)
    pieces = [sp.id_to_piece(i) for i in range(size)]
    vocab = {piece: i for i, piece in enumerate(pieces)}
    special = {i for i in range(size) if sp.is_control(i) or sp.is_unknown(i)}
    # User-defined pieces score +0.0; learned ones -rank, the first of them -0.0 (the API has no piece type).
    user_defined = [
        i for i in range(size) if i not in special and not sp.is_byte(i) and math.copysign(1.0, sp.get_score(i)) > 0
    ]
    merges = []
    for i, piece in enumerate(pieces):
        if i in special or sp.is_byte(i) or i in user_defined or len(piece) < 2:
            continue
        splits = [(piece[:k], piece[k:]) for k in range(1, len(piece)) if piece[:k] in vocab and piece[k:] in vocab]
        merges += [(-sp.get_score(i), vocab[a], vocab[b], a, b) for a, b in splits]
    merges.sort()
    unk = pieces[sp.unk_id()] if sp.unk_id() >= 0 else None
    tokenizer = Tokenizer(
        models.BPE(
            vocab=vocab, merges=[(a, b) for *_, a, b in merges], unk_token=unk, fuse_unk=True, byte_fallback=True
        )
    )
    dummy_prefix = sp.encode("a", out_type=str)[0].startswith("▁")
    # Always one "▁" before the text (transformers' Metaspace skips it when the text starts with a space).
    steps: list[Any] = [normalizers.Prepend("▁")] if dummy_prefix else []
    if sp.encode("a  b", out_type=str) == sp.encode("a b", out_type=str):  # remove_extra_whitespaces
        steps = [normalizers.Strip(), normalizers.Replace(Regex(" {2,}"), " "), *steps]
    tokenizer.normalizer = normalizers.Sequence([*steps, normalizers.Replace(" ", "▁")])
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(SP_SEGMENTS), behavior="isolated")
    steps_out = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    tokenizer.decoder = decoders.Sequence([*steps_out, decoders.Strip(" ", 1, 0)] if dummy_prefix else steps_out)
    tokenizer.add_special_tokens([AddedToken(pieces[i], special=True, normalized=False) for i in sorted(special)])
    tokenizer.add_tokens([AddedToken(pieces[i], special=False, normalized=False) for i in user_defined])
    return tokenizer.to_str()


def with_bos(spec: str, *, bos_piece: str, bos_id: int) -> str:
    """``tokenizer.json`` text whose post-processor puts the beginning-of-sequence id before every text, as
    Llama2Tokenizer (and Llama 2's own tokenizer) does."""
    data = json.loads(spec)
    data["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": bos_piece, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [
            {"SpecialToken": {"id": bos_piece, "type_id": 0}},
            {"Sequence": {"id": "A", "type_id": 0}},
            {"SpecialToken": {"id": bos_piece, "type_id": 1}},
            {"Sequence": {"id": "B", "type_id": 1}},
        ],
        "special_tokens": {bos_piece: {"id": bos_piece, "ids": [bos_id], "tokens": [bos_piece]}},
    }
    return json.dumps(data, ensure_ascii=False)


def _byte_characters() -> list[str]:
    """The printable character that stands for each byte in a byte-level BPE vocabulary (GPT-2's mapping, as
    ``tokenizers``' ``ByteLevel`` uses it): printable Latin-1 bytes are themselves, the others ``chr(256 + k)``."""
    printable = {*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)}
    out, extra = [], 0
    for byte in range(256):
        if byte in printable:
            out.append(chr(byte))
        else:
            out.append(chr(256 + extra))
            extra += 1
    return out


def tiktoken_bpe_json(tokenizer: TikTokenizer) -> str:
    """A ``tokenizers`` ``tokenizer.json`` that encodes and decodes as ``tokenizer`` does: the special tokens at
    ids ``0 .. S-1``, each kept rank ``r`` at ``S + r`` as its bytes in the byte-level alphabet, merges ranked by
    the merged token's rank (tiktoken merges the lowest-ranked pair first), a word found whole in the vocabulary
    taken as it is (tiktoken's look-up before merging: ``ignore_merges``), and the same pattern splitting the
    text before the bytes are mapped."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    from megatron_ext.data.tiktokenizer import PATTERNS

    chars = _byte_characters()
    offset = tokenizer.num_special_tokens

    def spelled(token: bytes) -> str:
        return "".join(chars[b] for b in token)

    ranks = tokenizer.ranks
    vocab = {spelled(token): rank + offset for token, rank in ranks.items()}
    clash = [t for t in tokenizer.special_tokens if t in vocab]
    if clash:
        raise ValueError(
            f"the special token {clash[0]!r} is also a token of the vocabulary file: a tokenizer.json cannot give "
            "both their ids"
        )
    vocab.update({token: i for i, token in enumerate(tokenizer.special_tokens)})
    merges = []
    for token, rank in ranks.items():
        for k in range(1, len(token)):
            left, right = token[:k], token[k:]
            if left in ranks and right in ranks:
                merges.append((rank, ranks[left], ranks[right], spelled(left), spelled(right)))
    merges.sort()
    bpe = Tokenizer(models.BPE(vocab=vocab, merges=[(a, b) for *_, a, b in merges], ignore_merges=True))
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PATTERNS[tokenizer.pattern]), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    bpe.decoder = decoders.ByteLevel()
    bpe.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in tokenizer.special_tokens])
    return bpe.to_str()

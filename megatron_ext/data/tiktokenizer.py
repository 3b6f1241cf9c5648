"""``--tokenizer-type TikTokenizer``: Megatron-LM's ``CustomTikTokenizer`` (its legacy tokenizers), on ``tiktoken``.

What Megatron-LM builds from ``--tokenizer-model VOCAB.json --tiktoken-pattern v1|v2 --vocab-size N``:

* the vocabulary file is a JSON list of ``{"rank", "token_bytes" (base64), "token_str"}``, rank ``i`` at index
  ``i``, the first 256 the single bytes in order; the first ``N - S`` entries are kept (``S`` =
  ``--tiktoken-num-special-tokens``, default 1000);
* ids ``0 .. S-1`` are the special tokens: ``--tokenizer-special-tokens`` (default ``<unk> <s> </s>``, which any
  list must contain) then ``<SPECIAL_i>`` fillers; a rank ``r`` is id ``S + r``;
* a text is split by the pattern and merged by rank (``tiktoken``'s ``encode_ordinary``: special tokens in the
  text are plain text), with no bos or eos added; eod is ``</s>``; the vocabulary is ``N`` (default 2¹⁷).

``tiktoken`` is an optional dependency, imported when this tokenizer is built.
"""

from __future__ import annotations

import base64
import json
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from megatron_ext.data.tokenizer_base import Tokenizer, TokenizerError

PATTERNS = {
    "v1": r"[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+",
    "v2": r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?"
    r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|"
    r"\s+(?!\S)|\s+",
}
"""``--tiktoken-pattern``: Megatron-LM's ``PATTERN_TIKTOKEN`` (v1) and ``PATTERN_TIKTOKEN_V2`` (v2)."""

REQUIRED_SPECIAL = ("<unk>", "<s>", "</s>")
DEFAULT_VOCAB_SIZE = 2**17
"""Megatron-LM's vocabulary when ``--vocab-size`` is not given."""


def read_ranks(path: Path, *, keep: int) -> dict[bytes, int]:
    """The first ``keep`` merge ranks of a vocabulary JSON file, checked as Megatron-LM checks them."""
    try:
        entries = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise TokenizerError(f"{path}: not a TikTokenizer vocabulary (a JSON list of ranks): {exc}") from exc
    if not isinstance(entries, list):
        raise TokenizerError(f"{path}: a TikTokenizer vocabulary is a JSON list of ranks, not {type(entries).__name__}")
    ranks: dict[bytes, int] = {}
    for i, entry in enumerate(entries[:keep]):
        if not isinstance(entry, dict) or set(entry) != {"rank", "token_bytes", "token_str"} or entry["rank"] != i:
            raise TokenizerError(f"{path}: entry {i} is not {{rank: {i}, token_bytes, token_str}}: {str(entry)[:80]}")
        token = base64.b64decode(entry["token_bytes"])
        if i < 256 and token != bytes([i]):
            raise TokenizerError(f"{path}: rank {i} must be the single byte {i} (the first 256 ranks are the bytes)")
        ranks[token] = i
    if len(ranks) != min(keep, len(entries)):
        raise TokenizerError(f"{path}: a token appears at two ranks")
    return ranks


class TikTokenizer(Tokenizer):
    """Megatron-LM's ``CustomTikTokenizer``: ``tiktoken`` BPE ids after the special tokens."""

    type_name = "TikTokenizer"
    whole_reason = "tiktoken's pattern may join characters across any cut (a text is tokenized whole)"

    def __init__(
        self,
        vocab_file: str,
        *,
        pattern: str,
        vocab_size: int | None = None,
        num_special_tokens: int = 1000,
        special_tokens: Sequence[str] | None = None,
    ) -> None:
        path = Path(vocab_file)
        if not path.is_file():
            raise TokenizerError(f"TikTokenizer vocabulary {path} does not exist (--tokenizer-model VOCAB.json)")
        if pattern not in PATTERNS:
            raise TokenizerError(f"--tiktoken-pattern {pattern!r}: give v1 or v2 (Megatron-LM's patterns)")
        try:
            import tiktoken
        except ImportError as exc:
            raise TokenizerError("TikTokenizer needs the tiktoken package: pip install tiktoken") from exc
        size = vocab_size or DEFAULT_VOCAB_SIZE
        special = list(special_tokens) if special_tokens else list(REQUIRED_SPECIAL)
        problems = []
        if len(set(special)) != len(special):
            problems.append(f"--tokenizer-special-tokens repeats a token: {special}")
        if not set(REQUIRED_SPECIAL) <= set(special):
            problems.append(f"--tokenizer-special-tokens must include {' '.join(REQUIRED_SPECIAL)}")
        if not len(special) <= num_special_tokens < size:
            problems.append(
                f"--tiktoken-num-special-tokens {num_special_tokens} must be at least the {len(special)} special "
                f"tokens and less than the vocabulary ({size:,}, --vocab-size)"
            )
        if problems:
            raise TokenizerError("; ".join(problems))
        special += [f"<SPECIAL_{i}>" for i in range(len(special), num_special_tokens)]
        ranks = read_ranks(path, keep=size - num_special_tokens)
        if len(ranks) != size - num_special_tokens:
            raise TokenizerError(
                f"{path} has {len(ranks):,} ranks; --vocab-size {size:,} with {num_special_tokens} special tokens "
                f"needs {size - num_special_tokens:,} (give --vocab-size {len(ranks) + num_special_tokens:,} or less)"
            )
        self.vocab_file = str(path.resolve())
        self.pattern, self.num_special_tokens, self.special_tokens = pattern, num_special_tokens, tuple(special)
        self._size = size
        self.ranks = ranks
        """The vocabulary file's merge ranks that are kept (id = rank + ``num_special_tokens``)."""
        ids = {token: i for i, token in enumerate(special)}
        self._model = tiktoken.Encoding(
            name=path.parent.name or "tiktoken",
            pat_str=PATTERNS[pattern],
            mergeable_ranks={token: rank + num_special_tokens for token, rank in ranks.items()},
            special_tokens=ids,
        )
        self._eos = ids["</s>"]
        self._bos = ids["<s>"]

    @property
    def vocab_size(self) -> int:
        return self._size

    @property
    def eod(self) -> int:
        return self._eos

    @property
    def bos(self) -> int:
        return self._bos

    def tokenize(self, text: str) -> list[int]:
        return self._model.encode_ordinary(text)

    def tokenize_batch(self, texts: list[str]) -> list[np.ndarray]:
        return [np.asarray(ids, dtype=np.int32) for ids in self._model.encode_ordinary_batch(texts, num_threads=1)]

    def detokenize(self, ids: Sequence[int]) -> str:
        return self._model.decode([int(i) for i in ids])

    @property
    def definition_files(self) -> list[Path]:
        return [Path(self.vocab_file)]

    @property
    def unique_identifiers(self) -> OrderedDict[str, Any]:
        ids = super().unique_identifiers
        ids.update(
            vocab_file=self.vocab_file,
            pattern=self.pattern,
            num_special_tokens=self.num_special_tokens,
            special_tokens=list(self.special_tokens),
        )
        return ids

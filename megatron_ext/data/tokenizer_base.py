"""What every tokenizer is: the ``Tokenizer`` interface that the tools, the datasets and the checkpoints use, and the
error a tokenizer that cannot be built raises.

The tokenizers themselves are in :mod:`megatron_ext.data.tokenizers` (and
:mod:`megatron_ext.data.tiktokenizer`), which builds the one that the flags name.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from megatron_ext.data.cut_rules import CutRule


class TokenizerError(ValueError):
    """A tokenizer that cannot be built from the given options or files."""


PIECE_CHARS = 1 << 16
"""Characters per piece when a long text is tokenized in pieces (:meth:`Tokenizer.tokenize_pieces`)."""


class Tokenizer(ABC):
    """What the tools and Megatron-Core's GPT datasets need from a tokenizer."""

    #: Megatron-LM's ``--tokenizer-type`` name.
    type_name: str = ""
    #: Where a long text may be cut (see :mod:`megatron_ext.data.cut_rules`); None: it is tokenized whole.
    cut_rule: CutRule | None = None
    #: Why a long text is tokenized whole (when ``cut_rule`` is None).
    whole_reason: str = "no place where a text can be cut without changing its ids is known for this tokenizer"

    @property
    @abstractmethod
    def vocab_size(self) -> int:
        """Vocabulary size before padding (Megatron-LM pads it to a multiple of 128 × TP)."""

    @property
    @abstractmethod
    def eod(self) -> int:
        """End-of-document id (``--append-eod``; GPTDataset's document separator)."""

    @abstractmethod
    def tokenize(self, text: str) -> list[int]:
        """Token ids of one text, exactly as Megatron-LM's tokenizer returns them."""

    @abstractmethod
    def detokenize(self, ids: Sequence[int]) -> str:
        """Text of token ids."""

    def tokenize_batch(self, texts: list[str]) -> list[np.ndarray]:
        """Token ids of many texts (int32 arrays); subclasses batch natively."""
        return [np.asarray(self.tokenize(t), dtype=np.int32) for t in texts]

    def tokenize_pieces(self, text: str, piece_chars: int = PIECE_CHARS) -> Iterator[np.ndarray]:
        """The ids of ``tokenize(text)``, exactly, as consecutive arrays, one per piece of about
        ``piece_chars`` characters cut by :attr:`cut_rule` (one array for the whole text where the
        tokenizer has no rule). Only one piece is tokenized at a time, so the tokenizer's working
        memory is that of one piece, not of the whole text."""
        if self.cut_rule is None:
            yield np.asarray(self.tokenize(text), dtype=np.int32)
            return
        for piece in self.cut_rule.pieces(text, piece_chars):
            yield self._tokenize_piece(piece)

    def _tokenize_piece(self, piece: str) -> np.ndarray:
        """One piece's ids; an id that does not fit int32 is kept (int64), as ``tokenize`` would give it."""
        try:
            return self.tokenize_batch([piece])[0]
        except OverflowError:
            return np.asarray(self.tokenize(piece), dtype=np.int64)

    @property
    def definition_files(self) -> list[Path]:
        """The files whose contents decide the ids ([]: none, as for NullTokenizer, whose ids are its size);
        a checkpoint records their digest (``checkpoint.run_identity``)."""
        return []

    @property
    def unique_identifiers(self) -> OrderedDict[str, Any]:
        """What identifies this tokenizer in Megatron-Core's dataset cache descriptions."""
        return OrderedDict(
            {"class": f"{type(self).__module__}.{type(self).__qualname__}", "vocab_size": self.vocab_size}
        )

    def describe(self) -> str:
        return f"{self.type_name} (vocabulary {self.vocab_size:,}, eod {self.eod})"

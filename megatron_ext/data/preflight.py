"""The checks of a run's data before anything starts: its tokenizer, built once, and every dataset against it.

Building a ``TrainingConfig`` is pure (``config.arguments``); this is the step
that opens files. ``pretrain_gpt.py`` calls it for ``--dry-run`` and before a
real run, on every rank before any process group exists, so a wrong path, a
damaged dataset or one made with another tokenizer is one clear
configuration error (exit code 2). What each rank reads: ``sources.py``.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from dataclasses import dataclass

from megatron_ext.config.arguments import ConfigError, TrainingConfig
from megatron_ext.data import sources
from megatron_ext.data.tokenizers import Tokenizer


@dataclass(frozen=True)
class Checked:
    """A configuration whose data was checked, with the tokenizer that checked it."""

    cfg: TrainingConfig
    """The configuration with the tokenizer's vocabulary filled in (``tokenizer_vocab_size``)."""
    tokenizer: Tokenizer
    """The run's tokenizer (the datasets were checked against it; the data loaders use it)."""


def preflight(cfg: TrainingConfig, *, full: bool) -> Checked:
    """Build the tokenizer and check every dataset of ``cfg`` against it; ConfigError names a problem.

    ``full``: the O(number of sequences) checks as well as the O(1) ones (one
    process per job affords them: ``--dry-run``, global rank 0).
    """
    if cfg.run.tensorboard_dir and importlib.util.find_spec("tensorboard") is None:
        raise ConfigError("--tensorboard-dir needs the tensorboard package: pip install tensorboard")
    null = cfg.data.tokenizer_type == "NullTokenizer"
    try:
        tokenizer = sources.resolve(cfg.data, vocab_size=cfg.model.vocab_size if null else None, full=full)
    except sources.DataError as exc:
        raise ConfigError(str(exc)) from exc
    return Checked(cfg=dataclasses.replace(cfg, tokenizer_vocab_size=tokenizer.vocab_size), tokenizer=tokenizer)

"""A checkpoint saved under any TP/PP/VP/DP, opened in one process.

Megatron-Core's ``torch_dist`` checkpoints hold every tensor under its global,
layout-free key, so one process can read them whole, tensor by tensor, or load
them into a model built for TP 1 · PP 1, Megatron-Core resharding on load. The
model and tokenizer are rebuilt from the arguments the run recorded in the
checkpoint (``training.checkpointing``), nothing else.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from megatron_ext.checkpoint import records
from megatron_ext.checkpoint.on_disk import CheckpointError
from megatron_ext.checkpoint.run_identity import TOKENIZER_FLAG, tokenizer_difference, tokenizer_identity
from megatron_ext.config.arguments import ConfigError
from megatron_ext.config.tokenizer_types import VOCAB_SIZE_TOKENIZERS
from megatron_ext.config.training_config import GROUPS, TrainingConfig, make_config
from megatron_ext.data.tokenizer_base import Tokenizer, TokenizerError
from megatron_ext.data.tokenizers import build_tokenizer
from megatron_ext.training import checkpoint_loading, checkpointing, distributed

RUN_LENGTH = ("train_iters", "train_samples", "eval_interval", "eval_iters")
"""The run options that size the datasets."""


@dataclass(frozen=True)
class SavedCheckpoint:
    """One checkpoint directory and the run that wrote it, configured for one process."""

    root: Path
    """The ``--save`` directory."""
    path: Path
    """Its ``iter_NNNNNNN`` directory."""
    iteration: int
    cfg: TrainingConfig
    """The saved run's arguments, for one process (TP 1 · PP 1 · DP 1), with the checkpoint's padded vocabulary."""
    identity: dict[str, Any] | None = None
    """The run's tokenizer and data digests as recorded (``checkpoint.run_identity``; None: an older checkpoint)."""


def config_from_record(
    record: dict[str, Any],
    *,
    device: str = "cpu",
    tokenizer: dict[str, str | None] | None = None,
    padded_vocab_size: int | None = None,
) -> TrainingConfig:
    """The saved run's configuration for one process: the same model, data, batch and schedule; the default
    (single-process) parallel flags; ``device``; the tokenizer flags in ``tokenizer`` where given."""
    groups: dict[str, dict[str, Any]] = {name: dict(record.get(name) or {}) for name in GROUPS}
    groups["parallel"] = {}
    # The run length sizes the datasets (their splits are then the run's); the rest of the run's options
    # (checkpoints, logs, profiling) belong to the run, not to its model.
    run = {name: groups["run"][name] for name in RUN_LENGTH if name in groups["run"]}
    if run.get("train_samples") is not None:
        run.pop("train_iters", None)  # derived from the samples by make_config, as when it was saved
    groups["run"] = run | {"device": device}
    data = groups["data"]
    if tokenizer:
        data.update({k: v for k, v in tokenizer.items() if v is not None})
    try:
        cfg = make_config(
            world_size=1,
            model=groups["model"],
            parallel=groups["parallel"],
            batch=groups["batch"],
            optim=groups["optim"],
            data=groups["data"],
            run=groups["run"],
        )
    except ConfigError as exc:
        raise CheckpointError(f"the checkpoint's recorded arguments do not make a valid run here: {exc}") from exc
    return dataclasses.replace(
        cfg,
        tokenizer_vocab_size=record.get("tokenizer_vocab_size"),
        checkpoint_padded_vocab_size=padded_vocab_size,
    )


def open_checkpoint(
    load: str | Path,
    *,
    iteration: int | None = None,
    device: str = "cpu",
    tokenizer: dict[str, str | None] | None = None,
) -> SavedCheckpoint:
    """The checkpoint of ``iteration`` (default: the latest complete one) under ``load``; needs no process group.

    CheckpointError when there is none, or it was saved without its arguments.
    """
    root = Path(load)
    path = checkpointing.resolve_iteration(root, iteration)
    common = checkpointing.saved_common(path)
    record = records.arguments_of(common)
    if record is None:
        raise CheckpointError(
            f"{path} does not record the arguments of the run that saved it (saved by an older version of this "
            "project); load it with pretrain_gpt.py and the run's flags, and save it again (--train-iters equal to "
            "its iteration, --save DIR)"
        )
    cfg = config_from_record(
        record, device=device, tokenizer=tokenizer, padded_vocab_size=checkpointing.padded_vocab_of(path)
    )
    identity = common.get("identity")
    return SavedCheckpoint(
        root=root,
        path=path,
        iteration=int(path.name.removeprefix("iter_")),
        cfg=cfg,
        identity=identity if isinstance(identity, dict) else None,
    )


def tokenizer_of(cfg: TrainingConfig) -> Tokenizer:
    """The run's tokenizer; its vocabulary must be the one the checkpoint was trained with."""
    d = cfg.data
    sized = d.tokenizer_type in VOCAB_SIZE_TOKENIZERS
    try:
        tokenizer = build_tokenizer(
            d.tokenizer_type,
            tokenizer_model=d.tokenizer_model,
            vocab_file=d.vocab_file,
            merge_file=d.merge_file,
            vocab_size=cfg.model.vocab_size if sized else None,
            tiktoken_pattern=d.tiktoken_pattern,
            tiktoken_num_special_tokens=d.tiktoken_num_special_tokens,
            special_tokens=d.tokenizer_special_tokens,
            null_tokenizer_eod_id=d.null_tokenizer_eod_id,
            null_tokenizer_pad_id=d.null_tokenizer_pad_id,
        )
    except TokenizerError as exc:
        raise CheckpointError(f"{exc} (give the tokenizer flags to use another copy of the run's tokenizer)") from exc
    if cfg.tokenizer_vocab_size is not None and tokenizer.vocab_size != cfg.tokenizer_vocab_size:
        raise CheckpointError(
            f"the tokenizer ({tokenizer.describe()}) has {tokenizer.vocab_size:,} tokens and the checkpoint was "
            f"trained with {cfg.tokenizer_vocab_size:,}; give the run's own tokenizer"
        )
    return tokenizer


def checked_tokenizer(ckpt: SavedCheckpoint, *, accept_change: bool = False) -> Tokenizer:
    """The tokenizer of ``ckpt``'s run (the recorded one, or the one the tools' flags name), which must be the
    one it was trained with, by content: the same vocabulary size is not enough (``checkpoint.run_identity``)."""
    tokenizer = tokenizer_of(ckpt.cfg)
    if ckpt.identity is None:
        return tokenizer  # saved before digests were recorded: the vocabulary size was checked
    difference = tokenizer_difference(ckpt.identity["tokenizer"], tokenizer_identity(tokenizer))
    if difference is not None and not accept_change:
        raise CheckpointError(
            f"{ckpt.path}: {difference}. Give the run's own tokenizer (--tokenizer-model, --vocab-file and "
            f"--merge-file point at another copy), or pass {TOKENIZER_FLAG} to use this one deliberately"
        )
    return tokenizer


@contextmanager
def one_process(cfg: TrainingConfig) -> Iterator[distributed.DistributedContext]:
    """A process group of this process alone (gloo on CPU) and Megatron-Core's TP 1 · PP 1 state, for as long as
    the block runs: what Megatron-Core's checkpoint reader and model need."""
    ctx = distributed.initialize(layout=cfg.layout, device_choice=cfg.run.device, seed=cfg.optim.seed)
    try:
        yield ctx
    finally:
        distributed.destroy()


def read_tensor(path: Path, key: str, meta: Any) -> torch.Tensor:
    """One whole tensor of the checkpoint by its global key (all layers of a per-layer weight), through
    Megatron-Core's dist-checkpointing: memory is this tensor, whatever the layout that saved it."""
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.mapping import ShardedTensor

    target = torch.empty(tuple(meta.global_shape), dtype=meta.dtype)
    request = {key: ShardedTensor.from_rank_offsets(key, target, replica_id=0)}
    return dist_checkpointing.load(request, str(path))[key]


def load_model(ckpt: SavedCheckpoint, device: torch.device) -> Any:
    """Megatron-Core's GPTModel with the checkpoint's weights, in this process (inside ``one_process``)."""
    from megatron_ext.training.model import gpt_model, in_training_precision

    cfg = ckpt.cfg
    model = gpt_model(cfg, pre_process=True, post_process=True, vp_stage=None, device=device)
    model = model.to(device)
    model = in_training_precision(model, cfg)  # the run's forward: bf16 or fp16 throughout, fp32 logits
    run = dataclasses.replace(cfg.run, load=str(ckpt.root), no_load_optim=True, no_load_rng=True)
    checkpoint_loading.load_checkpoint(
        root=ckpt.root,
        chunks=[model],
        optimizer=None,
        scheduler=None,
        cfg=dataclasses.replace(cfg, run=run),
        identity=None,  # the tools compare the tokenizer themselves (checked_tokenizer); data is not theirs
        iteration=ckpt.iteration,
    )
    model.eval()
    return model


def forward_logits(model: Any, tokens: torch.Tensor) -> torch.Tensor:
    """Megatron-Core's forward: (batch, sequence) token ids → (batch, sequence, padded vocabulary) logits."""
    positions = torch.arange(tokens.shape[1], device=tokens.device).unsqueeze(0).expand_as(tokens)
    with torch.no_grad():
        return model(tokens, positions, None)

"""What a checkpoint records besides its tensors, and the refusals that follow from it, without torch.

the checkpoint's common state (one copy per checkpoint, written by ``training.checkpointing``)
holds the iteration and consumed samples, the run's arguments by group, the
layout with its stage split, the vocabulary, the tokenizer and data digests,
and the optimizer state's format. This module builds that record and reads
it back: the configuration that wrote a checkpoint (``saved_run``), whether a
per-rank optimizer state can load under another layout, the padded
vocabulary a resumed run keeps, and whether a run may go on with another
tokenizer or other data. The reading of the common state itself is torch's, in
``training.checkpointing``.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from megatron_ext.checkpoint.on_disk import CheckpointError
from megatron_ext.checkpoint.run_identity import (
    DATA_FLAG,
    TOKENIZER_FLAG,
    RunIdentity,
    data_differences,
    tokenizer_difference,
)
from megatron_ext.config.run_args import RunArgs
from megatron_ext.config.training_config import GROUPS, TrainingConfig, make_config
from megatron_ext.parallel.factors import divisors
from megatron_ext.parallel.layout import ParallelLayout

log = logging.getLogger(__name__)

CHECKPOINT_VERSION = 3.0
"""The common state's ``checkpoint_version`` (Megatron-LM's key)."""


def arguments_record(cfg: TrainingConfig) -> dict[str, Any]:
    """The run's arguments by group (as Megatron-LM keeps ``args``), with the tokenizer's vocabulary: what a
    one-process reader (``megatron_ext.inference``, the Hugging Face export) rebuilds the model and tokenizer
    from. Plain values only, so that ``torch.load(weights_only=True)`` reads them."""
    record: dict[str, Any] = {name: dataclasses.asdict(getattr(cfg, name)) for name in GROUPS}
    record["tokenizer_vocab_size"] = cfg.tokenizer_vocab_size
    return record


def optimizer_metadata(cfg: TrainingConfig) -> dict[str, Any]:
    """Megatron-Core's sharded-state-dict metadata for the optimizer format chosen by the flags."""
    run = cfg.run
    return {
        "distrib_optim_sharding_type": "fully_reshardable"
        if run.dist_ckpt_optim_fully_reshardable
        else "dp_reshardable",
        "distrib_optim_fully_reshardable_mem_efficient": run.distrib_optim_fully_reshardable_mem_efficient,
    }


def null_vocabulary_before_0_17(common: Mapping[str, Any]) -> int | None:
    """The ``--vocab-size`` that, in today's meaning, gives the NullTokenizer vocabulary of a checkpoint trained
    under Megatron-LM's earlier one (before 0.17 the end of document was an id added after ``--vocab-size`` ids:
    ``--vocab-size V`` trained V + 1 ids, end of document V, which ``--vocab-size V + 1`` now gives); None for any
    other checkpoint."""
    args = common.get("args")
    if not isinstance(args, dict):
        return None
    data, model = args.get("data") or {}, args.get("model") or {}
    if data.get("tokenizer_type") != "NullTokenizer" or data.get("null_tokenizer_eod_id") is not None:
        return None
    flag, trained = model.get("vocab_size"), common.get("vocab_size")
    return trained if isinstance(flag, int) and trained == flag + 1 else None


def arguments_of(common: Mapping[str, Any]) -> dict[str, Any] | None:
    """A checkpoint's recorded arguments (``arguments_record``; None: saved before they were kept), in today's
    meaning: an earlier NullTokenizer ``--vocab-size`` is given as the one that now trains the same ids."""
    args = common.get("args")
    if not isinstance(args, dict):
        return None
    earlier = null_vocabulary_before_0_17(common)
    if earlier is None:
        return args
    return args | {"model": {**args["model"], "vocab_size": earlier}}


@dataclass(frozen=True)
class SavedRun:
    """What a checkpoint says of the run that wrote it: its configuration, layout included."""

    config: TrainingConfig
    """The run's configuration at the world size it ran on (``config.layout``: its layout)."""
    layout_record: dict[str, Any]
    """The layout as recorded (the common state's ``"layout"``), for ``per_rank_format_refusal``."""


def saved_run(path: Path, common: Mapping[str, Any]) -> SavedRun | None:
    """The configuration a checkpoint was written with, from its common state (None: saved before the records
    were kept). ``path`` names the checkpoint in errors."""
    args, layout = arguments_of(common), common.get("layout")
    if args is None or not isinstance(layout, dict):
        return None
    parallel = args["parallel"]
    world = layout["tp"] * parallel.get("context_parallel_size", 1) * layout["pp"] * layout["dp"]
    try:
        # Fields this version does not have are left out; those it added take their defaults.
        known = {name: {f.name for f in dataclasses.fields(cls)} for name, cls in GROUPS.items()}
        groups: dict[str, Any] = {name: {k: v for k, v in args[name].items() if k in known[name]} for name in GROUPS}
        config = make_config(world_size=world, **groups)
    except (ValueError, KeyError) as exc:  # a record this version cannot rebuild
        raise CheckpointError(f"{path}: the saved arguments do not rebuild the run's layout: {exc}") from exc
    return SavedRun(config=config, layout_record=layout)


def common_state(
    cfg: TrainingConfig, *, iteration: int, consumed_samples: int, identity: RunIdentity | None
) -> dict[str, Any]:
    """What every save records besides tensors and optimizer (one rank's copy; the common state)."""
    return {
        "iteration": iteration,
        "consumed_samples": consumed_samples,
        "layout": layout_record(cfg.layout),
        "vocab_size": cfg.vocab_size,
        "args": arguments_record(cfg),
        "identity": identity.as_record() if identity is not None else None,
        "checkpoint_version": CHECKPOINT_VERSION,
    }


def layout_record(layout: ParallelLayout) -> dict[str, Any]:
    """The layout as the common state records it: what decides whether a per-rank optimizer state can load."""
    return {
        "tp": layout.tp,
        "pp": layout.pp,
        "vp": layout.vp,
        "dp": layout.dp,
        "distributed_optimizer": layout.use_distributed_optimizer,
        "stages": stage_record(layout),
    }


def stage_record(layout: ParallelLayout) -> list[list[int]]:
    """Transformer layers of every [pipeline rank][virtual stage]: what a per-rank optimizer shard covers."""
    return [[chunk.num_layers for chunk in rank] for rank in layout.stages]


def per_rank_format_refusal(saved_layout: dict[str, Any], layout: ParallelLayout) -> str | None:
    """Why a per-rank (``dp_reshardable``) distributed-optimizer state cannot load under ``layout``, or None.

    Each rank's shard is a flat buffer over its chunks' parameters: it survives a change of DP only.
    Checkpoints written before the stage split was recorded compare TP, PP and VP.
    """
    changed = [k for k in ("tp", "pp", "vp") if saved_layout.get(k) != getattr(layout, k)]
    if changed:
        was = " × ".join(f"{k.upper()} {saved_layout.get(k)}" for k in changed)
        now = " × ".join(f"{k.upper()} {getattr(layout, k)}" for k in changed)
    elif saved_layout.get("stages", stage_record(layout)) != stage_record(layout):
        was = f"layers per pipeline rank and virtual stage {saved_layout['stages']}"
        now = f"{stage_record(layout)}"
    else:
        return None
    return (
        f"its distributed-optimizer state was saved per rank (loadable under another DP only) with {was}, "
        f"and this run has {now}. Resume once with the saved layout and --dist-ckpt-optim-fully-reshardable, "
        "or pass --no-load-optim to load only the model"
    )


def keep_vocabulary(cfg: TrainingConfig, saved: int | None) -> TrainingConfig:
    """``cfg`` with ``saved``, the padded vocabulary of the checkpoint under ``--load`` (None: there is none).

    Megatron pads the vocabulary to a multiple of ``--make-vocab-size-divisible-by``
    × TP, so another TP would pad it differently; the checkpoint's padding is
    kept whenever the new TP divides it. Rows added beyond it would take part in
    every softmax (a zero row still adds ``exp(0)``), so they cannot be made
    inert: a TP that does not divide it is refused with the sizes and what works.
    """
    if saved is None or saved == cfg.padded_vocab_size or saved < cfg.vocab_size:
        return cfg  # nothing to keep, or another vocabulary: load_checkpoint names the mismatch
    tp = cfg.layout.tp
    if saved % tp:
        working = [t for t in divisors(saved) if t <= 8 and cfg.model.num_attention_heads % t == 0]
        raise CheckpointError(
            f"{cfg.run.load}: the checkpoint's padded vocabulary ({saved:,} rows for {cfg.vocab_size:,} tokens) "
            f"is not divisible by tensor({tp}), and extra rows would change every softmax; resume under TP in "
            f"{working}. For checkpoints that move between TP 1, 2, 4 and 8, train with "
            f"--make-vocab-size-divisible-by {cfg.model.make_vocab_size_divisible_by * 8} (padding to a multiple "
            "that each of them divides)"
        )
    return dataclasses.replace(cfg, checkpoint_padded_vocab_size=saved)


def check_identity(path: Path, common: Mapping[str, Any], identity: RunIdentity, run: RunArgs) -> None:
    """Refuse another tokenizer, or (resuming mid-run, not --finetune) other training data, than the
    checkpoint's. A checkpoint that has consumed no data (a seed, an import) may go on with any."""
    saved = common.get("identity")
    if saved is None:
        log.warning("%s records no tokenizer or data digests (saved by an older version): they are not checked", path)
        return
    tokenizer = tokenizer_difference(saved["tokenizer"], identity.tokenizer)
    if tokenizer is not None:
        if not run.accept_tokenizer_change:
            raise CheckpointError(
                f"{path}: {tokenizer}. Use the saved run's tokenizer, or pass {TOKENIZER_FLAG} to go on with this "
                "one deliberately"
            )
        log.warning("%s: %s (%s)", path, tokenizer, TOKENIZER_FLAG)
    if run.finetune or not common.get("consumed_samples"):
        return
    changes = data_differences(saved["data"], identity.data)
    if changes:
        if not run.accept_data_change:
            raise CheckpointError(
                f"{path}: this run's training data is not the checkpoint's: {'; '.join(changes)}. Resume on the "
                f"saved run's data, pass {DATA_FLAG} to continue on this data deliberately, or --finetune to start "
                "a new run from its weights"
            )
        log.warning("%s: training data changed (%s): %s", path, DATA_FLAG, "; ".join(changes))


def loads_optimizer(common: Mapping[str, Any], run: RunArgs) -> bool:
    """Whether a resume loads the optimizer state of a checkpoint (its common state): it has one, and neither
    ``--no-load-optim`` nor ``--finetune`` was given."""
    return not (run.no_load_optim or run.finetune) and bool(common.get("has_optimizer_state", True))


def check_resumable(path: Path, common: Mapping[str, Any], cfg: TrainingConfig) -> None:
    """Refuse a checkpoint this run cannot resume from, by its common state alone (no tensor is read): another
    vocabulary, the optimizer state of the other optimizer, or a per-rank distributed-optimizer state this layout
    cannot take. CheckpointError says what and the fix. Checked before anything is built, and again at load."""
    saved_vocab = common.get("vocab_size")
    if saved_vocab is not None and saved_vocab != cfg.vocab_size:
        raise CheckpointError(
            f"{path} was trained with a vocabulary of {saved_vocab:,} tokens and this run's tokenizer has "
            f"{cfg.vocab_size:,}; use the tokenizer (or --vocab-size) of the saved run"
        )
    if not loads_optimizer(common, cfg.run):
        return
    saved_layout = common.get("layout", {})
    saved_distributed = saved_layout.get("distributed_optimizer")
    if saved_distributed is not None and saved_distributed != cfg.layout.use_distributed_optimizer:
        # The two optimizers keep different state structures (the distributed one
        # holds fp32 master shards and per-group metadata).
        raise CheckpointError(
            f"{path}: the optimizer state was saved "
            f"{'with' if saved_distributed else 'without'} --use-distributed-optimizer and this run is "
            f"{'with' if cfg.layout.use_distributed_optimizer else 'without'} it; use the same setting, "
            "or pass --no-load-optim to load only the model"
        )
    saved_format = common.get("optimizer_format", "fully_reshardable")
    if cfg.layout.use_distributed_optimizer and saved_format == "dp_reshardable":
        refusal = per_rank_format_refusal(saved_layout, cfg.layout)
        if refusal:
            raise CheckpointError(f"{path}: {refusal}")

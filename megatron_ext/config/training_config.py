"""One run's whole configuration: ``TrainingConfig``, built from the command line (``parse_args``) or from
per-group values (``make_config``), with every rule between the groups checked. Pure: no files, no environment."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from megatron_ext.config import iterations
from megatron_ext.config.arguments import BatchArgs, ConfigError, ModelArgs, ParallelArgs
from megatron_ext.config.checkpoint_args import with_checkpoint_args
from megatron_ext.config.data_args import DataArgs
from megatron_ext.config.emerging_optimizer_args import EMERGING
from megatron_ext.config.flags import Parser, add_options, to_argv
from megatron_ext.config.layout_flags import (
    build_layout,
    context_parallel_problem,
    context_parallel_refusal,
    gloo_problem,
    megatron_lm_adjustments,
    pipeline_p2p_problems,
    wgrad_deferral_problems,
    zero_bubble_problems,
)
from megatron_ext.config.megatron_lm import split_unknown, unknown_flags_note
from megatron_ext.config.megatron_lm_accepted import ACCEPTED, translate
from megatron_ext.config.optimizer_args import OptimizerArgs
from megatron_ext.config.presets import PRESETS, get_preset
from megatron_ext.config.run_args import RunArgs
from megatron_ext.config.zero_bubble_fork import FORK_FLAGS
from megatron_ext.parallel.layout import ParallelLayout


@dataclass(frozen=True, kw_only=True)
class TrainingConfig:
    """The whole, validated configuration of one run."""

    model: ModelArgs
    parallel: ParallelArgs
    """The parallelism flags as given (the checkpoint records them; the overlap switches are read here). The
    layout they give is ``layout``: read TP, PP, VP, DP and the stage split there, never here."""
    batch: BatchArgs
    optim: OptimizerArgs
    data: DataArgs
    run: RunArgs
    layout: ParallelLayout
    """The validated layout of ``parallel``, ``batch`` and the model (``layout_flags.build_layout``)."""
    adjustments: tuple[str, ...] = ()
    """Flags changed the way Megatron-LM changes them, each with why (printed by the run and by --dry-run)."""
    tokenizer_vocab_size: int | None = None
    """The tokenizer's vocabulary before padding (filled in by ``data.preflight``; None: the null tokenizer's)."""
    checkpoint_padded_vocab_size: int | None = None
    """The padded vocabulary of the checkpoint under ``--load``, kept instead of this run's padding
    (``training.checkpointing.keep_checkpoint_vocabulary``): the padding depends on TP, and rows the
    checkpoint does not have would enter every softmax with fresh random weights."""

    @property
    def padded_vocab_size(self) -> int:
        """The checkpoint's padded vocabulary when resuming, else the vocabulary padded to a multiple of
        make_vocab_size_divisible_by × TP (Megatron)."""
        if self.checkpoint_padded_vocab_size is not None:
            return self.checkpoint_padded_vocab_size
        return pad_vocab_size(
            self.vocab_size,
            self.model.make_vocab_size_divisible_by,
            self.layout.tensor_model_parallel_size,
        )

    @property
    def vocab_size(self) -> int:
        """Unpadded vocabulary: the tokenizer's (``unpadded_vocab_size``)."""
        return unpadded_vocab_size(self.model.vocab_size, self.tokenizer_vocab_size)


def unpadded_vocab_size(model_vocab_size: int | None, tokenizer_vocab_size: int | None) -> int:
    """The vocabulary a run trains before padding: its tokenizer's, or without one (mock data, ``--vocab-size``)
    the null tokenizer's, ``--vocab-size`` ids, end of document included (Megatron-Core 0.19's ``NullTokenizer``;
    Megatron-LM before 0.17 added one id for it)."""
    if tokenizer_vocab_size is not None:
        return tokenizer_vocab_size
    return model_vocab_size or 0


def pad_vocab_size(vocab_size: int, divisible_by: int, tensor_parallel: int) -> int:
    multiple = divisible_by * tensor_parallel
    return ((vocab_size + multiple - 1) // multiple) * multiple


GROUPS: dict[str, type] = {
    "model": ModelArgs,
    "parallel": ParallelArgs,
    "batch": BatchArgs,
    "optim": OptimizerArgs,
    "data": DataArgs,
    "run": RunArgs,
}


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        description="Pretrain a GPT with Megatron-Core (TP × interleaved PP × DP).",
        allow_abbrev=False,
    )
    for group_name, cls in GROUPS.items():
        group = parser.add_argument_group(group_name, cls.__doc__)
        if cls is ModelArgs:
            group.add_argument(
                "--model",
                dest=_PRESET,
                default=argparse.SUPPRESS,
                choices=list(PRESETS),
                help="A model preset: expands to its shape flags; flags given after --model override them.",
            )
        add_options(group, cls, dataclasses.fields(cls), dest=group_name + ".{name}")
    return parser


_PRESET = "preset"


def preset_argv(name: str) -> list[str]:
    """The pretrain_gpt.py flags of preset ``name`` (``--model NAME`` expands to these)."""
    shape = ModelArgs(**get_preset(name).model_flags())
    return to_argv(shape, always=("num_layers", "hidden_size", "num_attention_heads", "seq_length", "vocab_size"))


def expand_preset(argv: Sequence[str]) -> list[str]:
    """``argv`` with ``--model NAME`` replaced by the preset's flags, placed first so later flags win."""
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre.add_argument("--model", choices=list(PRESETS))
    known, rest = pre.parse_known_args(list(argv))
    return [*preset_argv(known.model), *rest] if known.model else list(argv)


def option_strings(parser: argparse.ArgumentParser) -> frozenset[str]:
    """Every ``--flag`` a parser takes (aliases included)."""
    return frozenset(o for a in parser._actions for o in a.option_strings if o.startswith("--"))


def parse_args(
    argv: Sequence[str],
    *,
    world_size: int | None = None,
    default_world_size: int = 1,
    checkpoint_args: Mapping[str, Mapping[str, Any]] | None = None,
) -> TrainingConfig:
    """Parse and validate (pure, see ``make_config``). Raises ConfigError or LayoutError with every problem named.

    Megatron-LM's flags without a field here are taken first (``megatron_lm_accepted``: aliases replaced, flags
    that change nothing noted in ``adjustments``), then those refused are named with their reasons.
    ``checkpoint_args``: the arguments recorded by the checkpoint under ``--load``, which
    ``--use-checkpoint-args`` takes (the entry reads them).
    """
    parser = build_parser()
    taken = translate(expand_preset(argv), ours=option_strings(parser), accepted=ACCEPTED | FORK_FLAGS)
    namespace, extras = parser.parse_known_args(taken.argv)
    refused, unknown = split_unknown(extras)
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}{unknown_flags_note(unknown)}")
    given = group_values(namespace)
    refused = taken.refused + refused
    refused += [(flag, why) for flag, check in taken.conditions if (why := check(given)) is not None]
    if refused:
        raise ConfigError(
            "Megatron-LM flags this project refuses (every Megatron-LM flag and what happens to it: "
            "docs/megatron-lm-flags.md):\n" + "\n".join(f"  {flag}: {why}" for flag, why in refused)
        )
    notes = list(taken.notes)
    if checkpoint_args is not None and given["run"].get("use_checkpoint_args"):
        run = given["run"]
        given, changed = with_checkpoint_args(
            given,
            checkpoint_args,
            tokenizer=not run.get("no_use_tokenizer_model_from_checkpoint_args", False),
            parallel=bool(run.get("use_mp_args_from_checkpoint_args", False)),
        )
        notes.append(f"--use-checkpoint-args: from {run.get('load')}: {', '.join(changed) or 'nothing changed'}")
    cfg = make_config(world_size=world_size, default_world_size=default_world_size, **given)
    return dataclasses.replace(cfg, adjustments=(*notes, *cfg.adjustments))


def group_values(namespace: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """The parser's values by argument group (``GROUPS``): what ``make_config`` takes."""
    given: dict[str, dict[str, Any]] = {name: {} for name in GROUPS}
    for dest, value in vars(namespace).items():
        if dest == _PRESET:
            continue
        group, name = dest.split(".", 1)
        given[group][name] = tuple(value) if isinstance(value, list) else value
    return given


def data_args(given: dict[str, Any]) -> DataArgs:
    """The data group of the values given, with Megatron-LM's tokenizer for a vocabulary and merge file alone."""
    if "tokenizer_type" not in given and given.get("vocab_file") and given.get("merge_file"):
        # What Megatron-LM's GPT examples mean by giving only the two files.
        given = {**given, "tokenizer_type": "GPT2BPETokenizer"}
    return DataArgs(**given)


def make_config(
    *, world_size: int | None = None, default_world_size: int = 1, **groups: dict[str, Any]
) -> TrainingConfig:
    """Build a TrainingConfig from per-group keyword dicts (as parse_args does). Pure: no files, no environment.

    The world size is ``world_size``, else ``--world-size``, else ``default_world_size`` (the launcher's
    ``WORLD_SIZE``, which the caller reads). The tokenizer's vocabulary is filled in by
    ``megatron_ext.data.preflight``, which opens the files.
    """
    built: dict[str, Any] = {name: cls(**groups.get(name, {})) for name, cls in GROUPS.items() if cls is not DataArgs}
    built["data"] = data_args(groups.get("data", {}))
    model: ModelArgs = built["model"]
    parallel: ParallelArgs = built["parallel"]
    batch: BatchArgs = built["batch"]
    optim: OptimizerArgs = built["optim"]
    run: RunArgs = built["run"]
    data: DataArgs = built["data"]

    if world_size is None:
        world_size = parallel.world_size or default_world_size
    if not (data.mock_data or data.data_path or data.train_data_path or data.data_args_path) and not (
        data.per_split_data_args_path
    ):
        raise ConfigError("no training data: give --mock-data or --data-path PREFIX [...]")
    if data.mock_data and model.vocab_size is None and data.tokenizer_type == "NullTokenizer":
        model = dataclasses.replace(model, vocab_size=1023)
    if run.override_opt_param_scheduler and run.use_checkpoint_opt_param_scheduler:
        raise ConfigError(
            "--override-opt_param-scheduler and --use-checkpoint-opt_param-scheduler contradict each other; give one"
        )
    if run.distrib_optim_fully_reshardable_mem_efficient and not run.dist_ckpt_optim_fully_reshardable:
        raise ConfigError(
            "--distrib-optim-fully-reshardable-mem-efficient only applies with --dist-ckpt-optim-fully-reshardable"
        )
    if parallel.use_distributed_optimizer and optim.optimizer in EMERGING and not optim.bf16:
        # Megatron-Core 0.19.2's LayerWiseDistributedOptimizer wraps its optimizers in its mixed-precision one for
        # bf16 only; in fp32 it chains them raw and fails before the first step.
        raise ConfigError(
            f"--optimizer {optim.optimizer} with --use-distributed-optimizer (Megatron-Core's layer-wise distributed "
            "optimizer) trains with --bf16 only in Megatron-Core 0.19.2; add --bf16, or drop --use-distributed-optimizer"
        )
    if optim.optimizer == "soap" and run.save and not run.no_save_optim:
        raise ConfigError(
            "--optimizer soap with --save: Megatron-Core 0.19.2 cannot checkpoint SOAP's preconditioners (its sharded "
            "optimizer state takes every state tensor to be its weight's shape); add --no-save-optim (a resume then "
            "starts SOAP afresh) or drop --save"
        )
    packing = data.packed_documents_problem(
        attention_backend=model.attention_backend, cp=parallel.context_parallel_size
    )
    if packing is not None:
        raise ConfigError(packing)
    problems = iterations.unit_problems(optim, run, batch, train_iters_given="train_iters" in groups.get("run", {}))
    if problems:
        raise ConfigError("; ".join(problems))

    cross_group_problems(model, parallel, optim, device=run.device)
    parallel, adjustments = megatron_lm_adjustments(parallel)
    layout = build_layout(model, parallel, batch, world_size=world_size)
    batch = dataclasses.replace(batch, global_batch_size=layout.global_batch_size)
    pipeline_p2p_problems(parallel, layout)
    zero_bubble_problems(parallel, layout, transformer_engine=without_transformer_engine(model, run.device) is None)
    wgrad_deferral_problems(parallel, layout)
    problems = iterations.ramp_problems(batch, layout)
    if problems:
        raise ConfigError("\n".join(problems))
    if run.train_samples is not None:
        run = dataclasses.replace(run, train_iters=iterations.training_iterations(run, batch, layout))
    problems = iterations.lr_problems(iterations.lr_steps(optim, run, layout.global_batch_size))
    if problems:
        raise ConfigError("; ".join(problems))
    return TrainingConfig(
        adjustments=adjustments,
        model=model,
        parallel=parallel,
        batch=batch,
        optim=optim,
        data=data,
        run=run,
        layout=layout,
    )


def without_transformer_engine(model: ModelArgs, device: str) -> str | None:
    """The flag that keeps Transformer Engine's layers out of the run whatever is installed (the local spec's
    flag, or ``--device cpu``), or None: on a GPU with Transformer Engine they are built."""
    return model.local_spec_flag or ("--device cpu" if device == "cpu" else None)


def cross_group_problems(model: ModelArgs, parallel: ParallelArgs, optim: OptimizerArgs, *, device: str) -> None:
    """The rules between argument groups that no layout changes, as a ConfigError: what needs Transformer Engine's
    layers where they are not built, and what needs the distributed optimizer without it. ``pretrain_gpt.py``
    checks them before it builds anything, and the layout calculator before it prices a command that would stop
    here (``device``: ``cuda`` for the calculator's GPUs)."""
    if (refusal := context_parallel_problem(model, parallel.context_parallel_size)) is not None:
        raise refusal
    no_te = without_transformer_engine(model, device)
    if no_te is not None:  # Transformer Engine's layers are never built: what needs them is refused here
        if parallel.context_parallel_size > 1:
            raise context_parallel_refusal(parallel.context_parallel_size, f"which {no_te} does not build")
        asked = transformer_engine_features(optim, parallel)
        if asked:
            raise ConfigError(transformer_engine_refusal(asked, f"which {no_te} does not build"))
    if optim.use_precision_aware_optimizer and not parallel.use_distributed_optimizer:
        raise ConfigError("--use-precision-aware-optimizer needs --use-distributed-optimizer (as Megatron-Core "
                          "requires): its states are the distributed optimizer's shards; give it")  # fmt: skip
    if optim.use_precision_aware_optimizer and device == "cpu":
        raise ConfigError(precision_aware_refusal("this run is on CPU (--device cpu)"))
    if device == "cpu" and (problem := gloo_problem(parallel)):
        raise ConfigError(problem)
    if parallel.defer_embedding_wgrad_compute and model.no_gradient_accumulation_fusion:
        raise ConfigError(
            "--defer-embedding-wgrad-compute runs the deferred GEMMs fused with their accumulation, which "
            "--no-gradient-accumulation-fusion turns off: drop one of the two (Megatron-Core refuses the pair)"
        )
    if device == "cpu" and parallel.defer_embedding_wgrad_compute:
        raise ConfigError(wgrad_deferral_refusal("this run is on CPU (--device cpu)"))
    if optim.fp8_param_gather and not parallel.use_distributed_optimizer:
        raise ConfigError("--fp8-param-gather all-gathers the distributed optimizer's weights: give "
                          "--use-distributed-optimizer (as Megatron-LM requires)")  # fmt: skip


def transformer_engine_features(optim: OptimizerArgs, parallel: ParallelArgs) -> list[str]:
    """The flags given that only Transformer Engine's layers implement (FP8, TP communication overlap)."""
    return [
        *([f"--fp8-format {optim.fp8_format}"] if optim.fp8_format else []),
        *(["--tp-comm-overlap"] if parallel.tp_comm_overlap else []),
    ]


def transformer_engine_refusal(features: list[str], why: str) -> str:
    """One line: the features, why this run cannot have them, and what would."""
    return (
        f"{' and '.join(features)} need Transformer Engine's layers, {why}; run on GPUs with Transformer Engine "
        "(--transformer-impl auto or transformer_engine), or drop them"
    )


def wgrad_deferral_refusal(why: str) -> str:
    """One line: why this run cannot defer the output layer's weight gradients, and what to do."""
    return (
        "--defer-embedding-wgrad-compute: Megatron-Core runs the deferred GEMMs with apex's fused weight-gradient "
        f"kernel (fused_weight_gradient_mlp_cuda), and {why}; run on GPUs with apex's CUDA extensions, or drop the "
        "flag (it only moves work within the step)"
    )


def precision_aware_refusal(why: str) -> str:
    """One line: the precision-aware optimizer needs Transformer Engine's FusedAdam, ``why`` this run lacks it."""
    return (
        f"--use-precision-aware-optimizer needs Transformer Engine's FusedAdam (CUDA), and {why}; run on GPUs with "
        "Transformer Engine installed, or drop it and its --main-grads-dtype, --main-params-dtype, --exp-avg-dtype "
        "and --exp-avg-sq-dtype"
    )

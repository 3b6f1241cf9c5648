"""Resolve a recipe's environment into the ``pretrain_gpt.py`` command line (``recipes/common.sh`` calls this).

Bash only launches; it never re-encodes a flag. ``recipes/common.sh`` runs::

    python -m megatron_ext.cli.recipe -- "${MODEL[@]}" "${TRAINING[@]}"

(after exporting the variables ``--variables`` lists) and evaluates what it prints: shell assignments (every value quoted with
``shlex.quote``) of

* ``pretrain_args``: the whole ``pretrain_gpt.py`` command line: the recipe's
  ``MODEL`` (``--model NAME`` expanded to the preset's flags), the layout,
  batch, precision and recompute variables, the recipe's ``TRAINING``, data,
  run and checkpoint variables, then ``EXTRA_ARGS``;
* ``calculator_args``: the part of it that ``tools/layout.py`` models (the
  flag table's ``estimate=True`` fields), for the memory estimate;
* ``serial_cuda_connections``: 1 when ``CUDA_DEVICE_MAX_CONNECTIONS=1`` is
  needed (``config.runtime``);
* the exit codes (``EXIT_*``, ``config.exit_codes``) and ``TRACKER_FILENAME``.

Variables that set one flag are named in the flag table (``env=`` on the
field, e.g. ``TP`` → ``--tensor-model-parallel-size``); the few below that
set several flags, or none, are here. An empty variable is unset. A value
that is not valid for its flag exits with code 2 and names the variable.
Imports only ``megatron_ext.config`` (no torch), so it runs on a login node.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from megatron_ext.config.exit_codes import ExitCode, fail
from megatron_ext.config.flags import flag_of, options, value_type
from megatron_ext.config.runtime import TRACKER_FILENAME, serial_cuda_connections
from megatron_ext.config.training_config import GROUPS, expand_preset


@dataclass(frozen=True)
class Setting:
    """A recipe variable that is not one field of the flag table."""

    name: str
    default: str
    help: str


SETTINGS = (
    Setting("PRECISION", "bf16", "bf16 | fp16 | fp32: --bf16, --fp16 or neither."),
    Setting("RECOMPUTE", "none", "none | selective | full (full: uniform, one layer per checkpoint)."),
    Setting("VP_LAYERS", "0", "Layers per virtual pipeline stage (interleaved 1F1B); 0: not interleaved."),
    Setting(
        "SCHEDULE",
        "1f1b",
        "1f1b: Megatron-Core's 1F1B (interleaved with VP_LAYERS); zb-h1: the ZB-H1 zero-bubble schedule "
        "(--enable-zero-bubble; needs VP_LAYERS=0); zb-interleaved: the zero-bubble interleaved schedule "
        "(--enable-zero-bubble with VP_LAYERS).",
    ),
    Setting(
        "OVERLAP",
        "",
        "1: overlap the DP gradient reduce (and, with the distributed optimizer, the parameter all-gather) with "
        "compute and fuse the cross entropy; default 1 on GPUs, 0 with DEVICE=cpu.",
    ),
    Setting("DATA_PATH", "", "Dataset prefixes, optionally weighted ('W1 P1 W2 P2'); empty: --mock-data."),
    Setting(
        "DATA_ARGS_PATH",
        "",
        "A blend file instead of DATA_PATH (--data-args-path: e.g. written by tools/merge_datasets.py --write-blend).",
    ),
    Setting("CHECKPOINT_DIR", "", "--save and --load: a requeued job resumes from it."),
    Setting("EXTRA_ARGS", "", "More pretrain_gpt.py arguments, split on whitespace."),
    Setting(
        "ELASTIC",
        "0",
        "1: the layout follows the allocation (recipes/common.sh re-plans it with megatron_ext.cli.elastic), and "
        "the distributed optimizer saves its state fully reshardable (--dist-ckpt-optim-fully-reshardable), "
        "loadable under any layout.",
    ),
)
"""Recipe variables with more to them than one flag."""

DEFAULTS: Mapping[str, str] = {
    "DEVICE": "cuda",
    "TRAIN_ITERS": "100",
    "LOG_INTERVAL": "10",
    "SAVE_INTERVAL": "1000",
    "EVAL_INTERVAL": "1000",
    "EVAL_ITERS": "10",
    "DATA_SPLIT": "969,30,1",
    "TOKENIZER_TYPE": "GPTSentencePieceTokenizer",
    **{s.name: s.default for s in SETTINGS},
}
"""The recipes' defaults where they differ from pretrain_gpt.py's (a recipe's own `: "${X:=...}"` wins)."""


class RecipeError(ValueError):
    """A recipe variable with a value its flag cannot take."""


def table_variables() -> list[tuple[str, str, dataclasses.Field[object]]]:
    """(variable, group, field) for every flag-table field a recipe variable sets."""
    return [
        (f.metadata["env"], group, f) for group, cls in GROUPS.items() for f in options(cls) if f.metadata.get("env")
    ]


def _get(env: Mapping[str, str], name: str) -> str:
    return env.get(name, "") or DEFAULTS.get(name, "")


def _switch(name: str, value: str) -> bool:
    if value not in ("0", "1"):
        raise RecipeError(f"{name} must be 0 or 1, got {value!r}")
    return value == "1"


def _table_flags(env: Mapping[str, str], *groups: str) -> list[str]:
    """The flags of the variables named in the flag table for fields of ``groups``, in table order."""
    argv: list[str] = []
    for name, group, f in table_variables():
        if group not in groups:
            continue
        value = _get(env, name)
        if not value:
            continue
        tp, _ = value_type(GROUPS[group], f.name)
        if tp is bool:
            if _switch(name, value):
                argv.append(flag_of(f))
        else:
            argv += [flag_of(f), value]
    return argv


def resolve(recipe_argv: Sequence[str], env: Mapping[str, str]) -> tuple[list[str], list[str]]:
    """(pretrain_gpt.py arguments, calculator arguments) for the recipe's MODEL + TRAINING and ``env``."""
    device = _get(env, "DEVICE")
    argv = expand_preset(recipe_argv)

    precision = _get(env, "PRECISION")
    if precision not in ("bf16", "fp16", "fp32"):
        raise RecipeError(f"PRECISION must be bf16, fp16 or fp32, got {precision!r}")
    derived = [] if precision == "fp32" else [f"--{precision}"]
    recompute = _get(env, "RECOMPUTE")
    recompute_flags = {
        "none": [],
        "selective": ["--recompute-granularity", "selective"],
        "full": ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"],
    }
    if recompute not in recompute_flags:
        raise RecipeError(f"RECOMPUTE must be none, selective or full, got {recompute!r}")
    derived += recompute_flags[recompute]
    vp_layers = _get(env, "VP_LAYERS")
    if vp_layers not in ("", "0"):
        derived += ["--num-layers-per-virtual-pipeline-stage", vp_layers]
    schedule = _get(env, "SCHEDULE")
    if schedule not in ("1f1b", "zb-h1", "zb-interleaved"):
        raise RecipeError(f"SCHEDULE must be 1f1b, zb-h1 or zb-interleaved, got {schedule!r}")
    chunked = vp_layers not in ("", "0") or env.get("VP", "") not in ("", "1")
    if schedule == "zb-h1" and chunked:
        raise RecipeError(
            "SCHEDULE=zb-h1 runs one model chunk per rank: set VP_LAYERS=0 and no VP (or SCHEDULE=zb-interleaved)"
        )
    if schedule == "zb-interleaved" and not chunked:
        raise RecipeError("SCHEDULE=zb-interleaved needs virtual stages: set VP_LAYERS or VP (or SCHEDULE=zb-h1)")
    if schedule != "1f1b":
        derived.append("--enable-zero-bubble")
    overlap = _switch("OVERLAP", _get(env, "OVERLAP") or ("0" if device == "cpu" else "1"))
    distributed_optimizer = _switch("DISTRIBUTED_OPTIMIZER", _get(env, "DISTRIBUTED_OPTIMIZER") or "0")
    if _switch("ELASTIC", _get(env, "ELASTIC")) and distributed_optimizer:
        # The per-rank format loads under another DP only; an elastic job may change TP, PP and VP.
        derived.append("--dist-ckpt-optim-fully-reshardable")
    if overlap:
        derived.append("--overlap-grad-reduce")
        if distributed_optimizer:
            derived.append("--overlap-param-gather")

    layout = _table_flags(env, "model", "parallel", "batch", "optim")
    data_path, blend_file = _get(env, "DATA_PATH").split(), _get(env, "DATA_ARGS_PATH")
    if data_path and blend_file:
        raise RecipeError("DATA_PATH and DATA_ARGS_PATH both name the data: set one")
    if data_path or blend_file:
        name = "DATA_PATH" if data_path else "DATA_ARGS_PATH"
        if not _get(env, "TOKENIZER_MODEL"):
            raise RecipeError(f"{name} is set: set TOKENIZER_MODEL to the tokenizer model file too")
        given = ["--data-path", *data_path] if data_path else ["--data-args-path", blend_file]
        data = [*given, *_table_flags(env, "data")]
    else:
        data = ["--mock-data"]
    checkpoints = _get(env, "CHECKPOINT_DIR")
    run = _table_flags(env, "run")
    run += ["--save", checkpoints, "--load", checkpoints] if checkpoints else []
    run.append("--exit-signal-handler")
    fused = ["--cross-entropy-loss-fusion"] if overlap else []
    extra = _get(env, "EXTRA_ARGS").split()

    pretrain = [*argv, *layout, *derived, *fused, *data, *run, *extra]
    _check(pretrain)
    return pretrain, calculator_args(pretrain)


def _check(pretrain: list[str]) -> None:
    """Refuse values argparse would refuse (wrong type or choice), naming the flag, before anything launches."""
    from megatron_ext.config.training_config import build_parser

    parser = build_parser()
    parser.exit_on_error = False
    try:
        parser.parse_known_args(pretrain)
    except argparse.ArgumentError as exc:
        raise RecipeError(f"{exc} (from the recipe's variables or its MODEL/TRAINING arrays)") from None


def calculator_args(pretrain: Sequence[str]) -> list[str]:
    """The flags of a pretrain_gpt.py command line that the layout calculator models, with their values."""
    modelled = {
        spelling
        for cls in GROUPS.values()
        for f in options(cls, estimate=True)
        for spelling in (flag_of(f), *f.metadata.get("aliases", ()))
    }
    out: list[str] = []
    keep = False
    for arg in pretrain:
        if arg.startswith("--"):
            keep = arg in modelled
        if keep:
            out.append(arg)
    return out + _tokenizer_vocabulary(pretrain)


def _tokenizer_vocabulary(pretrain: Sequence[str]) -> list[str]:
    """``--tokenizer-vocab-size N`` when the run trains with a tokenizer file of its own, read from it as the run's
    preflight reads it: the estimate then pads the vocabulary the run pads (not ``--vocab-size``'s). Nothing for
    the tokenizers that ``--vocab-size`` sizes, or a tokenizer that cannot be read here (the dry run says why)."""
    from megatron_ext.config.tokenizer_types import VOCAB_SIZE_TOKENIZERS
    from megatron_ext.config.training_config import build_parser, data_args, group_values
    from megatron_ext.data.sources import DataError, tokenizer_for

    data = data_args(group_values(build_parser().parse_known_args(list(pretrain))[0])["data"])
    if data.mock_data or data.tokenizer_type in VOCAB_SIZE_TOKENIZERS:
        return []
    try:
        return ["--tokenizer-vocab-size", str(tokenizer_for(data, vocab_size=None).vocab_size)]
    except DataError:
        return []


def _last_value(argv: Sequence[str], flag: str) -> str | None:
    """The value of the last ``flag`` in ``argv`` (argparse's rule: the last one wins), or None."""
    value = None
    for i, arg in enumerate(argv[:-1]):
        if arg == flag:
            value = argv[i + 1]
    return value


def shell_assignments(pretrain: list[str], calculator: list[str], *, device: str) -> str:
    """What common.sh evaluates: arrays, flags and constants, every value quoted."""

    def array(name: str, values: Sequence[str]) -> str:
        return f"{name}=({' '.join(shlex.quote(v) for v in values)})"

    tp = int(_last_value(pretrain, "--tensor-model-parallel-size") or 1)
    lines = [
        array("pretrain_args", pretrain),
        array("calculator_args", calculator),
        f"serial_cuda_connections={int(serial_cuda_connections(tensor_model_parallel_size=tp))}",
        f"DEVICE={shlex.quote(device)}",
        f"TRACKER_FILENAME={shlex.quote(TRACKER_FILENAME)}",
        *(f"EXIT_{code.name}={int(code)}" for code in ExitCode),
    ]
    return "\n".join(lines) + "\n"


def variables() -> list[str]:
    """Every environment variable the resolver reads (common.sh exports them before calling it)."""
    return sorted({name for name, _, _ in table_variables()} | {s.name for s in SETTINGS} | set(DEFAULTS))


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--variables"]:
        print("\n".join(variables()))
        return ExitCode.OK
    if args[:1] == ["--"]:
        args = args[1:]
    try:
        pretrain, calculator = resolve(args, os.environ)
    except RecipeError as exc:
        return fail(exc, ExitCode.INVALID, prefix="[recipe] error")
    sys.stdout.write(shell_assignments(pretrain, calculator, device=_get(os.environ, "DEVICE")))
    return ExitCode.OK


if __name__ == "__main__":
    sys.exit(main())

"""``tools/layout.py --calibrate METRICS [...] --profile-out FILE.json``: a profile fitted to the user's runs.

Each metrics file is a ``pretrain_gpt.py --metrics-file`` (``--timing-log-level 2`` for the compute timers);
its run record gives the model, layout and cluster (``estimate.calibration``). The profile file written is
what ``--gpu FILE.json`` reads, here, in the recipes (``GPU_PROFILE``) and in the elastic re-plan.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import typing
from pathlib import Path

from megatron_ext.cli import layout_args
from megatron_ext.config.arguments import ConfigError
from megatron_ext.config.exit_codes import ExitCode, fail
from megatron_ext.estimate.calibration import (
    Calibration,
    CalibrationError,
    Case,
    MeasuredRun,
    base_profile,
    fit_profile,
    read_runs,
)
from megatron_ext.estimate.hardware import GpuProfile, get_profile, profile_document
from megatron_ext.estimate.search import Cluster
from megatron_ext.parallel.layout import LayoutError

OWN_FLAGS = ("calibrate", "gpu", "profile_out", "profile_name")
"""What ``--calibrate`` reads from the command line; the rest comes from the runs' records."""


def run(args: argparse.Namespace, out: typing.TextIO, err: typing.TextIO) -> int:
    """Read the runs, fit, print the fit, write the profile; the exit code."""
    try:
        defaults = vars(layout_args.build_parser().parse_args([]))
        ignored = [f"--{k.replace('_', '-')}" for k, v in vars(args).items() if k not in OWN_FLAGS and v != defaults[k]]
        if ignored:
            raise CalibrationError(
                f"--calibrate takes each run's model, layout and cluster from its metrics file, and prints text: "
                f"drop {' '.join(ignored)} (with --calibrate only --gpu, --profile-out and --profile-name are read)"
            )
        output = _output_path(args.profile_out)
        runs = [r for path in args.calibrate for r in read_runs(path)]
        devices = sorted({r.device for r in runs})
        if len(devices) > 1:
            raise CalibrationError(
                f"the runs ran on different devices ({', '.join(devices)}): one profile describes one kind; "
                "calibrate each apart"
            )
        base = get_profile(args.gpu) if args.gpu is not None else base_profile(runs[0])
        cases = [_case(r) for r in runs]
        calibration = fit_profile(base, cases, name=args.profile_name or output.stem)
    except (CalibrationError, ValueError, ConfigError, LayoutError) as exc:
        return fail(exc, ExitCode.INVALID, file=err)
    _write(output, profile_document(calibration.profile, **calibration.document()))
    print("\n".join([*report(calibration), "", f"wrote {output}: use it with --gpu {output}"]), file=out)
    return ExitCode.OK


def _output_path(path: Path | None) -> Path:
    if path is None:
        raise CalibrationError("--calibrate needs --profile-out FILE.json: where to write the fitted profile")
    if path.suffix.lower() != ".json":
        raise CalibrationError(f"--profile-out {path}: name it FILE.json (--gpu reads profile files by that suffix)")
    if path.exists():
        raise CalibrationError(f"--profile-out {path} exists; it is not overwritten: give a new path or remove it")
    if not path.parent.is_dir():
        raise CalibrationError(f"--profile-out {path}: the directory {path.parent} does not exist")
    return path


def _case(measured: MeasuredRun) -> Case:
    """The model and layout of a run, rebuilt from its record's flags as the calculator builds them."""
    flags = [
        *measured.calculator_flags,
        "--gpus",
        str(measured.world_size),
        "--gpus-per-node",
        str(measured.gpus_per_node),
    ]
    try:
        args = layout_args.build_parser().parse_args(flags)
    except SystemExit:
        raise CalibrationError(f"{measured.source}: its run record's flags are not the calculator's: {flags}") from None
    workload, _ = layout_args.workload_of(args)
    cluster = Cluster(gpus=measured.world_size, gpus_per_node=measured.gpus_per_node, gpu=_ANY_PROFILE)
    layout, _ = layout_args.evaluate_layout_from_flags(args, workload, cluster, args.global_batch_size)
    return Case(run=measured, workload=workload, layout=layout)


_ANY_PROFILE: GpuProfile = get_profile("h100-sxm")
"""Layouts are validated without a profile's rates; any will do."""


def report(calibration: Calibration) -> list[str]:
    """The fit: every measured time against the calibrated prediction, then the values fitted and kept."""
    lines = [f"calibrated {calibration.profile.name} from {calibration.base.name}:", ""]
    width = max(len(run) for run, *_ in calibration.rows)
    lines.append(f"  {'run':<{width}}  {'time':<9}  {'measured ms':>11}  {'predicted ms':>12}  {'error':>6}")
    for run, what, measured, predicted in calibration.rows:
        lines.append(
            f"  {run:<{width}}  {what:<9}  {measured * 1e3:>11.1f}  {predicted * 1e3:>12.1f}  "
            f"{predicted / measured - 1:>+6.1%}"
        )
    lines += ["", "fitted:"]
    for name in calibration.fitted:
        before, after = getattr(calibration.base, name), getattr(calibration.profile, name)
        lines.append(f"  {name}: {_value(before)} -> {_value(after)}")
    if calibration.profile.peak_flops != calibration.base.peak_flops:
        lines.append(
            f"  peak_flops: {_value(calibration.base.peak_flops)} -> {_value(calibration.profile.peak_flops)} "
            "(the runs beat the base's peak)"
        )
    if calibration.kept:
        lines.append(
            "kept from the base (these runs do not constrain them; a run that exercises them would): "
            + ", ".join(calibration.kept)
        )
    return lines


def _value(value: float | None) -> str:
    return "none" if value is None else f"{value:.4g}"


def _write(path: Path, document: dict[str, typing.Any]) -> None:
    """Write ``document`` to ``path`` whole or not at all (a temporary file beside it, renamed)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(document, handle, indent=1)
            handle.write("\n")
        os.link(tmp, path)  # fails rather than replace a file that appeared meanwhile
    finally:
        os.unlink(tmp)

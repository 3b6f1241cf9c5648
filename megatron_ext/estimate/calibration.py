"""A hardware profile fitted to the user's own runs (``tools/layout.py --calibrate``).

The published profiles (``hardware.PROFILES``) were fitted to other people's clusters. A short run on the
user's own hardware says more about it: ``pretrain_gpt.py --metrics-file`` records the run's model, layout and
cluster first (``run_record``, in the calculator's own flags) and then, every ``--log-interval``, the step's
time and, with ``--timing-log-level 2``, Megatron-Core's compute and optimizer timers.

From one or more such runs this module fits the profile's rates by least squares on the logarithms of the
measured over the predicted times (``fit_profile``):

* ``step``: the whole iteration (``elapsed_ms``) against the estimated step;
* ``compute``: Megatron-Core's ``forward-compute`` + ``backward-compute`` (the slowest rank's, which include
  the tensor-parallel collectives inside the layers) against the estimate's compute and TP/CP communication;
* ``optimizer``: the ``optimizer`` timer against Adam's update, where it times the update alone (without the
  distributed optimizer's parameter all-gather, which it also holds when DP > 1).

The fitted values are the GEMMs' rate (``compute_efficiency``, the peak raised where a run beats it), the
element-wise kernels' share of memory bandwidth and the bandwidth itself (the optimizer streams at it), the
collective bandwidths inside and between nodes, the transport's latency per message
(``GpuProfile.link_latency_s``) and a layer pass's fixed overhead (``GpuProfile.pass_overhead_s``). A value the runs do not constrain (no run spans nodes, say) keeps the base
profile's and the result says so; a weak pull towards the base (``PRIOR_WEIGHT``) keeps those that the runs
constrain only together from drifting apart. What is not fitted: fused attention's kernel curves, FP8, the GEMM
shape losses (``sms``, ``gemm_depth_half``).
"""

from __future__ import annotations

import dataclasses
import math
import shlex
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from megatron_ext.config.training_config import TrainingConfig
from megatron_ext.estimate.hardware import GIB, PROFILES, GpuProfile
from megatron_ext.estimate.metrics_file import RUN_RECORD, MetricsFileError, read_metrics_file
from megatron_ext.estimate.search import Cluster, evaluate, pretrain_flags
from megatron_ext.estimate.workload import Workload
from megatron_ext.parallel.layout import ParallelLayout

FITTED = (
    "compute_efficiency",
    "memory_bandwidth",
    "link_latency_s",
    "memory_efficiency",
    "intra_node_bandwidth",
    "inter_node_bandwidth",
    "pass_overhead_s",
)
"""The profile fields ``fit_profile`` fits, where the runs constrain them. In this order of preference where the
runs cannot tell two apart (``_separable``): messages all of one size cost latency or bandwidth alike, and the
latency is the one such runs measure."""

INDEPENDENCE = 0.1
"""A value is fitted only if its effect on the runs' times is at least this share (by norm) outside what the
values before it in ``FITTED`` already explain."""

PRIOR_WEIGHT = 1e-3
"""Weight of each fitted value's log-distance from the base profile's, against the runs' log-residuals: small,
so that it only decides what the runs leave open (a factor of 10 costs what a 0.23% residual does)."""

SENSITIVITY_FLOOR = 0.02
"""A value the runs constrain moves some predicted time by at least this share when it is 10 times larger or
smaller (wide, because the base profile's value may be far from the truth)."""

WARM_UP_SHARE = 1 / 3
"""The first third of a run's logged iterations (at least one) are warm-up: allocation, caches, compilation."""


class CalibrationError(ValueError):
    """Metrics that cannot calibrate a profile; the message says which file and what to do."""


def run_record(cfg: TrainingConfig, *, gpus_per_node: int, device: str, device_memory_bytes: int) -> dict[str, Any]:
    """The metrics file's start record of a run: its model, layout and options in ``tools/layout.py``'s flags
    (``search.pretrain_flags``, the flags the estimate reads), and the cluster it ran on (the writer adds the
    start's marks: ``metrics_file.start_marks``)."""
    # A run with a tokenizer of its own has no --vocab-size: the record gives the tokenizer's for both.
    model = cfg.model if cfg.model.vocab_size else dataclasses.replace(cfg.model, vocab_size=cfg.vocab_size)
    workload = Workload.of_flags(
        model, cfg.optim, cfg.parallel, cfg.batch, tokenizer_vocab_size=cfg.tokenizer_vocab_size
    )
    flags = [word for flag in pretrain_flags(workload, cfg.layout) for word in shlex.split(flag)]
    if cfg.tokenizer_vocab_size is not None:
        flags += ["--tokenizer-vocab-size", str(cfg.tokenizer_vocab_size)]
    return {
        RUN_RECORD: {
            "calculator_flags": flags,
            "world_size": cfg.layout.world_size,
            "gpus_per_node": gpus_per_node,
            "device": device,
            "device_memory_bytes": device_memory_bytes,
            "timing_log_level": cfg.run.timing_log_level,
        }
    }


@dataclass(frozen=True, kw_only=True)
class MeasuredRun:
    """One run's record and its measured times per iteration, seconds (medians after warm-up)."""

    source: str
    """The metrics file (and the run's place in it when the file holds several)."""
    calculator_flags: tuple[str, ...]
    world_size: int
    gpus_per_node: int
    device: str
    """``cpu``, or the CUDA device's name."""
    device_memory_bytes: int
    iterations: int
    """Logged iterations measured (after warm-up)."""
    times: dict[str, float]
    """``step``, and with ``--timing-log-level 2`` ``compute``; ``optimizer`` where it times the update alone."""


def read_runs(path: Path) -> list[MeasuredRun]:
    """The runs in one ``--metrics-file`` (a file appended to by several runs holds each); a CalibrationError
    naming the file and the fix when it has none that can be used."""
    try:
        metrics = read_metrics_file(path)
    except MetricsFileError as exc:
        raise CalibrationError(f"--calibrate {exc}") from None
    # Every start measured its own iterations, those a later start logged again included.
    segments = [
        (start.record, [r.values for r in metrics.all_rows if r.start == start.index and _timed(r.values)])
        for start in metrics.starts
    ]
    if not segments:
        raise CalibrationError(
            f"--calibrate {path}: no run record; give the --metrics-file of a pretrain_gpt.py run (this "
            "project's; it records the model, layout and cluster first)"
        )
    runs = []
    for index, (record, rows) in enumerate(segments):
        name = str(path) if len(segments) == 1 else f"{path} (run {index + 1} of {len(segments)})"
        if len(rows) < 2:
            continue
        measured = rows[max(1, int(len(rows) * WARM_UP_SHARE)) :]
        runs.append(_measured(name, record, measured))
    if not runs:
        raise CalibrationError(
            f"--calibrate {path}: no run logged two iterations with their timers; train at least 2 logged "
            "iterations (e.g. --train-iters 8 --log-interval 1) with --timing-log-level 2"
        )
    return runs


def _timed(row: dict[str, Any]) -> bool:
    """Whether ``row`` is a logged iteration with its times (``elapsed_ms`` and the timers)."""
    return "elapsed_ms" in row and "time_ms" in row


RECORD_KEYS = ("calculator_flags", "world_size", "gpus_per_node", "device", "device_memory_bytes")
"""What a run record (``pretrain_gpt.py --metrics-file``'s first line of each start) gives the calibration."""


def _milliseconds(value: Any) -> float | None:
    """A logged time in ms, or None where the row has none that can be used (missing, not a number, not > 0)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) and value > 0 else None


def _timers(row: dict[str, Any], *names: str) -> float | None:
    """The sum of a row's timers ``names`` in ms, or None where one is missing or unusable."""
    timers = row.get("time_ms")
    values = [_milliseconds(timers.get(n)) for n in names] if isinstance(timers, dict) else [None]
    return None if None in values else sum(v for v in values if v is not None)


def _measured(name: str, record: dict[str, Any], rows: list[dict[str, Any]]) -> MeasuredRun:
    def median_ms(get: Callable[[dict[str, Any]], Any]) -> float | None:
        values = [v for v in (_milliseconds(get(row)) for row in rows) if v is not None]
        return statistics.median(values) / 1000 if values else None

    missing = [key for key in RECORD_KEYS if key not in record]
    if missing:
        raise CalibrationError(
            f"--calibrate {name}: its run record lacks {', '.join(missing)}; give the --metrics-file of this "
            "project's pretrain_gpt.py, whose run record carries them"
        )
    flags = tuple(record["calculator_flags"])
    times = {"step": median_ms(lambda r: r["elapsed_ms"])}
    if times["step"] is None:
        raise CalibrationError(
            f"--calibrate {name}: no logged iteration has a positive elapsed_ms (a number of milliseconds); the "
            "file is not as pretrain_gpt.py writes it: train the run again with --metrics-file"
        )
    if record.get("timing_log_level", 0) >= 2:
        times["compute"] = median_ms(lambda r: _timers(r, "forward-compute", "backward-compute"))
    sharded = "--use-distributed-optimizer" in flags and record["world_size"] > 1
    if not sharded:
        times["optimizer"] = median_ms(lambda r: _timers(r, "optimizer"))
    return MeasuredRun(
        source=name,
        calculator_flags=flags,
        world_size=int(record["world_size"]),
        gpus_per_node=int(record["gpus_per_node"]),
        device=str(record["device"]),
        device_memory_bytes=int(record["device_memory_bytes"]),
        iterations=len(rows),
        times={k: v for k, v in times.items() if v is not None and v > 0},
    )


@dataclass(frozen=True)
class Case:
    """A measured run with the model and layout it ran (built from its record's flags by the caller)."""

    run: MeasuredRun
    workload: Workload
    layout: ParallelLayout


def predicted_times(workload: Workload, layout: ParallelLayout, cluster: Cluster) -> dict[str, float]:
    """The estimate's counterparts of the measured times (``read_runs``), seconds per iteration."""
    time = evaluate(workload, layout, cluster).time
    return {
        "step": time.step_s,
        "compute": time.compute_s + time.tp_comm_s + time.cp_comm_s,
        "optimizer": time.optimizer_s,
    }


@dataclass(frozen=True)
class Calibration:
    """The fitted profile, what was fitted and kept, and each run's times measured and predicted."""

    profile: GpuProfile
    base: GpuProfile
    fitted: tuple[str, ...]
    kept: tuple[str, ...]
    """Values the runs do not constrain: the base profile's."""
    rows: tuple[tuple[str, str, float, float], ...]
    """(run, time, measured s, predicted s) for every measured time."""

    def document(self) -> dict[str, Any]:
        """How the profile was calibrated, kept in its file beside it."""
        return {
            "calibration": {
                "base_profile": self.base.name,
                "fitted": {name: getattr(self.profile, name) for name in self.fitted},
                "kept_from_base": list(self.kept),
                "runs": [
                    {"run": run, "time": what, "measured_s": measured, "predicted_s": predicted}
                    for run, what, measured, predicted in self.rows
                ],
            }
        }


def fit_profile(base: GpuProfile, cases: Sequence[Case], *, name: str) -> Calibration:
    """``base`` with ``FITTED`` values fitted to the measured times of ``cases`` (module docstring)."""
    start = dataclasses.replace(
        base,
        link_latency_s=base.link_latency_s or _DEFAULT_LATENCY_S,
        pass_overhead_s=base.pass_overhead_s or _DEFAULT_OVERHEAD_S,
    )
    x0 = [math.log(getattr(start, field)) for field in FITTED]

    def profile_at(x: Sequence[float]) -> GpuProfile:
        values: dict[str, Any] = {field: math.exp(v) for field, v in zip(FITTED, x, strict=True)}
        values["memory_efficiency"] = min(values["memory_efficiency"], 1.0)
        return dataclasses.replace(start, **values)

    def residuals(x: Sequence[float]) -> list[float]:
        gpu = profile_at(x)
        out = []
        for case in cases:
            cluster = Cluster(gpus=case.run.world_size, gpus_per_node=case.run.gpus_per_node, gpu=gpu)
            predicted = predicted_times(case.workload, case.layout, cluster)
            out += [math.log(predicted[what] / measured) for what, measured in case.run.times.items()]
        return out

    active = _separable(residuals, x0, [i for i in range(len(FITTED)) if _constrained(residuals, x0, i)])
    x = _least_squares(residuals, x0, active)
    profile = profile_at(x)
    if profile.compute_efficiency > 1:  # the runs beat the base's peak: the peak was wrong, not the share
        scale = profile.compute_efficiency
        profile = dataclasses.replace(
            profile,
            peak_flops=profile.peak_flops * scale,
            peak_flops_fp32=profile.peak_flops_fp32 * scale,
            compute_efficiency=1.0,
        )
    fitted = tuple(FITTED[i] for i in active)
    kept = tuple(f for f in FITTED if f not in fitted)
    # What the runs do not constrain stays exactly the base's (a latency the base has none of, none).
    profile = dataclasses.replace(profile, **{field: getattr(base, field) for field in kept})
    profile = dataclasses.replace(
        profile, name=name, description=f"{base.description}, calibrated on {len(cases)} run(s) of this cluster"
    )
    rows = []
    for case in cases:
        cluster = Cluster(gpus=case.run.world_size, gpus_per_node=case.run.gpus_per_node, gpu=profile)
        predicted = predicted_times(case.workload, case.layout, cluster)
        rows += [(case.run.source, what, measured, predicted[what]) for what, measured in case.run.times.items()]
    return Calibration(profile=profile, base=base, fitted=fitted, kept=kept, rows=tuple(rows))


def base_profile(run: MeasuredRun) -> GpuProfile:
    """The profile a run's device starts the fit from: the published one of its GPU, or ``cpu_profile``."""
    if run.device == "cpu":
        return cpu_profile(memory_bytes=run.device_memory_bytes)
    name = run.device.upper()
    for key, profile in (("H200", "h200"), ("H100", "h100-sxm"), ("A100", "a100-80g")):
        if key in name:
            found = PROFILES[profile]
            if key == "A100" and run.device_memory_bytes < 60 * GIB:
                found = PROFILES["a100-40g"]
            return found
    raise CalibrationError(
        f"{run.source}: no published profile for the device {run.device!r} to start from; give the closest with "
        f"--gpu ({', '.join(PROFILES)})"
    )


def cpu_profile(*, memory_bytes: int) -> GpuProfile:
    """CPU processes on gloo (``--device cpu``): rough rates of one core, only a start for the fit."""
    return GpuProfile(
        name="cpu",
        description="CPU processes (gloo)",
        peak_flops=100e9,
        peak_flops_fp32=100e9,
        memory_bytes=memory_bytes,
        memory_bandwidth=10e9,
        intra_node_bandwidth=2e9,
        inter_node_bandwidth=1e9,
        compute_efficiency=0.5,
        sms=1,  # no waves of tiles: the shape losses are the GPU's
        gemm_depth_half=0.0,
        memory_efficiency=0.5,
        attention_kernels="ampere",
        link_latency_s=100e-6,
        pass_overhead_s=1e-3,
    )


_DEFAULT_LATENCY_S = 20e-6
"""Where the fit starts the transport latency when the base profile has none (NCCL's order of magnitude)."""
_DEFAULT_OVERHEAD_S = 100e-6
"""Where the fit starts a layer pass's fixed overhead when the base has none (a few dozen kernel launches)."""


def _constrained(f: Callable[[Sequence[float]], list[float]], x0: Sequence[float], i: int) -> bool:
    """Whether moving variable ``i`` (a logarithm) by a factor of 10 either way moves some residual by
    ``SENSITIVITY_FLOOR``."""
    base = f(x0)
    for sign in (1, -1):
        moved = list(x0)
        moved[i] += sign * math.log(10)
        if max(abs(a - b) for a, b in zip(f(moved), base, strict=True)) >= SENSITIVITY_FLOOR:
            return True
    return False


def _separable(f: Callable[[Sequence[float]], list[float]], x0: Sequence[float], candidates: list[int]) -> list[int]:
    """The ``candidates`` whose effect on the residuals (their Jacobian column at ``x0``) is not, within
    ``INDEPENDENCE``, a combination of the effects of those chosen before them."""
    import numpy as np

    jac = np.asarray(_jacobian(f, x0))
    chosen: list[int] = []
    for i in candidates:
        column = jac[:, i]
        if chosen:
            basis = jac[:, chosen]
            column = column - basis @ np.linalg.lstsq(basis, column, rcond=None)[0]
        if np.linalg.norm(column) > INDEPENDENCE * np.linalg.norm(jac[:, i]):
            chosen.append(i)
    return chosen


def _jacobian(f: Callable[[Sequence[float]], list[float]], x: Sequence[float], step: float = 1e-3) -> list[list[float]]:
    """Forward differences of ``f`` at ``x``: one row per residual, one column per variable."""
    base = f(x)
    columns = []
    for i in range(len(x)):
        moved = list(x)
        moved[i] += step
        columns.append([(a - b) / step for a, b in zip(f(moved), base, strict=True)])
    return [list(row) for row in zip(*columns, strict=True)]


def _least_squares(
    f: Callable[[Sequence[float]], list[float]], x0: Sequence[float], active: Sequence[int]
) -> list[float]:
    """Levenberg–Marquardt on the ``active`` variables of ``f``'s residuals plus the pull towards ``x0``."""
    import numpy as np

    def full(x: np.ndarray) -> np.ndarray:
        return np.concatenate([np.asarray(f(list(x))), PRIOR_WEIGHT * (x - np.asarray(x0))[active]])

    x = np.asarray(x0, dtype=float)
    if not active:
        return list(x)
    r = full(x)
    damping = 1e-2
    for _ in range(200):
        jac = np.asarray(_jacobian(lambda v: list(full(np.asarray(v))), list(x)))[:, active]
        normal = jac.T @ jac
        gradient = jac.T @ r
        step = np.linalg.solve(normal + damping * (np.diag(np.diag(normal)) + 1e-9 * np.eye(len(active))), -gradient)
        trial = x.copy()
        trial[active] += step
        r_trial = full(trial)
        if r_trial @ r_trial < r @ r:
            converged = r @ r - r_trial @ r_trial < 1e-12
            x, r = trial, r_trial
            damping = max(damping / 3, 1e-9)
            if converged:
                break
        else:
            damping *= 4
            if damping > 1e9:
                break
    return list(x)

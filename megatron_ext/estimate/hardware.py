"""GPU hardware profiles for the layout calculator.

A profile holds what the memory and step-time models need of a GPU and its
cluster: dense tensor-core peak, memory capacity and bandwidth, the bandwidth of collectives
inside a node (NVLink/NVSwitch) and between nodes (one InfiniBand NIC per GPU,
as on DGX/HGX systems), and the calibrated constants: the best fraction of peak
that the transformer's matrix multiplications reach (``compute_efficiency``, and
``fp8_compute_efficiency`` in FP8) before their shapes' losses (``sms`` and a tile's fixed time,
``estimate.kernels``: from GEMM benchmarks by shape, not fitted here), and the fraction of HBM bandwidth its
element-wise kernels reach (``memory_efficiency``), before pipeline bubbles and
exposed communication. Fused attention's share of peak is not fitted: it comes from
kernel benchmarks by shape (``estimate.kernels``; ``attention_kernels`` names the
GPU generation's curves).

Sources (see ``docs/layout-model.md`` for the derivations):

* Peaks, capacities, HBM bandwidth: NVIDIA A100 datasheet (312 TFLOP/s dense
  BF16/FP16, 19.5 TFLOP/s FP32, no FP8, 1,555 GB/s for 40GB and 2,039 GB/s for 80GB),
  H100 SXM and H200 datasheets (989 TFLOP/s dense BF16, 1,979 dense FP8, 67 TFLOP/s FP32,
  3.35 and 4.8 TB/s); capacities as ``nvidia-smi`` reports them (MiB).
* Bandwidths are *effective bus bandwidths* in the sense of nccl-tests
  (``busbw``): a ring all-reduce of ``X`` bytes over ``n`` ranks takes
  ``2·(n−1)/n · X / busbw``. NVLink 3 (A100) is 300 GB/s per direction, NVLink 4
  (H100/H200) 450 GB/s; nccl-tests reach roughly 230 and 370 GB/s. HDR
  InfiniBand is 200 Gb/s = 25 GB/s per GPU, NDR 400 Gb/s = 50 GB/s; about 92 %
  of line rate is reached.
* The constants are the minimax fit to published runs, each GPU on its own
  calibration rows, and are checked against validation rows never fitted
  (``tests/estimate/published.py`` holds both with their sources,
  ``bench/calibrate_time_model.py`` refits): A100 on Narayanan et al. 2021,
  Table 1; H100 on three models of NVIDIA's dgxc-benchmarking H100 tables.
  What no table measures is carried over and says so below.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from megatron_ext.estimate.kernels import gemm_depth_half

GIB = 1024**3
MIB = 1024**2

# Dense bf16/fp16 tensor-core peak, FLOP/s (vendor data sheets), by a part of the name CUDA reports.
# Checked in order, so the more specific names come first. The profiles below take their peaks from here.
PEAK_FLOPS: Mapping[str, float] = MappingProxyType(
    {
        "H100 PCIE": 756e12,
        "H100 NVL": 835e12,
        "A100": 312e12,
        "H100": 989e12,
        "H200": 989e12,
        "H800": 989e12,
        "B200": 2250e12,
        "L40S": 362e12,
    }
)


# Dense FP8 tensor-core peak, FLOP/s (vendor data sheets: half the "with sparsity" figure). A GPU not listed has
# no FP8 tensor cores (A100) or is not known to have them.
PEAK_FLOPS_FP8: Mapping[str, float] = MappingProxyType(
    {
        "H100 PCIE": 1513e12,
        "H100 NVL": 1671e12,
        "H100": 1979e12,
        "H200": 1979e12,
        "H800": 1979e12,
        "B200": 4500e12,
        "L40S": 733e12,
    }
)


def peak_flops_for(device_name: str) -> float | None:
    """Peak dense bf16 FLOP/s for a CUDA device name (``torch.cuda.get_device_name``), or None when unknown."""
    upper = device_name.upper()
    for key, value in PEAK_FLOPS.items():
        if key in upper:
            return value
    return None


@dataclass(frozen=True, kw_only=True)
class GpuProfile:
    """One GPU model in a cluster of identical nodes."""

    name: str
    """Short name, used by ``--gpu``."""
    description: str
    """What the profile stands for."""
    peak_flops: float
    """Dense BF16/FP16 tensor-core peak, FLOP/s."""
    peak_flops_fp32: float
    """FP32 peak without tensor cores (PyTorch's default for float32 matmuls), FLOP/s."""
    peak_flops_fp8: float | None = None
    """Dense FP8 tensor-core peak, FLOP/s (``--fp8-format``'s GEMMs); None: the GPU has no FP8."""
    fp8_compute_efficiency: float | None = None
    """Calibrated best share of ``peak_flops_fp8`` that FP8 GEMMs reach (before their shapes' losses); None:
    ``compute_efficiency``."""
    memory_bytes: int
    """Memory capacity per GPU, bytes."""
    memory_bandwidth: float
    """HBM bandwidth per GPU, bytes/s (what memory-bound element-wise kernels run at)."""
    intra_node_bandwidth: float
    """Effective collective bus bandwidth between GPUs of one node, bytes/s."""
    inter_node_bandwidth: float
    """Effective bandwidth of one GPU's network interface between nodes, bytes/s."""
    compute_efficiency: float
    """Calibrated fraction of ``peak_flops`` that Megatron's matrix multiplications reach."""
    sms: int = 132
    """Streaming multiprocessors: the GEMMs' tiles run in waves of this many (``kernels.gemm_shape_efficiency``)."""
    gemm_depth_half: float | None = None
    """The bf16 GEMMs' depth (``k``) at which a tile's fixed time halves their rate; None: derived from the peak
    and the multiprocessors (``kernels.gemm_depth_half``); 0: no depth loss. ``depth_half`` scales it to FP8."""
    memory_efficiency: float = 1.0
    """Calibrated fraction of ``memory_bandwidth`` that the element-wise kernels (norms, activations, dropout,
    residuals, unfused softmax) reach."""
    attention_kernels: str = "hopper"
    """Whose published fused-attention benchmarks give this GPU's attention efficiency by shape
    (``estimate.kernels``): ``ampere`` (A100) or ``hopper`` (H100, H200)."""
    pass_overhead_s: float = 0.0
    """Fixed time of one layer's forward and backward pass for one microbatch beyond its FLOPs and bytes: kernel
    launches, framework dispatch (on CPU processes, PyTorch's per-operator overhead dominates small layers). 0 in
    the published profiles, whose layers are large; fitted by ``--calibrate`` where the runs tell it from the GEMM
    rate (two micro-batch sizes do)."""
    link_latency_s: float | None = None
    """Latency of one step of a collective and of one point-to-point message, seconds: the transport's own
    (gloo over TCP on CPU processes), fitted by ``tools/layout.py --calibrate``. None: NCCL's ring model for the
    data-parallel collectives (``step_overhead.ring_latency``), and none counted for the tensor-parallel collectives
    and pipeline messages, whose microsecond latencies the published profiles' fitted efficiencies absorb."""
    attention_efficiency: float | None = None
    """A fixed share of ``peak_flops`` for fused attention, in the kernel's count (causal: half the ``s²``
    square; backward 2.5 forwards), instead of the benchmarks' curve by sequence length and head dimension
    (``--attention-efficiency``); None: the curve."""

    def depth_half(self, peak: float | None = None) -> float:
        """``k½`` of GEMMs running at ``peak`` (default the bf16 peak): a tile's fixed time in multiply-adds at
        that rate, so FP8's doubled peak doubles it."""
        peak = self.peak_flops if peak is None else peak
        if self.gemm_depth_half is not None:
            return self.gemm_depth_half * peak / self.peak_flops
        return gemm_depth_half(peak, self.sms)

    def with_overrides(
        self,
        *,
        peak_tflops: float | None = None,
        memory_gib: float | None = None,
        hbm_gbps: float | None = None,
        intra_node_gbps: float | None = None,
        inter_node_gbps: float | None = None,
        compute_efficiency: float | None = None,
        attention_efficiency: float | None = None,
        memory_efficiency: float | None = None,
    ) -> GpuProfile:
        """A copy with the given values replaced (units as on the command line: TFLOP/s, GiB, GB/s). A new bf16
        peak moves the FP8 and fp32 peaks by the same factor: another clock or SKU of the same chip scales every
        unit alike (H100 PCIe's data sheet peaks are SXM's times 0.76 in bf16, FP8 and fp32)."""
        changes: dict[str, Any] = {}
        if peak_tflops is not None:
            scale = peak_tflops * 1e12 / self.peak_flops
            changes["peak_flops"] = peak_tflops * 1e12
            changes["peak_flops_fp32"] = self.peak_flops_fp32 * scale
            if self.peak_flops_fp8 is not None:
                changes["peak_flops_fp8"] = self.peak_flops_fp8 * scale
        if memory_gib is not None:
            changes["memory_bytes"] = int(memory_gib * GIB) if math.isfinite(memory_gib) else memory_gib
        if hbm_gbps is not None:
            changes["memory_bandwidth"] = hbm_gbps * 1e9
        if intra_node_gbps is not None:
            changes["intra_node_bandwidth"] = intra_node_gbps * 1e9
        if inter_node_gbps is not None:
            changes["inter_node_bandwidth"] = inter_node_gbps * 1e9
        for name, value in (
            ("compute_efficiency", compute_efficiency),
            ("attention_efficiency", attention_efficiency),
            ("memory_efficiency", memory_efficiency),
        ):
            if value is not None:
                changes[name] = value
        if not changes:
            return self
        return dataclasses.replace(self, name=f"{self.name} (overridden)", **changes)

    def problems(self) -> list[str]:
        """Values that make no sense, each with what to give instead."""
        p = []
        for field, value in (
            ("peak FLOP/s (--peak-tflops)", self.peak_flops),
            ("memory (--gpu-memory-gib)", self.memory_bytes),
            ("memory bandwidth (--hbm-gbps)", self.memory_bandwidth),
            ("intra-node bandwidth (--intra-node-gbps)", self.intra_node_bandwidth),
            ("inter-node bandwidth (--inter-node-gbps)", self.inter_node_bandwidth),
        ):
            if not (math.isfinite(value) and value > 0):
                p.append(f"{field} must be a positive number, got {value}")
        for flag, fraction in (
            ("--compute-efficiency", self.compute_efficiency),
            ("--attention-efficiency", self.attention_efficiency),
            ("--memory-efficiency", self.memory_efficiency),
        ):
            if fraction is not None and not 0 < fraction <= 1:
                p.append(f"{flag} must be in (0, 1], got {fraction}")
        return p


A100_COMPUTE_EFFICIENCY = 0.73
"""The GEMMs' best share of the A100's peak (before their shapes' losses, ``kernels.gemm_shape_efficiency``):
fitted with ``MEMORY_EFFICIENCY`` to Narayanan et al. 2021, Table 1."""

MEMORY_EFFICIENCY = 0.70
"""The element-wise kernels' share of HBM bandwidth on A100: fitted on Table 1."""

H100_COMPUTE_EFFICIENCY = 0.63
"""The GEMMs' best share of the H100's peak: fitted with ``H100_MEMORY_EFFICIENCY`` to the calibration sweeps of
NVIDIA's dgxc-benchmarking H100 tables (Llama 3.1 8B and 405B, Nemotron-4 340B; fused attention at the kernel
benchmarks' curve, ``estimate.kernels``)."""

H100_MEMORY_EFFICIENCY = 0.82
"""The element-wise kernels' share of the H100's HBM bandwidth (and the H200's, the same Hopper kernels): fitted
with ``H100_COMPUTE_EFFICIENCY`` to the same sweeps, a shallow fit (0.78 to 0.90 within 0.19 points of its largest
residual; docs/layout-model.md)."""

H100_FP8_COMPUTE_EFFICIENCY = 0.57
"""FP8 GEMMs' best share of the H100's FP8 peak: fitted to the BF16 / FP8 step-time ratios of the calibration
models' pairs in NVIDIA's dgxc-benchmarking tables (Llama 3.1 8B, 405B and its proxy, Nemotron-4 340B)."""

PROFILES: Mapping[str, GpuProfile] = MappingProxyType(
    {
        p.name: p
        for p in (
            GpuProfile(
                name="a100-40g",
                description="NVIDIA A100 SXM4 40GB, NVLink 3 / NVSwitch, 8× HDR 200 Gb/s InfiniBand per node",
                peak_flops=PEAK_FLOPS["A100"],
                peak_flops_fp32=19.5e12,
                memory_bytes=40960 * MIB,
                memory_bandwidth=1555e9,
                intra_node_bandwidth=230e9,
                inter_node_bandwidth=23e9,
                compute_efficiency=A100_COMPUTE_EFFICIENCY,
                sms=108,
                memory_efficiency=MEMORY_EFFICIENCY,
                attention_kernels="ampere",
            ),
            GpuProfile(
                name="a100-80g",
                description="NVIDIA A100 SXM4 80GB, NVLink 3 / NVSwitch, 8× HDR 200 Gb/s InfiniBand per node (Selene)",
                peak_flops=PEAK_FLOPS["A100"],
                peak_flops_fp32=19.5e12,
                memory_bytes=81920 * MIB,
                memory_bandwidth=2039e9,
                intra_node_bandwidth=230e9,
                inter_node_bandwidth=23e9,
                compute_efficiency=A100_COMPUTE_EFFICIENCY,
                sms=108,
                memory_efficiency=MEMORY_EFFICIENCY,
                attention_kernels="ampere",
            ),
            GpuProfile(
                name="h100-sxm",
                description="NVIDIA H100 SXM5 80GB, NVLink 4 / NVSwitch, 8× NDR 400 Gb/s InfiniBand per node",
                peak_flops=PEAK_FLOPS["H100"],
                peak_flops_fp32=67e12,
                peak_flops_fp8=PEAK_FLOPS_FP8["H100"],
                fp8_compute_efficiency=H100_FP8_COMPUTE_EFFICIENCY,
                memory_bytes=81559 * MIB,
                memory_bandwidth=3350e9,
                intra_node_bandwidth=370e9,
                inter_node_bandwidth=46e9,
                compute_efficiency=H100_COMPUTE_EFFICIENCY,
                memory_efficiency=H100_MEMORY_EFFICIENCY,
            ),
            GpuProfile(
                name="h200",
                description="NVIDIA H200 SXM 141GB, NVLink 4 / NVSwitch, 8× NDR 400 Gb/s InfiniBand per node",
                peak_flops=PEAK_FLOPS["H200"],
                peak_flops_fp32=67e12,
                peak_flops_fp8=PEAK_FLOPS_FP8["H200"],
                fp8_compute_efficiency=H100_FP8_COMPUTE_EFFICIENCY,
                memory_bytes=143771 * MIB,
                memory_bandwidth=4800e9,
                intra_node_bandwidth=370e9,
                inter_node_bandwidth=46e9,
                compute_efficiency=H100_COMPUTE_EFFICIENCY,
                memory_efficiency=H100_MEMORY_EFFICIENCY,
            ),
        )
    }
)


PROFILE_FILE_FORMAT = "megatron_ext gpu profile 1"
"""The ``format`` of a profile file (``tools/layout.py --calibrate`` writes one; ``--gpu FILE.json`` reads it)."""


def profile_document(profile: GpuProfile, **extra: Any) -> dict[str, Any]:
    """A profile as the JSON document ``--gpu FILE.json`` reads (``extra``: kept beside it, e.g. how it was
    calibrated)."""
    return {"format": PROFILE_FILE_FORMAT, "profile": dataclasses.asdict(profile), **extra}


def read_profile_file(path: Path) -> GpuProfile:
    """The profile in a JSON file written by ``--calibrate`` (or by hand, in the same form); a ValueError saying
    what is wrong with it otherwise."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"--gpu {path}: cannot read the profile file ({exc.strerror or exc})") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"--gpu {path}: not JSON ({exc})") from None
    if (
        not isinstance(doc, dict)
        or doc.get("format") != PROFILE_FILE_FORMAT
        or not isinstance(doc.get("profile"), dict)
    ):
        raise ValueError(
            f'--gpu {path}: not a profile file (expected {{"format": "{PROFILE_FILE_FORMAT}", "profile": {{...}}}}, '
            "as tools/layout.py --calibrate writes)"
        )
    values = doc["profile"]
    known = {f.name for f in dataclasses.fields(GpuProfile)}
    unknown = sorted(set(values) - known)
    missing = sorted(
        f.name for f in dataclasses.fields(GpuProfile) if f.name not in values and f.default is dataclasses.MISSING
    )
    if unknown or missing:
        raise ValueError(
            f"--gpu {path}: "
            + "; ".join(
                [
                    *([f"unknown fields {', '.join(unknown)}"] if unknown else []),
                    *([f"missing {', '.join(missing)}"] if missing else []),
                ]
            )
            + f" (the fields are {', '.join(sorted(known))})"
        )
    try:
        profile = GpuProfile(**values)
    except TypeError as exc:
        raise ValueError(f"--gpu {path}: {exc}") from None
    problems = profile.problems()
    if problems:
        raise ValueError(f"--gpu {path}: " + "; ".join(problems))
    return profile


def get_profile(name: str) -> GpuProfile:
    """The profile called ``name``, or the one in the file ``name`` (``*.json``); a ValueError listing the known
    ones otherwise."""
    if name.lower().endswith(".json"):
        return read_profile_file(Path(name))
    try:
        return PROFILES[name.lower()]
    except KeyError:
        raise ValueError(
            f"unknown --gpu {name!r}; choose one of {', '.join(PROFILES)}, or a profile file (FILE.json) that "
            "tools/layout.py --calibrate wrote"
        ) from None

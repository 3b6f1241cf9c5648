"""What a run prints of its dependencies' warnings and log lines: what does not apply is left out, what does is
said once, in our words.

A two-rank CPU run printed some fourteen lines from Megatron-Core 0.19 and
torch that it cannot act on: Transformer Engine and Apex missing (at the
import of four modules, in every process), a deprecation Megatron-Core's own
CUDA-graph default triggers, ShardedTensor's deprecation inside Megatron-Core's
checkpoint format, the asynchronous writer's deprecation at synchronous saves.
``NOISE`` names each such line: its text (a regular expression matched at the
start of the message), where it comes from (the module a warning is attributed
to, or the logger) and why it does not apply to a run of this project.
``install()`` leaves out exactly those: each warning by its text, category and
module (``warnings.filterwarnings``), each log line by its text on its own
logger (a ``logging.Filter``). Any other warning or line of the same modules
still shows. ``megatron_ext.training`` and ``megatron_ext.inference`` install
the filters when they are imported, before any of their modules imports
Megatron-Core; the one-process tools call ``install()`` before they open a
checkpoint; the launcher (``cli/launch.py``) before torchrun's. A few lines
apply on GPUs only (``Noise.gpu_only``): a run leaves them out once it knows
it is on the CPU (``training/distributed.py``).

What does apply is said once per run, by rank 0, in our words
(``say_applicable``, called where the run names its device): a GPU run without
Transformer Engine and Apex, whose optimizer and gradient clipping then run
torch's unfused kernels. torchrun's banner on ``OMP_NUM_THREADS`` (once per
launch) is said in one line of ours instead of five of its own. A flag that
needs Transformer Engine where it is missing is not a notice but a refusal
(``config/training_config.py``).

To see everything:

* ``MEGATRON_EXT_ALL_WARNINGS=1`` installs none of these filters: every
  warning and log line is printed as the dependency wrote it (a test's forked
  ranks take the value their server started with, ``tests/rank_server.py``).
* An explicit ``-W`` option or ``PYTHONWARNINGS`` takes precedence over the
  warning filters here, which are appended after the interpreter's own:
  ``PYTHONWARNINGS=default`` shows every Python warning (the log lines stay
  filtered unless ``MEGATRON_EXT_ALL_WARNINGS=1``).

One line is filtered elsewhere, by the mechanism that makes it false and only
while it is active: the CPU backend's RNG stand-in (``training/cpu_backend.py``,
item 3). ``docs/architecture.md`` describes a run's output.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import os
import re
import warnings
from dataclasses import dataclass

ALL_WARNINGS_VARIABLE = "MEGATRON_EXT_ALL_WARNINGS"
"""``1``: install no filter; every dependency's warning and log line is printed as it wrote it."""


@dataclass(frozen=True)
class Noise:
    """A line a dependency prints that does not apply to a run of this project."""

    text: str
    """A regular expression matched at the start of the message (of a warning: case-insensitively, as Python does)."""
    source: str
    """A warning: a regular expression matched at the start of the module it is attributed to. A log line: the
    name of its logger (a filter sees only the records of its own logger)."""
    category: type[Warning] | None
    """The warning's category; None for a log line."""
    why: str
    """Why it does not apply here."""
    instead: str = ""
    """A log line only: what is said in its place, in our words (empty: nothing)."""
    gpu_only: bool = False
    """It applies on GPUs: left out only once the run knows it is on the CPU (``install(device_type="cpu")``)."""


_NO_FUSED = r"Transformer Engine and Apex are not installed\. Falling back to"
_NOT_FUSED_ON_CPU = (
    "no fused kernel exists on CPU; on a GPU without either package, rank 0 says once what it costs (``applicable``)"
)

NOISE: tuple[Noise, ...] = (
    Noise(_NO_FUSED, r"megatron\.core\.optimizer(\.|$)", UserWarning, _NOT_FUSED_ON_CPU),
    Noise(_NO_FUSED, r"megatron\.core\.distributed\.fsdp\.", UserWarning, _NOT_FUSED_ON_CPU),
    Noise(
        r"Apex is not installed\. Falling back to Torch Norm",
        r"megatron\.core\.models\.",
        UserWarning,
        "Megatron-Core's choice of norm for its own specs: the local spec here builds PyTorch's norms itself "
        "(``training/model.py``: ``layer_spec``) and Transformer Engine's spec builds its own",
    ),
    Noise(
        r"full scope is deprecated\. Use empty cuda_graph_modules",
        r"megatron\.core\.transformer\.transformer_config$",
        UserWarning,
        "Megatron-Core's own default (``cuda_graph_modules='full'``) deprecated by itself, at every "
        "TransformerConfig; no run here captures CUDA graphs",
    ),
    Noise(
        "MimoModelConfig is experimental",
        r"megatron\.core\.models\.mimo\.",
        UserWarning,
        "a multimodal model class Megatron-Core imports with its models; never built here",
    ),
    Noise(
        r"torch\.distributed is disabled, unavailable or uninitialized, assuming the intent is to (load|save) in a "
        "single process",
        r"torch\.distributed\.checkpoint\.",
        UserWarning,
        "the checks of a resume, --dry-run and the one-process tools read a checkpoint's index and common state "
        "before any process group exists, on purpose",
    ),
    Noise(
        "The argument order of (load|save) has been changed",
        r"torch\.distributed\.checkpoint\.",
        UserWarning,
        "Megatron-Core 0.19 calls torch's checkpoint load positionally; it works, and only Megatron-Core can change it",
    ),
    Noise(
        "Please use DTensor instead and we are deprecating ShardedTensor",
        r"(torch\.distributed|megatron\.core|megatron_ext\.training\.cpu_backend)(\.|$)",
        FutureWarning,
        "Megatron-Core's checkpoint format (torch_dist) is built on ShardedTensor; only Megatron-Core can move it "
        "(attributed to the CPU backend's device mapping on CPU, which passes the call on)",
    ),
    Noise(
        r"The \.grad attribute of a Tensor that is not a leaf Tensor is being accessed",
        r"(megatron\.core\.optimizer|megatron_ext\.training\.cpu_backend)(\.|$)",
        UserWarning,
        "the distributed optimizer's zero_grad reads .grad of its shard views (Megatron-Core's own comment: "
        "'throws grad-access warning'); attributed to the CPU backend's device mapping on CPU",
    ),
    Noise(
        r"`torch\.distributed\.(all_gather_into_tensor|reduce_scatter_tensor)` is deprecated",
        r"torch\.distributed\.c10d_logger$",
        FutureWarning,
        "Megatron-Core's gradient and parameter buffers call these collectives; only Megatron-Core can change them",
    ),
    Noise(
        r"When using (sequence parallelism|async grad allreduce) it is recommended to set the environment variable "
        "CUDA_DEVICE_MAX_CONNECTIONS",
        r"megatron\.core\.tensor_parallel\.layers$",
        UserWarning,
        "a CPU run has no CUDA work queues; on GPUs the run sets the variable for TP > 1 unless the user set it "
        "(``training/distributed.py``), and a value the user chose keeps Megatron-Core's warning",
        gpu_only=True,
    ),
    Noise(
        "No CUDA runtime is found",
        "torch.utils.cpp_extension",
        None,
        "a CUDA build of torch says so when Megatron-Core imports its extension builder on a machine with an nvcc "
        "but no GPU: a CPU run expects none",
    ),
    Noise(
        r"GPTModel IS DEPRECATED\.",
        "megatron.core.models.gpt.gpt_model",
        None,
        "pretrain_gpt.py builds GPTModel, as Megatron-LM 0.19's own does; moving to HybridModel is this "
        "project's work, not the user's (docs/architecture.md)",
    ),
    Noise(
        "MCore's async save is deprecated",
        "megatron.core.dist_checkpointing.strategies.torch",
        None,
        "logged by every process at its first save, synchronous saves included; which writer --async-save uses is "
        "this project's choice (docs/checkpoints.md)",
    ),
    Noise(
        "DistributedDataParallel: full_param_layout not provided",
        "megatron.core.distributed.distributed_data_parallel",
        None,
        "advice to the code that builds DDP, not to the user: DDP computes the same layout itself",
    ),
    Noise(
        "Unable to save MockGPTDataset indexes because path_to_cache is None",
        "megatron.core.datasets.gpt_dataset",
        None,
        "--mock-data has no indexes worth keeping (a real dataset's are cached next to it)",
    ),
    Noise(
        "Overwriting old incomplete / corrupted checkpoint",
        "megatron.core.dist_checkpointing.serialization",
        None,
        "a save's directory is never empty here (its in-progress marker is written first), so every save would say "
        "it; a save that really replaces a directory says so itself (``checkpoint/on_disk.py``: ``start_save``)",
    ),
    Noise(
        r"\s*\*+\s*Setting OMP_NUM_THREADS environment variable for each process",
        "torch.distributed.run",
        None,
        "torchrun's banner, five lines",
        instead="OMP_NUM_THREADS is not set: torchrun gives each process 1 thread so that the processes of a node "
        "do not overload it; set OMP_NUM_THREADS to give each more",
    ),
)


class _Drop(logging.Filter):
    """Leaves out (or rewords) the records of one logger whose message starts as one of ``NOISE``'s lines does."""

    def __init__(self, entries: list[Noise]) -> None:
        super().__init__()
        self.entries = [(re.compile(e.text), e.instead) for e in entries]

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        for pattern, instead in self.entries:
            if pattern.match(message):
                if not instead:
                    return False
                record.msg, record.args = instead, ()
        return True


@functools.cache
def _log_filters(*, gpu_only: bool) -> dict[str, _Drop]:
    """One filter per logger (for the lines that apply on GPUs, another), the same objects at every ``install()``
    (``addFilter`` adds a filter once)."""
    by_logger: dict[str, list[Noise]] = {}
    for noise in NOISE:
        if noise.category is None and noise.gpu_only == gpu_only:
            by_logger.setdefault(noise.source, []).append(noise)
    return {name: _Drop(entries) for name, entries in by_logger.items()}


def showing_everything() -> bool:
    """Whether ``MEGATRON_EXT_ALL_WARNINGS`` asks for every line (any value but empty and ``0``)."""
    return os.environ.get(ALL_WARNINGS_VARIABLE, "") not in ("", "0")


def install(*, device_type: str | None = None) -> None:
    """Leave out ``NOISE``'s warnings and log lines in this process, unless ``MEGATRON_EXT_ALL_WARNINGS`` asks for
    every line; with ``device_type="cpu"`` (a run that knows it is on the CPU), also those that apply only on
    GPUs. Calling it again changes nothing."""
    if showing_everything():
        return
    cpu = device_type == "cpu"
    for noise in NOISE:
        if noise.category is not None and (cpu or not noise.gpu_only):
            # Appended: the interpreter's -W / PYTHONWARNINGS filters come first and win.
            warnings.filterwarnings(
                "ignore", message=noise.text, category=noise.category, module=noise.source, append=True
            )
    for gpu_only in (False, True) if cpu else (False,):
        for name, drop in _log_filters(gpu_only=gpu_only).items():
            logging.getLogger(name).addFilter(drop)


FUSED_KERNELS_MISSING = (
    "Transformer Engine and Apex are not installed: the optimizer is torch's AdamW, not a fused Adam, and gradient "
    "clipping and the copies between half-precision and fp32 main parameters run unfused: the same results, "
    "slower steps on GPU. Install Transformer Engine for the fused kernels (--transformer-impl auto then also "
    "builds its layers)"
)


def applicable(device_type: str) -> list[str]:
    """What of the dropped warnings applies to a run on ``device_type`` (``cuda``, ``cpu``), in our words."""
    if device_type != "cuda" or any(importlib.util.find_spec(p) is not None for p in ("transformer_engine", "apex")):
        return []
    return [FUSED_KERNELS_MISSING]


_said: set[str] = set()


def say_applicable(log: logging.Logger, *, device_type: str, rank: int) -> None:
    """Rank 0 says each of ``applicable``'s lines once per process (a warning on ``log``)."""
    if rank != 0:
        return
    for line in applicable(device_type):
        if line not in _said:
            _said.add(line)
            log.warning(line)

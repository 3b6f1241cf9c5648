"""Which of the dependencies' warnings and log lines a run prints (``megatron_ext/notices.py``): the lines of
Megatron-Core 0.19.2 and torch that do not apply are left out, exactly those; what applies is said once."""

from __future__ import annotations

import importlib.util
import logging
import subprocess
import sys
import warnings
from collections.abc import Iterator

import pytest

from megatron_ext import notices
from tests.conftest import REPO, _env
from tests.waits import QUICK_S

pytestmark = pytest.mark.unit

TE_OPTIMIZERS = "Transformer Engine and Apex are not installed. Falling back to Torch optimizers."

LEFT_OUT_WARNINGS = [
    (TE_OPTIMIZERS, UserWarning, "megatron.core.optimizer"),
    (
        "Transformer Engine and Apex are not installed. Falling back to local implementations of "
        "multi_tensor_applier and multi_tensor_scale",
        UserWarning,
        "megatron.core.distributed.fsdp.src.megatron_fsdp.mixed_precision",
    ),
    (
        "Transformer Engine and Apex are not installed. Falling back to local implementations of "
        "multi_tensor_applier and multi_tensor_scale",
        UserWarning,
        "megatron.core.optimizer.optimizer",
    ),
    (
        "Transformer Engine and Apex are not installed. Falling back to local implementations of "
        "multi_tensor_applier, multi_tensor_l2norm, and multi_tensor_scale",
        UserWarning,
        "megatron.core.optimizer.clip_grads",
    ),
    ("Apex is not installed. Falling back to Torch Norm", UserWarning, "megatron.core.models.backends"),
    ("Apex is not installed. Falling back to Torch Norm", UserWarning, "megatron.core.models.gpt.gpt_layer_specs"),
    (
        "full scope is deprecated. Use empty cuda_graph_modules to capture the whole layer.",
        UserWarning,
        "megatron.core.transformer.transformer_config",
    ),
    (
        "MimoModelConfig is experimental and still under active development. The API may change without notice "
        "in future releases.",
        UserWarning,
        "megatron.core.models.mimo.config.base_configs",
    ),
    (
        "torch.distributed is disabled, unavailable or uninitialized, assuming the intent is to load in a single "
        "process.",
        UserWarning,
        "torch.distributed.checkpoint.utils",
    ),
    (
        "The argument order of load has been changed. Please check the document to avoid future breakages.",
        UserWarning,
        "torch.distributed.checkpoint.logger",
    ),
    (
        "Please use DTensor instead and we are deprecating ShardedTensor.",
        FutureWarning,
        "megatron_ext.training.cpu_backend",
    ),
    (
        "The .grad attribute of a Tensor that is not a leaf Tensor is being accessed. Its .grad attribute won't be "
        "populated during autograd.backward().",
        UserWarning,
        "megatron.core.optimizer.optimizer",
    ),
    (
        "`torch.distributed.all_gather_into_tensor` is deprecated. Please use `torch.distributed.all_gather_single` "
        "instead.",
        FutureWarning,
        "torch.distributed.c10d_logger",
    ),
]
"""Warnings as a two-rank CPU run printed them (text, category, the module they are attributed to)."""

LEFT_OUT_LOG_LINES = [
    ("torch.utils.cpp_extension", "No CUDA runtime is found, using CUDA_HOME='/usr/local/cuda'"),
    (
        "megatron.core.models.gpt.gpt_model",
        "GPTModel IS DEPRECATED. GPTModel is only accepting critical bug fixes, no new features.",
    ),
    (
        "megatron.core.dist_checkpointing.strategies.torch",
        "MCore's async save is deprecated and will be removed in the future releases. Please, use NVRx async "
        "solution by setting `async_strategy` to `nvrx`.",
    ),
    (
        "megatron.core.distributed.distributed_data_parallel",
        "DistributedDataParallel: full_param_layout not provided with use_distributed_optimizer=True. "
        "Auto-computing layout inside DDP.",
    ),
    ("megatron.core.datasets.gpt_dataset", "Unable to save MockGPTDataset indexes because path_to_cache is None"),
    (
        "megatron.core.dist_checkpointing.serialization",
        "Overwriting old incomplete / corrupted checkpoint in /ckpt/iter_0000002",
    ),
]
"""Megatron-Core's and torch's log lines that a run printed (logger, message)."""

SEQUENCE_PARALLEL = (
    "When using sequence parallelism it is recommended to set the environment variable CUDA_DEVICE_MAX_CONNECTIONS "
    "to 1 for maximum speedup"
)


@pytest.fixture
def filters(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[warnings.WarningMessage]]:
    """This process's warning filters as a run's: the interpreter's (none here), then ours; what passes them is
    recorded."""
    monkeypatch.delenv(notices.ALL_WARNINGS_VARIABLE, raising=False)
    with warnings.catch_warnings(record=True) as shown:
        warnings.resetwarnings()
        notices.install()
        warnings.simplefilter("always", append=True)  # after ours: whatever they let through is recorded
        yield shown


def _warn(message: str, category: type[Warning], module: str) -> None:
    warnings.warn_explicit(message, category, f"/site-packages/{module.replace('.', '/')}.py", 1, module=module)


@pytest.mark.parametrize(("message", "category", "module"), LEFT_OUT_WARNINGS)
def test_a_warning_that_does_not_apply_is_left_out(
    filters: list[warnings.WarningMessage], message: str, category: type[Warning], module: str
) -> None:
    _warn(message, category, module)
    assert [str(w.message) for w in filters] == []


def test_another_warning_of_the_same_module_or_the_same_text_elsewhere_is_printed(
    filters: list[warnings.WarningMessage],
) -> None:
    """Filtered by text, category and module together: none of them alone leaves a line out."""
    _warn("Transformer Engine is too old for fp8", UserWarning, "megatron.core.optimizer")  # other text
    _warn(TE_OPTIMIZERS, UserWarning, "megatron_ext.training.loop")  # another module
    _warn(TE_OPTIMIZERS, DeprecationWarning, "megatron.core.optimizer")  # another category
    assert len(filters) == 3


@pytest.mark.parametrize(("logger", "message"), LEFT_OUT_LOG_LINES)
def test_a_log_line_that_does_not_apply_is_left_out_and_the_logger_s_others_are_printed(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, logger: str, message: str
) -> None:
    monkeypatch.delenv(notices.ALL_WARNINGS_VARIABLE, raising=False)
    notices.install()
    with caplog.at_level(logging.WARNING, logger=logger):
        logging.getLogger(logger).warning(message)
        logging.getLogger(logger).warning("checkpoint %s is corrupted", "/ckpt")
    assert [r.getMessage() for r in caplog.records] == ["checkpoint /ckpt is corrupted"]


def test_torchrun_s_thread_banner_is_said_in_one_line_of_ours(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv(notices.ALL_WARNINGS_VARIABLE, raising=False)
    notices.install()
    banner = (
        "\n*****************************************\nSetting OMP_NUM_THREADS environment variable for each process "
        "to be %s in default, to avoid your system being overloaded, please further tune the variable for optimal "
        "performance in your application as needed. \n*****************************************"
    )
    with caplog.at_level(logging.WARNING, logger="torch.distributed.run"):
        logging.getLogger("torch.distributed.run").warning(banner, 1)
    [line] = [r.getMessage() for r in caplog.records]
    assert line.startswith("OMP_NUM_THREADS is not set: torchrun gives each process 1 thread") and "\n" not in line


def test_a_warning_that_applies_on_gpus_is_left_out_once_the_run_knows_it_is_on_the_cpu(
    filters: list[warnings.WarningMessage],
) -> None:
    _warn(SEQUENCE_PARALLEL, UserWarning, "megatron.core.tensor_parallel.layers")
    assert len(filters) == 1  # a GPU run whose user set another CUDA_DEVICE_MAX_CONNECTIONS
    warnings.resetwarnings()
    notices.install(device_type="cpu")
    warnings.simplefilter("always", append=True)
    _warn(SEQUENCE_PARALLEL, UserWarning, "megatron.core.tensor_parallel.layers")
    assert len(filters) == 1


def test_a_gpu_run_without_transformer_engine_and_apex_says_so_once_on_rank_0_in_our_words(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(notices, "_said", set())
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)  # neither package installed
    log = logging.getLogger("megatron_ext")
    with caplog.at_level(logging.WARNING, logger="megatron_ext"):
        for rank in (0, 1, 0):  # rank 0's line, then the same process asked again (a second model build)
            notices.say_applicable(log, device_type="cuda", rank=rank)
        notices.say_applicable(log, device_type="cpu", rank=0)
    assert [r.getMessage() for r in caplog.records] == [notices.FUSED_KERNELS_MISSING]
    assert "torch's AdamW" in notices.FUSED_KERNELS_MISSING and "Install Transformer Engine" in (
        notices.FUSED_KERNELS_MISSING
    )


def test_with_transformer_engine_installed_a_gpu_run_has_nothing_to_say(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: object() if name == "transformer_engine" else None
    )
    assert notices.applicable("cuda") == []


PROBE = f"""
import logging, warnings
import megatron_ext.training  # installs the filters, as pretrain_gpt.py's first import does
warnings.warn_explicit({TE_OPTIMIZERS!r}, UserWarning, "optimizer.py", 25, module="megatron.core.optimizer")
logging.getLogger("megatron.core.models.gpt.gpt_model").warning("GPTModel IS DEPRECATED.")
"""


@pytest.mark.parametrize(
    ("setting", "shown"),
    [
        ({}, []),
        ({"PYTHONWARNINGS": "default"}, ["Falling back to Torch optimizers"]),
        ({notices.ALL_WARNINGS_VARIABLE: "1"}, ["Falling back to Torch optimizers", "GPTModel IS DEPRECATED"]),
    ],
)
def test_everything_is_printed_when_asked_for(setting: dict[str, str], shown: list[str]) -> None:
    """An explicit PYTHONWARNINGS comes before our filters (Python warnings only); MEGATRON_EXT_ALL_WARNINGS=1
    installs none. A fresh interpreter: the filters are installed at import."""
    proc = subprocess.run(
        [sys.executable, "-c", PROBE],
        capture_output=True, text=True, cwd=REPO, env=_env() | setting, timeout=QUICK_S, check=True,
    )  # fmt: skip
    assert [s for s in ("Falling back to Torch optimizers", "GPTModel IS DEPRECATED") if s in proc.stderr] == shown

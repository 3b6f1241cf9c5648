"""Shared helpers: launching pretrain_gpt.py under torchrun on CPU processes."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import IO, Any

import pytest

from megatron_ext import notices
from megatron_ext.cli.launch import local_command
from megatron_ext.training.ports import free_port as _free_port
from tests import rank_client, rank_server, waits
from tests.once import once_per_run
from tests.waits import QUICK_S, RUN_S, tail

REPO = Path(__file__).resolve().parent.parent
PRETRAIN = REPO / "pretrain_gpt.py"

# A tiny GPT that every layout of the equivalence tests can split:
# 8 layers = PP 4 × VP 2; 4 heads = TP 2 × 2; 8 sequences = 4 microbatches of 2.
TINY_MODEL = "--num-layers 8 --hidden-size 64 --num-attention-heads 4 --seq-length 32 --vocab-size 255 --micro-batch-size 2 --global-batch-size 8 --hidden-dropout 0 --attention-dropout 0 --lr 1e-3 --lr-warmup-iters 2 --lr-decay-iters 10 --lr-decay-style cosine --mock-data --device cpu --seed 1234".split()


def _env() -> dict[str, str]:
    """The environment of the runs the tests start: a user's, without PYTHONWARNINGS (the runs print what users
    see, ``megatron_ext/notices.py``), one OpenMP thread per process, this checkout first on the path."""
    env = dict(os.environ)
    env.pop("PYTHONWARNINGS", None)
    env.pop(notices.ALL_WARNINGS_VARIABLE, None)
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONPATH"] = str(REPO)
    return env


def launch_command(args: list[str], *, nproc: int) -> list[str]:
    """pretrain_gpt.py under our torchrun wrapper (which keeps the exit code)."""
    return local_command(PRETRAIN, args, nproc=nproc)


_RANKS = rank_server.RankServer(REPO, _env())
"""Forks the ranks of ``spawn_ranks`` from a process that has imported what a rank imports (``tests.rank_server``)."""


def bench_env() -> dict[str, str]:
    """The environment of a benchmark a test runs (``bench/train_throughput.py``'s runs: the GPU check's, the
    calibration benchmark's): ``_env()``, with their ranks forked from this process's rank server
    (``tests/rank_client.py``) unless ``MEGATRON_EXT_FORKED_RANKS=0``."""
    env = _env()
    if rank_server.enabled(env):
        env[rank_client.LAUNCHER_VARIABLE] = shlex.join([sys.executable, "-m", "tests.rank_client"])
        env[rank_client.SERVER_VARIABLE] = _RANKS.address()
    return env


def start_ranks(
    args: list[str],
    *,
    nproc: int,
    out: IO[str],
    err: IO[str],
    env: dict[str, str] | None = None,
    script: Path = PRETRAIN,
) -> list[Any]:
    """``spawn_ranks``' ranks, started and not waited for (``Popen``-like: ``rank_client.wait_ranks`` and
    ``exit_code`` take them), writing to ``out`` and ``err``: for a test that acts while they run."""
    port = str(_free_port())
    ranks: list[Any] = []
    for rank in range(nproc):
        rank_env = _env() | (env or {}) | {
            "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(nproc), "LOCAL_WORLD_SIZE": str(nproc),
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
        }  # fmt: skip
        ranks.append(
            _RANKS.start(script, args, env=rank_env, stdout=out, stderr=err)
            if rank_server.enabled(rank_env)
            else subprocess.Popen([sys.executable, str(script), *args], stdout=out, stderr=err, env=rank_env, cwd=REPO)
        )
    return ranks


def spawn_ranks(
    args: list[str], *, nproc: int, timeout: float, env: dict[str, str] | None = None, script: Path = PRETRAIN
) -> subprocess.CompletedProcess[str]:
    """pretrain_gpt.py as ``nproc`` processes that read their rank from the environment, as under
    ``LAUNCHER=srun`` (recipes/common.sh) — without torchrun's agent, whose start-up costs every run
    about 2 s, and forked from a process that has imported torch and Megatron-Core (``tests.rank_server``:
    about 3 s of each rank's start). Their output is interleaved into one stdout and one stderr, and the exit code is the one
    the failing ranks chose (as ``megatron_ext.cli.launch`` reports it). The launcher's own behaviour
    (exit codes, signals) is tested through ``launch_command``. Ranks still running after ``timeout`` s
    are killed and the test fails with the command and the tail of their output. ``env``: more variables;
    ``script``: another script that runs pretrain_gpt.py's training (``tools/record_schedule.py``)."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        ranks = start_ranks(args, nproc=nproc, out=out, err=err, env=env, script=script)
        # A failed rank leaves the others waiting in a collective: they are ended, as torchrun does.
        if not rank_client.wait_ranks(ranks, timeout=timeout, poll_s=0.05):
            out.seek(0)
            err.seek(0)
            pytest.fail(
                f"{nproc} rank(s) of {script.name} did not finish in {timeout:.0f} s (killed; exit codes "
                f"{[r.returncode for r in ranks]}): {' '.join(args)}\n"
                f"--- stdout ---\n{tail(out.read())}\n--- stderr ---\n{tail(err.read())}"
            )
        code = rank_client.exit_code(ranks)
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess([str(script), *args], code, out.read(), err.read())


def script_module(relative: str, name: str) -> ModuleType:
    """A script of this repository (``bench/``, ``scripts/``, ``tools/``: not packages) loaded as module ``name``."""
    spec = importlib.util.spec_from_file_location(name, REPO / relative)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_forked(script: Path, args: list[str], *, timeout: float = RUN_S) -> subprocess.CompletedProcess[str]:
    """``python SCRIPT ARGS`` as one process forked from the rank server (``spawn_ranks``' world of one): for a
    tool or a test's own script that imports torch and Megatron-Core anyway, whose subject is not its start. Its
    exit code is not checked."""
    return spawn_ranks(args, nproc=1, timeout=timeout, script=script)


def run_pretrain(
    args: list[str],
    *,
    nproc: int = 1,
    timeout: float = RUN_S,
    expect: int | None = 0,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run pretrain_gpt.py with ``nproc`` CPU processes; check the exit code unless ``expect`` is None."""
    proc = spawn_ranks(args, nproc=nproc, timeout=timeout, env=env)
    if expect is not None and proc.returncode != expect:
        raise AssertionError(
            f"pretrain_gpt.py exited {proc.returncode}, expected {expect}: {' '.join(args)}\n"
            f"--- stdout ---\n{proc.stdout[-4000:]}\n--- stderr ---\n{proc.stderr[-6000:]}"
        )
    return proc


def run_script(args: list[str], *, timeout: float = QUICK_S) -> subprocess.CompletedProcess[str]:
    """Run pretrain_gpt.py as a plain process (no launcher), e.g. for --dry-run."""
    return waits.run([sys.executable, str(PRETRAIN), *args], timeout=timeout, env=_env(), cwd=REPO)


PYTHON_WARNING = re.compile(r"^.+:\d+: \w*Warning: .*$", re.MULTILINE)
"""A line as Python prints a warning (``warnings.formatwarning``): ``FILE:LINE: CATEGORY: MESSAGE``."""


def python_warnings(text: str) -> list[str]:
    """The warning lines in ``text`` (a process's stderr)."""
    return PYTHON_WARNING.findall(text)


def read_metrics(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def train_losses(path: Path) -> dict[int, float]:
    return {r["iteration"]: r["lm_loss"] for r in read_metrics(path) if "lm_loss" in r}


def grad_norms(path: Path) -> dict[int, float]:
    """Per-iteration gradient norms: with Adam and clipping the loss barely notices a
    wrongly scaled gradient (a DP sum instead of a mean), the norm does."""
    return {r["iteration"]: r["grad_norm"] for r in read_metrics(path) if "lm_loss" in r}


@pytest.fixture(scope="session")
def seed_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Initial weights of the tiny GPT, saved once (TP1·PP1) and loaded by every layout."""
    return once_per_run(tmp_path_factory, "seed", _save_seed) / "ckpt"


def _save_seed(directory: Path) -> None:
    run_pretrain([*TINY_MODEL, "--train-iters", "0", "--save", str(directory / "ckpt")])


ITERS = 6
"""Iterations of the equivalence runs: the first one's loss and gradient norm check the forward and the backward
on the seed's weights, the later ones the optimizer's steps too (the learning rate warms up from 0 over two)."""
REL_TOL = 1e-5
"""Relative loss tolerance between layouts (fp32, CPU)."""


def train_from_seed(
    seed: Path, metrics: Path, nproc: int, layout: list[str], *extra: str, expect: int = 0
) -> dict[int, float]:
    """Train the tiny GPT from the seed checkpoint; per-iteration losses."""
    run_pretrain(
        [
            *TINY_MODEL,
            *layout,
            "--train-iters",
            str(ITERS),
            "--load",
            str(seed),
            "--metrics-file",
            str(metrics),
            # The weights' norm after every step must agree too (and the norm itself be layout-free).
            "--log-params-norm",
            *extra,
        ],
        nproc=nproc,
        expect=expect,
    )
    return train_losses(metrics)


@pytest.fixture(scope="session")
def baseline_metrics(seed_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Metrics of TP1·PP1·DP1 trained from the seed checkpoint."""
    metrics = (
        once_per_run(
            tmp_path_factory,
            "baseline",
            lambda directory: train_from_seed(seed_checkpoint, directory / "m.jsonl", 1, []),
        )
        / "m.jsonl"
    )
    losses = train_losses(metrics)
    assert sorted(losses) == list(range(1, ITERS + 1))
    # The mock data is learnable: the baseline itself must be training.
    assert losses[ITERS] < losses[1] - 0.1
    return metrics


@pytest.fixture(scope="session")
def baseline(baseline_metrics: Path) -> dict[int, float]:
    """Per-iteration losses of the baseline."""
    return train_losses(baseline_metrics)


@pytest.fixture(scope="session")
def baseline_grad_norms(baseline_metrics: Path) -> dict[int, float]:
    """Per-iteration gradient norms of the baseline."""
    return grad_norms(baseline_metrics)


def params_norms(path: Path) -> dict[int, float]:
    """Per-iteration weight norms (``--log-params-norm``)."""
    return {r["iteration"]: r["params_norm"] for r in read_metrics(path) if "params_norm" in r}


def assert_matches_baseline(
    metrics: Path,
    losses: dict[int, float],
    norms: dict[int, float],
    *,
    name: str,
    first: int = 1,
    params: dict[int, float] | None = None,
) -> None:
    """Loss and gradient norm of every iteration from ``first`` to ITERS agree to REL_TOL, and with ``params``
    the weights' norm after each step (``--log-params-norm``, which the runs from the seed checkpoint log)."""
    got_losses, got_norms = train_losses(metrics), grad_norms(metrics)
    if params is not None:
        got_params = params_norms(metrics)
        assert sorted(got_params) == list(range(first, ITERS + 1)), f"{name}: params norms {sorted(got_params)}"
        for it, value in got_params.items():
            assert value == pytest.approx(params[it], rel=REL_TOL), (
                f"{name}: iteration {it} params norm {value!r} != baseline {params[it]!r}"
            )
    assert sorted(got_losses) == list(range(first, ITERS + 1)), f"{name}: iterations {sorted(got_losses)}"
    for it in range(first, ITERS + 1):
        assert got_losses[it] == pytest.approx(losses[it], rel=REL_TOL), (
            f"{name}: iteration {it} loss {got_losses[it]!r} != baseline {losses[it]!r}"
        )
        assert got_norms[it] == pytest.approx(norms[it], rel=REL_TOL), (
            f"{name}: iteration {it} grad norm {got_norms[it]!r} != baseline {norms[it]!r}"
        )


# ------------------------------------------------------------- runs on real data
@pytest.fixture(scope="session")
def indexed_datasets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two datasets (halves of the shared corpus) and the tokenizer they were made with."""
    from tests.data.helpers import shared_data, tool  # it imports this module

    shared = shared_data(tmp_path_factory)
    root = tmp_path_factory.mktemp("indexed")
    lines = shared["corpus"].read_text(encoding="utf-8").splitlines(keepends=True)
    half = len(lines) // 2
    out = {"model": shared["model"], "root": root}
    for name, part in (("a", lines[:half]), ("b", lines[half:])):
        (root / f"{name}.jsonl").write_text("".join(part), encoding="utf-8")
        tool(
            "preprocess_data",
            "--input",
            str(root / f"{name}.jsonl"),
            "--output-prefix",
            str(root / name),
            "--tokenizer-type",
            "GPTSentencePieceTokenizer",
            "--tokenizer-model",
            str(shared["model"]),
            "--append-eod",
            "--workers",
            "2",
            "--quiet",
        )
        out[name] = root / f"{name}_text_document"
    return out


def tokenizer_flags(ds: dict[str, Path]) -> list[str]:
    return ["--tokenizer-type", "GPTSentencePieceTokenizer", "--tokenizer-model", str(ds["model"])]


def blend_flags(datasets: dict[str, Path]) -> list[str]:
    """'0.7 A 0.3 B' with a 90/8/2 split."""
    return ["--data-path", "0.7", str(datasets["a"]), "0.3", str(datasets["b"]), "--split", "90,8,2"]


MODEL = "--num-layers 4 --hidden-size 64 --num-attention-heads 4 --seq-length 64 --micro-batch-size 2 --global-batch-size 8 --hidden-dropout 0 --attention-dropout 0 --device cpu --seed 1234".split()
"""The GPT of the real-data runs (a GPT-2-style block; ``LLAMA`` makes it Llama-style)."""

LLAMA = "--position-embedding-type rope --swiglu --normalization RMSNorm --disable-bias-linear --group-query-attention --num-query-groups 2 --untie-embeddings-and-output-weights".split()
"""Rotary positions, SwiGLU, RMSNorm, grouped-query attention, untied output: what the demo trains."""


@dataclass(frozen=True)
class SavedRun:
    """A training run kept for the tests that read what it wrote."""

    metrics: Path
    checkpoint: Path
    data_cache: Path | None = None


def pipeline_flags(datasets: dict[str, Path]) -> list[str]:
    """The Llama-style GPT under PP2 × VP2 on '0.7 A 0.3 B' (90/8/2 split) for 16 iterations, as ``pipeline_run``
    trains it (without its outputs)."""
    return [
        *MODEL,
        *LLAMA,
        *blend_flags(datasets),
        *tokenizer_flags(datasets),
        *"--pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 1".split(),
        *"--lr 3e-3 --lr-warmup-iters 2 --train-iters 16 --eval-interval 8 --eval-iters 2 --log-interval 1".split(),
    ]


@pytest.fixture(scope="session")
def pipeline_run(indexed_datasets: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> SavedRun:
    """``pipeline_flags``' run, evaluated every 8 and saved at the end (tests/training/test_train_on_indexed.py
    checks the run, tests/huggingface and tests/training/test_run_identity.py what it saved)."""
    root = tmp_path_factory.mktemp("pipeline-run")
    run = SavedRun(root / "metrics.jsonl", root / "checkpoints", root / "index-cache")
    run_pretrain(
        [
            *pipeline_flags(indexed_datasets),
            "--data-cache-path",
            str(run.data_cache),
            "--metrics-file",
            str(run.metrics),
            "--save",
            str(run.checkpoint),
            "--save-interval",
            "16",
        ],
        nproc=2,
    )
    return run


@pytest.fixture(scope="session")
def tp2_run(seed_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> SavedRun:
    """The tiny (GPT-2-style) GPT trained from the seed checkpoint under TP2, saved at the end
    (tests/training/test_loss_equivalence.py checks its losses, tests/huggingface what it saved)."""

    def train(root: Path) -> None:
        flags = [
            "--tensor-model-parallel-size",
            "2",
            "--save",
            str(root / "checkpoints"),
            "--save-interval",
            str(ITERS),
        ]
        train_from_seed(seed_checkpoint, root / "m.jsonl", 2, flags)

    root = once_per_run(tmp_path_factory, "tp2-run", train)
    return SavedRun(root / "m.jsonl", root / "checkpoints")

"""Property-based: any command line, valid or not, ends in sane numbers or one clean error, never a traceback.

Hypothesis draws values for the numeric flags (in range and out of it: zero,
negative, fractions above 1) of ``pretrain_gpt.py --dry-run`` (parsed in
process, as pretrain_gpt.py does) and of ``tools/layout.py``. A run either
succeeds with positive token counts, parameters, memory and step times and a
bubble in [0, 1) of the step, or fails with a ConfigError / LayoutError
(pretrain_gpt.py prints it as one ``error:`` line, exit code 2), or the
calculator's exit code 2 with one ``error:`` line. The number of examples is
bounded so that this file runs in seconds; failures hypothesis found are
kept as regular cases in ``tests/config/test_arguments.py``.
"""

from __future__ import annotations

import contextlib
import io
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from megatron_ext.cli.layout import main as layout_tool
from megatron_ext.config.arguments import ConfigError
from megatron_ext.config.exit_codes import ExitCode
from megatron_ext.config.training_config import parse_args
from megatron_ext.estimate import derived_numbers
from megatron_ext.parallel.layout import LayoutError

pytestmark = pytest.mark.unit

SIZES = st.sampled_from([-1, 0, 1, 2, 3, 4, 6, 8, 12, 16, 64, 96, 128, 256])
SMALL = st.integers(min_value=-2, max_value=9)
PROBABILITY = st.floats(min_value=-0.5, max_value=1.5, allow_nan=False)
RATE = st.sampled_from([-1.0, 0.0, 1e-6, 1e-4, 3e-4, 1.0])

PRETRAIN_FLAGS: dict[str, Any] = {
    "--num-layers": SIZES,
    "--hidden-size": SIZES,
    "--num-attention-heads": SIZES,
    "--seq-length": SIZES,
    "--max-position-embeddings": SIZES,
    "--ffn-hidden-size": SIZES,
    "--vocab-size": SIZES,
    "--micro-batch-size": SMALL,
    "--global-batch-size": SIZES,
    "--tensor-model-parallel-size": SMALL,
    "--pipeline-model-parallel-size": SMALL,
    "--num-layers-per-virtual-pipeline-stage": SMALL,
    "--num-virtual-stages-per-pipeline-rank": SMALL,
    "--decoder-first-pipeline-num-layers": SMALL,
    "--decoder-last-pipeline-num-layers": SMALL,
    "--microbatch-group-size-per-virtual-pipeline-stage": SMALL,
    "--world-size": SIZES,
    "--lr": RATE,
    "--min-lr": RATE,
    "--hidden-dropout": PROBABILITY,
    "--attention-dropout": PROBABILITY,
    "--train-iters": SMALL,
    "--lr-warmup-iters": SMALL,
    "--log-interval": SMALL,
    "--eval-iters": SMALL,
}
CALCULATOR_FLAGS: dict[str, Any] = {
    "--gpus": SIZES,
    "--gpus-per-node": st.sampled_from([-1, 0, 1, 2, 4, 8]),
    "--num-layers": SIZES,
    "--hidden-size": SIZES,
    "--num-attention-heads": SIZES,
    "--seq-length": SIZES,
    "--vocab-size": SIZES,
    "--micro-batch-size": SMALL,
    "--global-batch-size": SIZES,
    "--tp": SMALL,
    "--pp": SMALL,
    "--vp": SMALL,
    "--decoder-first-pipeline-num-layers": SMALL,
    "--decoder-last-pipeline-num-layers": SMALL,
    "--hidden-dropout": PROBABILITY,
}


def command_lines(flags: dict[str, Any]) -> st.SearchStrategy[list[str]]:
    """A subset of ``flags`` with drawn values, as a command line."""
    chosen = st.lists(st.sampled_from(sorted(flags)), unique=True, max_size=len(flags))
    return chosen.flatmap(
        lambda names: st.tuples(*(flags[n] for n in names)).map(
            lambda values: [part for n, v in zip(names, values, strict=True) for part in (n, f"{v:g}")]
        )
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(command_lines(PRETRAIN_FLAGS))
def test_pretrain_dry_run_is_sane_or_a_named_error(argv: list[str]) -> None:
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            cfg = parse_args(["--mock-data", *argv])
    except (ConfigError, LayoutError) as exc:
        assert str(exc).strip(), "an error without a message"
        return
    except SystemExit as exc:  # argparse (e.g. "-2e-16" read as an option): one line, exit code 2
        assert exc.code == ExitCode.INVALID and err.getvalue().startswith("error:"), err.getvalue()
        assert len(err.getvalue().strip().splitlines()) == 1, err.getvalue()
        return
    layout = cfg.layout
    assert layout.dp >= 1 and layout.num_microbatches >= 1 and layout.layers_per_virtual_stage >= 1
    assert layout.global_batch_size * cfg.model.seq_length > 0
    assert 0 <= (layout.pp - 1) / (layout.vp * layout.num_microbatches + layout.pp - 1) < 1
    counts = derived_numbers.parameter_counts(cfg)
    assert counts.total > 0 and counts.max_per_rank > 0
    assert derived_numbers.describe(cfg)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(command_lines(CALCULATOR_FLAGS))
def test_calculator_is_sane_or_a_named_error(argv: list[str]) -> None:
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            code = layout_tool([*argv, "--json", "--top", "3"], stdout=out, stderr=err)
    except SystemExit as exc:  # argparse refusing a value: one line, exit code 2
        code = int(exc.code or 0)
    assert code in (ExitCode.OK, ExitCode.INVALID, ExitCode.DOES_NOT_FIT), err.getvalue()
    if code == ExitCode.INVALID:
        lines = [line for line in err.getvalue().splitlines() if line.strip()]
        assert lines and lines[0].startswith("error:"), err.getvalue()
        return
    doc = json.loads(out.getvalue())
    for layout in doc["layouts"]:
        assert layout["memory"]["total_bytes"] > 0 and layout["step_time_s"] > 0
        assert layout["tokens_per_sec"] > 0 and 0 <= layout["bubble_share_of_step"] < 1
        assert all(value >= 0 for value in layout["time"].values())

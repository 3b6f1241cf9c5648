"""The zero-bubble fork's users' scripts carry over: its flags beside ``--enable-zero-bubble`` are accepted and
named where they change nothing here, and refused with the fix where they ask for what is not built."""

from __future__ import annotations

import dataclasses

import pytest

from megatron_ext.config.arguments import ConfigError
from megatron_ext.config.training_config import parse_args

pytestmark = pytest.mark.unit

PP2 = (
    "--num-layers 8 --hidden-size 64 --num-attention-heads 4 --seq-length 32 --mock-data --global-batch-size 8 "
    "--pipeline-model-parallel-size 2 --device cpu"
).split()

# The flags the fork's README and example scripts pass with --enable-zero-bubble (ZERO_BUBBLE_MEM_LIMIT = 1·PP).
FORK_SCRIPT = (
    "--enable-zero-bubble --zero-bubble-pipeline-timers-start-iter 100 --zero-bubble-pipeline-timers-end-iter 110 "
    "--zero-bubble-max-pending-backward 2 --enable-optimizer-post-validation --enable-exactly-numeric-match "
    "--enable-zb-runtime --no-pre-communication-optimization --allow-padding-num-layers"
).split()


def _refused(argv: list[str]) -> str:
    with pytest.raises(ConfigError, match="refuses") as caught:
        parse_args(argv, world_size=2)
    return str(caught.value)


def test_a_fork_script_runs_zb_h1_with_each_companion_flag_named() -> None:
    fork = parse_args([*PP2, *FORK_SCRIPT], world_size=2)
    ours = parse_args([*PP2, "--enable-zero-bubble"], world_size=2)
    assert dataclasses.replace(fork, adjustments=()) == dataclasses.replace(ours, adjustments=())
    named = {note.split(":", 1)[0] for note in fork.adjustments}
    assert named >= {flag for flag in FORK_SCRIPT if flag.startswith("--") and flag != "--enable-zero-bubble"}


@pytest.mark.parametrize(
    ("value", "reason"),
    [("4", "ZB-2p"), ("auto", "adaptive memory limit is not built"), ("half", "takes an integer or auto")],
)
def test_a_pending_backward_limit_other_than_the_pipeline_size_is_refused_with_the_fix(value: str, reason: str) -> None:
    message = _refused([*PP2, "--enable-zero-bubble", "--zero-bubble-max-pending-backward", value])
    assert reason in message
    assert "give --zero-bubble-max-pending-backward 2" in message


def test_without_zero_bubble_the_limit_is_ignored_as_the_fork_ignores_it() -> None:
    cfg = parse_args([*PP2, "--zero-bubble-max-pending-backward", "auto"], world_size=2)
    assert not cfg.parallel.enable_zero_bubble
    assert any(note.startswith("--zero-bubble-max-pending-backward") for note in cfg.adjustments)


@pytest.mark.parametrize(
    "flags", [["--zero-bubble-v-schedule"], ["--zero-bubble-v-schedule-mem-setup", "half"], ["--enable-1f1b-v"]]
)
def test_the_v_schedules_are_refused_naming_the_schedule_chosen_instead(flags: list[str]) -> None:
    message = _refused([*PP2, "--enable-zero-bubble", *flags])
    assert f"{' '.join(flags)}: the V placement" in message
    assert "--num-layers-per-virtual-pipeline-stage" in message

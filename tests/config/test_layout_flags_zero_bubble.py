"""--enable-zero-bubble's rules, checked before launch with the fix named (``layout_flags.zero_bubble_problems``)."""

from __future__ import annotations

import pytest

from megatron_ext.config.arguments import ConfigError
from megatron_ext.config.training_config import parse_args

pytestmark = pytest.mark.unit

BASE = (
    "--num-layers 8 --hidden-size 64 --num-attention-heads 4 --seq-length 32 --mock-data --global-batch-size 8".split()
)


def test_zb_h1_on_a_plain_pipeline_is_accepted() -> None:
    cfg = parse_args([*BASE, "--pipeline-model-parallel-size", "2", "--enable-zero-bubble", "--device", "cpu"],
                     world_size=2)  # fmt: skip
    assert cfg.parallel.enable_zero_bubble and cfg.layout.pp == 2


def test_zb_with_sequence_parallelism_is_accepted() -> None:
    cfg = parse_args([*BASE, "--pipeline-model-parallel-size", "2", "--tensor-model-parallel-size", "2",
                      "--sequence-parallel", "--enable-zero-bubble", "--device", "cpu"], world_size=4)  # fmt: skip
    assert cfg.parallel.enable_zero_bubble and cfg.layout.sequence_parallel


def test_zb_with_virtual_stages_is_zb_interleaved_and_accepted() -> None:
    cfg = parse_args([*BASE, "--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "2",
                      "--enable-zero-bubble", "--device", "cpu"], world_size=2)  # fmt: skip
    assert cfg.parallel.enable_zero_bubble and cfg.layout.vp == 2


@pytest.mark.parametrize(
    "flags, world_size, message",
    [
        ([], 1, "a pipeline to fill: give --pipeline-model-parallel-size 2 or more"),
    ],
)  # fmt: skip
def test_what_zb_h1_needs_is_named_with_the_fix(flags: list[str], world_size: int, message: str) -> None:
    with pytest.raises(ConfigError, match="--enable-zero-bubble needs") as caught:
        parse_args([*BASE, *flags, "--enable-zero-bubble", "--device", "cpu"], world_size=world_size)
    assert message in str(caught.value)


def test_transformer_engine_layers_are_refused_with_the_reason() -> None:
    with pytest.raises(ConfigError, match="give --transformer-impl local"):
        parse_args([*BASE, "--pipeline-model-parallel-size", "2", "--enable-zero-bubble", "--device", "cuda",
                    "--transformer-impl", "transformer_engine"], world_size=2)  # fmt: skip

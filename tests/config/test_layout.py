"""Layout rules and their messages (no process group)."""

from __future__ import annotations

import pytest

from megatron_ext.parallel.layout import LayoutError, ParallelLayout


def make(**kw: object) -> ParallelLayout:
    base: dict[str, object] = dict(world_size=8, num_layers=8, num_attention_heads=8, global_batch_size=16)
    base.update(kw)
    return ParallelLayout.from_flags(**base)  # type: ignore[arg-type]


def problems(**kw: object) -> list[str]:
    with pytest.raises(LayoutError) as info:
        make(**kw)
    return info.value.problems


pytestmark = pytest.mark.unit


def test_derived_numbers() -> None:
    layout = make(
        world_size=16,
        tensor_model_parallel_size=2,
        pipeline_model_parallel_size=4,
        virtual_pipeline_model_parallel_size=2,
        micro_batch_size=1,
        global_batch_size=32,
    )
    assert layout.dp == 2
    assert layout.num_microbatches == 16
    assert layout.layers_per_pipeline_stage == 2
    assert layout.layers_per_virtual_stage == 1
    assert layout.bubble_fraction == pytest.approx(3 / (2 * 16))


def test_virtual_stage_from_layers_per_virtual_stage() -> None:
    layout = make(pipeline_model_parallel_size=2, num_layers_per_virtual_pipeline_stage=2)
    assert layout.vp == 2 and layout.interleaved


def test_default_global_batch_is_micro_batch_times_dp() -> None:
    layout = ParallelLayout.from_flags(
        world_size=8,
        tensor_model_parallel_size=2,
        micro_batch_size=3,
        num_layers=2,
        num_attention_heads=2,
        global_batch_size=None,
    )
    assert layout.global_batch_size == 12 and layout.num_microbatches == 1


def test_interleaved_layer_assignment_is_round_robin() -> None:
    layout = make(pipeline_model_parallel_size=2, virtual_pipeline_model_parallel_size=2)
    assert list(layout.stage_layers(0, 0)) == [0, 1]
    assert list(layout.stage_layers(1, 0)) == [2, 3]
    assert list(layout.stage_layers(0, 1)) == [4, 5]
    assert list(layout.stage_layers(1, 1)) == [6, 7]


def test_layers_not_divisible_by_pipeline_times_virtual() -> None:
    (msg,) = problems(
        world_size=6, num_layers=30, pipeline_model_parallel_size=3, virtual_pipeline_model_parallel_size=4
    )
    assert msg.startswith("num_layers=30 is not divisible by pipeline(3) × virtual(4) = 12")
    assert "try 24 or 36 layers" in msg and "VP in [1, 2, 5, 10]" in msg


def test_layers_not_divisible_by_pipeline() -> None:
    (msg,) = problems(num_layers=30, pipeline_model_parallel_size=4)
    assert msg.startswith("num_layers=30 is not divisible by pipeline(4)")
    assert "28 or 32 layers" in msg


def test_world_size_not_divisible() -> None:
    msgs = problems(world_size=12, tensor_model_parallel_size=8, pipeline_model_parallel_size=2)
    assert any("world_size=12 is not divisible by tensor(8) × pipeline(2) = 16" in m for m in msgs)


def test_heads_and_query_groups_vs_tp() -> None:
    msgs = problems(num_attention_heads=6, num_query_groups=3, tensor_model_parallel_size=2)
    assert not any(m.startswith("num_attention_heads=6") for m in msgs)
    assert any("num_query_groups=3 is not divisible by tensor(2)" in m for m in msgs)
    msgs = problems(num_attention_heads=10, tensor_model_parallel_size=4, world_size=4)
    assert any("num_attention_heads=10 is not divisible by tensor(4)" in m for m in msgs)


def test_mlp_width_vs_tp() -> None:
    """Megatron-Core's fc1/fc2 split ffn_hidden_size over TP (SwiGLU doubles fc1, not the divisor)."""
    (msg,) = problems(ffn_hidden_size=171, tensor_model_parallel_size=2)
    assert (
        msg == "ffn_hidden_size=171 is not divisible by tensor(2); use TP in [1, 3] or an ffn_hidden_size of 170 or 172"
    )
    (msg,) = problems(ffn_hidden_size=11006, tensor_model_parallel_size=8)
    assert (
        msg
        == "ffn_hidden_size=11006 is not divisible by tensor(8); use TP in [1, 2] or an ffn_hidden_size of 11000 or 11008"
    )
    assert make(ffn_hidden_size=11008, tensor_model_parallel_size=8).tp == 8
    assert make(ffn_hidden_size=None, tensor_model_parallel_size=8).tp == 8  # unknown: not checked


def test_global_batch_not_divisible() -> None:
    (msg,) = problems(global_batch_size=20, micro_batch_size=2, world_size=8)
    assert "global_batch_size=20 is not divisible by micro_batch(2) × data_parallel(8) = 16" in msg
    assert "try 16 or 32" in msg


def test_interleaved_microbatches_must_be_multiple_of_pipeline() -> None:
    (msg,) = problems(
        world_size=4,
        pipeline_model_parallel_size=4,
        virtual_pipeline_model_parallel_size=2,
        global_batch_size=6,
        micro_batch_size=1,
    )
    assert "microbatches per step (6" in msg and "fewer than pipeline(4)" in msg
    assert "--microbatch-group-size-per-virtual-pipeline-stage in [6]" in msg
    assert "global_batch_size 4 or 8" in msg


def test_virtual_needs_pipeline() -> None:
    msgs = problems(virtual_pipeline_model_parallel_size=2)
    assert any("needs pipeline parallelism" in m for m in msgs)


def test_sequence_parallel_needs_tp() -> None:
    msgs = problems(sequence_parallel=True)
    assert any("sequence_parallel needs tensor parallelism" in m for m in msgs)


def test_tp_within_node() -> None:
    msgs = problems(world_size=32, tensor_model_parallel_size=16, num_attention_heads=16, gpus_per_node=8)
    assert any("tensor parallelism must stay within a node" in m for m in msgs)


def test_every_problem_is_reported_at_once() -> None:
    msgs = problems(world_size=6, tensor_model_parallel_size=4, num_layers=7, pipeline_model_parallel_size=2)
    assert len(msgs) >= 2


def test_contradicting_virtual_flags() -> None:
    with pytest.raises(LayoutError, match="each set the virtual pipeline size; give one of them"):
        make(
            pipeline_model_parallel_size=2,
            num_layers_per_virtual_pipeline_stage=2,
            virtual_pipeline_model_parallel_size=4,
        )

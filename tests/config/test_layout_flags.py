"""Flags → ParallelLayout → flags: ``build_layout`` and ``layout_args`` name every layout field, in both directions."""

from __future__ import annotations

import dataclasses

import pytest

from megatron_ext.config.arguments import BatchArgs, ModelArgs, ParallelArgs
from megatron_ext.config.layout_flags import LAYOUT_FLAGS, build_layout, layout_args, replace_layout_flags
from megatron_ext.config.training_config import parse_args

pytestmark = pytest.mark.unit

MODEL = ModelArgs(num_layers=14, hidden_size=128, num_attention_heads=8, seq_length=256, vocab_size=1000)

LAYOUTS = {
    "tp2-dp4": ParallelArgs(tensor_model_parallel_size=2, sequence_parallel=True, use_distributed_optimizer=True),
    "pp2-even-interleaved": ParallelArgs(pipeline_model_parallel_size=2, num_layers_per_virtual_pipeline_stage=7),
    "pp4-first-last": ParallelArgs(
        pipeline_model_parallel_size=4,
        virtual_pipeline_model_parallel_size=2,
        decoder_first_pipeline_num_layers=2,
        decoder_last_pipeline_num_layers=4,
    ),
    "pp2-account": ParallelArgs(
        pipeline_model_parallel_size=2,
        account_for_embedding_in_pipeline_split=True,
        account_for_loss_in_pipeline_split=True,
        num_layers_per_virtual_pipeline_stage=4,
    ),
    "pp2-layout-string": ParallelArgs(
        pipeline_model_parallel_size=2, pipeline_model_parallel_layout="Et*3|t*4|t*4|t*3L"
    ),
    "pp2-group": ParallelArgs(
        pipeline_model_parallel_size=2, virtual_pipeline_model_parallel_size=7, microbatch_group_size_per_vp_stage=3
    ),
}


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_the_flags_of_a_layout_give_it_back(name: str) -> None:
    batch = BatchArgs(micro_batch_size=1, global_batch_size=24)
    layout = build_layout(MODEL, LAYOUTS[name], batch, world_size=8)
    again = build_layout(MODEL, layout_args(layout), batch, world_size=8)
    assert again == layout
    # and as a command line, through the parser itself
    argv = replace_layout_flags(
        ["--num-layers", "14", "--hidden-size", "128", "--num-attention-heads", "8", "--seq-length", "256",
         "--vocab-size", "1000", "--global-batch-size", "24", "--mock-data", "--tensor-model-parallel-size", "4"],
        layout,
    )  # fmt: skip
    assert parse_args(argv, world_size=8).layout == layout


def test_every_layout_flag_reaches_the_layout() -> None:
    """Changing any one layout flag changes the layout (or is refused): none is dropped on the way."""
    base = build_layout(
        MODEL, ParallelArgs(pipeline_model_parallel_size=2), BatchArgs(global_batch_size=24), world_size=8
    )
    changes = {
        "tensor_model_parallel_size": 2,
        "pipeline_model_parallel_size": 1,
        "context_parallel_size": 2,
        "num_layers_per_virtual_pipeline_stage": 1,
        "virtual_pipeline_model_parallel_size": 7,
        "decoder_first_pipeline_num_layers": 6,
        "decoder_last_pipeline_num_layers": 6,
        "account_for_embedding_in_pipeline_split": True,
        "account_for_loss_in_pipeline_split": True,
        "pipeline_model_parallel_layout": "Et*7|t*7L",
        "microbatch_group_size_per_vp_stage": 3,
        "sequence_parallel": True,
        "use_distributed_optimizer": True,
    }
    assert set(changes) == LAYOUT_FLAGS
    for name, value in changes.items():
        parallel = dataclasses.replace(ParallelArgs(pipeline_model_parallel_size=2), **{name: value})
        if name == "sequence_parallel":
            parallel = dataclasses.replace(parallel, tensor_model_parallel_size=2)
        if name == "microbatch_group_size_per_vp_stage":
            parallel = dataclasses.replace(parallel, virtual_pipeline_model_parallel_size=7)
        try:
            layout = build_layout(MODEL, parallel, BatchArgs(global_batch_size=24), world_size=8)
        except ValueError:
            continue  # refused is not dropped
        assert layout != base, name

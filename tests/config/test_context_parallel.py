"""Context parallelism: its layout rules, its refusal where Megatron-Core cannot run it, and the calculator's
account of it (activations and optimizer shards over CP, the key/value ring)."""

from __future__ import annotations

import pytest
import torch

from megatron_ext.config.arguments import ConfigError
from megatron_ext.config.training_config import parse_args
from megatron_ext.estimate.hardware import get_profile
from megatron_ext.estimate.memory import estimate_memory
from megatron_ext.estimate.search import Cluster, evaluate
from megatron_ext.estimate.workload import Workload
from megatron_ext.parallel.layout import LayoutError, ParallelLayout
from megatron_ext.training.model import check_transformer_engine
from tests.estimate.test_memory import gpt, layout

pytestmark = pytest.mark.unit


def _problems(**kw: object) -> list[str]:
    values: dict[str, object] = dict(
        world_size=16, num_layers=8, num_attention_heads=8, global_batch_size=16, seq_length=4096
    )
    values.update(kw)
    with pytest.raises(LayoutError) as info:
        ParallelLayout.from_flags(**values)  # type: ignore[arg-type]
    return info.value.problems


def test_world_is_tp_cp_pp_dp_and_each_sequence_splits_into_two_chunks_per_rank() -> None:
    lay = ParallelLayout.from_flags(
        world_size=16, tensor_model_parallel_size=2, context_parallel_size=2, pipeline_model_parallel_size=2,
        num_layers=8, num_attention_heads=8, global_batch_size=None, seq_length=4096,
    )  # fmt: skip
    assert (lay.dp, lay.global_batch_size, lay.num_microbatches) == (2, 2, 1)
    assert "world size: 16 = TP 2 × CP 2 × PP 2 × DP 2" in lay.describe()[0]
    (world,) = _problems(world_size=12, context_parallel_size=8)
    assert "tensor(1) × context(8) × pipeline(1) = 8; use 8 or 16 processes" in world
    (chunks,) = _problems(context_parallel_size=4, seq_length=4100)
    assert "seq_length=4100 is not divisible by 2 × context(4) = 8" in chunks
    (sp,) = _problems(context_parallel_size=2, tensor_model_parallel_size=4, sequence_parallel=True, seq_length=4092)
    assert "4092 / context(2) = 2046 tokens per rank is not divisible by tensor(4) with sequence parallel" in sp


def test_refused_before_launch_where_megatron_cores_attention_cannot_split_the_sequence() -> None:
    argv = ["--mock-data", "--context-parallel-size", "2", "--world-size", "2", "--seq-length", "128"]
    assert parse_args(argv).layout.cp == 2  # --dry-run for a cluster with Transformer Engine
    for flags, why in (
        (["--device", "cpu"], "--device cpu"),
        (["--transformer-impl", "local"], "--transformer-impl local"),
        # Before: accepted here, refused at start-up (Megatron-Core's own attention is the local spec's).
        (["--attention-backend", "local"], "--attention-backend local"),
    ):
        with pytest.raises(ConfigError, match=f"needs Transformer Engine's attention, which {why}"):
            parse_args([*argv, *flags])
    # Transformer Engine's unfused backend does not split sequences, and the flag turns the others off.
    with pytest.raises(ConfigError, match="needs Transformer Engine's flash or fused attention: its unfused backend"):
        parse_args([*argv, "--attention-backend", "unfused"])
    with pytest.raises(ConfigError, match="needs Transformer Engine's attention, and this run is on CPU"):
        check_transformer_engine(parse_args(argv), torch.device("cpu"))


def test_the_calculator_splits_activations_and_optimizer_state_over_cp() -> None:
    workload = Workload(model=gpt(seq_length=16384), precision="bf16", recompute_granularity="selective")
    common = dict(tp=8, pp=8, gbs=256, sequence_parallel=True, use_distributed_optimizer=True)
    model = gpt(seq_length=16384)
    one = layout(1024, model=model, **common)  # type: ignore[arg-type]
    two = layout(1024, model=model, context_parallel_size=2, **common)  # type: ignore[arg-type]
    m1, m2 = estimate_memory(workload, one), estimate_memory(workload, two)
    assert m2.layer_activation_bytes == pytest.approx(m1.layer_activation_bytes / 2)
    # The distributed optimizer shards over DP × CP: the same 16 shards either way.
    assert (one.dp, two.dp) == (16, 8)
    assert m2.most_loaded.optimizer_bytes == pytest.approx(m1.most_loaded.optimizer_bytes)
    cluster = Cluster(gpu=get_profile("h100-sxm"), gpus=1024, gpus_per_node=8)
    t1, t2 = evaluate(workload, one, cluster).time, evaluate(workload, two, cluster).time
    # Each rank computes half of every sequence, for twice the microbatches.
    assert t2.microbatch_compute_s == pytest.approx(t1.microbatch_compute_s / 2, rel=0.02)
    assert t2.compute_s == pytest.approx(t1.compute_s, rel=0.02)
    # Across nodes (TP 8 × CP 2 > 8 GPUs per node) with short sequences the ring is no longer hidden.
    short = Workload(model=gpt(seq_length=2048), precision="bf16")
    exposed = evaluate(short, layout(1024, model=gpt(seq_length=2048), context_parallel_size=2, **common), cluster)
    assert exposed.time.cp_comm_s > 0 and t1.cp_comm_s == 0

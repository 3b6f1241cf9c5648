"""Pipeline point-to-point time: the closed form against an event simulation, and what it does to the ranking.

Narayanan et al. 2021, §2.2.2: interleaving cuts the bubble by ``v`` but
multiplies the pipeline communication by ``v``. ``step_time.pipeline_p2p_exposed``
charges the fill and drain's latency or the busiest link's occupancy,
whichever binds. The reference here is an event simulation of one step in
Megatron-Core 0.16's order (``pipeline_schedule.schedule_order``, itself
checked against recorded runs) with what its p2p calls do
(``megatron/core/pipeline_parallel/schedules.py``, ``overlap_p2p_comm`` on
and ``overlap_p2p_comm_warmup_flush`` off for interleaving, as ``model.py``
configures it; batched blocking p2p for 1F1B):

* each rank sends through one link (its NIC), one message at a time, ``x``
  seconds each; a message arrives when its transfer ends;
* 1F1B, and the warm-up and cool-down passes of the interleaved schedule:
  the rank waits for its send to finish before its next pass;
* interleaved steady state: the send is posted and the rank goes on; it waits
  for the previous send in the same direction after posting the next one;
* a pass starts when its rank is free and its input has arrived.
"""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from megatron_ext.config.arguments import ModelArgs
from megatron_ext.config.layout_flags import model_layout_facts
from megatron_ext.config.presets import get_preset
from megatron_ext.estimate.hardware import get_profile
from megatron_ext.estimate.pipeline_schedule import PipelinePass, schedule_order, simulate
from megatron_ext.estimate.search import Cluster, evaluate, search
from megatron_ext.estimate.step_time import cross_entropy_bytes, pipeline_p2p_exposed, unit_times
from megatron_ext.estimate.workload import Workload
from megatron_ext.parallel.layout import ParallelLayout
from megatron_ext.parallel.pipeline import warmup_passes

pytestmark = pytest.mark.unit


def simulate_with_links(
    *, pp: int, vp: int, m: int, forward: float, backward: float, transfer: float, overlap: bool = True
) -> float:
    """Makespan of one step with one sending link per rank (the rules in the module docstring; ``overlap``
    False: ``--no-overlap-p2p-communication``, every pass of the interleaved schedule waits for its send too)."""
    p, v = pp, vp
    orders = [schedule_order(pp=p, vp=v, num_microbatches=m, pipeline_rank=r) for r in range(p)]
    warmup = [warmup_passes(pp=p, vp=v, num_microbatches=m, pipeline_rank=r) for r in range(p)]
    duration = {"F": forward / v, "B": backward / v}
    arrived: dict[tuple[int, str, int, int], float] = {}  # (receiving rank, kind, microbatch, chunk)
    last_forward_end: dict[int, float] = {}  # the last stage's own forward output feeds its backward
    free, link, position = [0.0] * p, [0.0] * p, [0] * p
    previous_send = [{"F": 0.0, "B": 0.0} for _ in range(p)]

    def source(rank: int, step: PipelinePass) -> tuple[int, str, int, int] | None:
        mb, c = step.microbatch, step.chunk
        if step.kind == "F":
            return None if rank == 0 and c == 0 else (rank, "F", mb, c)
        return None if rank == p - 1 and c == v - 1 else (rank, "B", mb, c)

    def destination(rank: int, step: PipelinePass) -> tuple[int, str, int, int] | None:
        mb, c = step.microbatch, step.chunk
        if step.kind == "F":
            if rank < p - 1:
                return (rank + 1, "F", mb, c)
            return (0, "F", mb, c + 1) if c < v - 1 else None
        if rank > 0:
            return (rank - 1, "B", mb, c)
        return (p - 1, "B", mb, c - 1) if c > 0 else None

    remaining = sum(len(order) for order in orders)
    while remaining:
        progressed = False
        for rank in range(p):
            while position[rank] < len(orders[rank]):
                j = position[rank]
                step = orders[rank][j]
                needs = source(rank, step)
                if needs is None and step.kind == "B":  # the last stage's last chunk: its own forward
                    if step.microbatch not in last_forward_end:
                        break
                    ready = last_forward_end[step.microbatch]
                elif needs is None:
                    ready = 0.0
                elif needs in arrived:
                    ready = arrived[needs]
                else:
                    break
                end = max(free[rank], ready) + duration[step.kind]
                if step.kind == "F" and rank == p - 1 and step.chunk == v - 1:
                    last_forward_end[step.microbatch] = end
                sent = end
                target = destination(rank, step)
                if target is not None:
                    sent = max(end, link[rank]) + transfer
                    link[rank] = arrived[target] = sent
                steady = warmup[rank] <= j < len(orders[rank]) - warmup[rank]
                if v > 1 and steady and overlap:
                    free[rank] = max(end, previous_send[rank][step.kind])
                    previous_send[rank][step.kind] = sent
                else:
                    free[rank] = sent
                position[rank] += 1
                remaining -= 1
                progressed = True
        assert progressed, "the order deadlocks"
    return max(*free, *link)


def closed_form(*, pp: int, vp: int, m: int, forward: float, backward: float, transfer: float) -> float:
    stage = forward + backward
    ideal_and_bubble = (m + (pp - 1) / vp) * stage
    return ideal_and_bubble + pipeline_p2p_exposed(
        pp=pp, vp=vp, num_microbatches=m, stage_time=stage, transfer_time=transfer
    )


GRID = [
    (p, v, k * p, forward, backward)
    for p, v, k, (forward, backward) in itertools.product([2, 3, 4, 8], [1, 2, 3, 4], [1, 4], [(1.0, 2.0), (1.0, 3.0)])
]


@pytest.mark.parametrize("vp", [1, 2, 4])
def test_the_simulation_without_transfers_is_the_schedule_timeline(vp: int) -> None:
    for p, m in [(2, 4), (4, 8), (8, 16)]:
        expected = simulate(pp=p, vp=vp, num_microbatches=m, forward_time=1.0, backward_time=2.0).makespan
        assert simulate_with_links(pp=p, vp=vp, m=m, forward=1.0, backward=2.0, transfer=0.0) == pytest.approx(expected)


def test_exposed_p2p_follows_the_simulated_schedule() -> None:
    """Exact where transfers are short, within 20 % of the step where the link is the bottleneck."""
    worst = 0.0
    for p, v, m, forward, backward in GRID:
        chunk_pair = (forward + backward) / v  # compute one transfer in each direction can hide behind
        for ratio in (0.05, 0.1, 0.2, 0.5, 1.0, 2.0):
            x = ratio * chunk_pair
            kw = dict(pp=p, vp=v, m=m, forward=forward, backward=backward, transfer=x)
            simulated, model = simulate_with_links(**kw), closed_form(**kw)
            case = f"p={p} v={v} m={m} fwd:bwd={forward}:{backward} x={ratio}·T/v: {model:.2f} vs {simulated:.2f}"
            if v == 1:
                # Blocking 1F1B: the count of exposed transfers, within 3 of the simulated critical path.
                assert 0 <= model - simulated <= 3 * x + 1e-9, case
            elif ratio <= 0.2:
                # Compute-bound interleaving: the fill and drain's 2(pv − 1) transfers, exactly.
                assert model == pytest.approx(simulated, rel=1e-9), case
            else:
                worst = max(worst, abs(model / simulated - 1))
                assert model == pytest.approx(simulated, rel=0.20), case
    assert worst > 0.01  # the link-bound cases were reached


def test_blocking_interleaved_transfers_follow_the_simulated_schedule() -> None:
    """``--no-overlap-p2p-communication`` (PP > 2): never below the simulated step, within 10% of it (at most 10%
    with one microbatch per stage and transfers as long as a chunk's compute, under 5% otherwise)."""
    worst = 0.0
    for p, v, m, forward, backward in GRID:
        if p == 2 or v == 1:
            continue
        for ratio in (0.05, 0.2, 1.0):
            x = ratio * (forward + backward) / v
            simulated = simulate_with_links(
                pp=p, vp=v, m=m, forward=forward, backward=backward, transfer=x, overlap=False
            )
            stage = forward + backward
            model = (m + (p - 1) / v) * stage + pipeline_p2p_exposed(
                pp=p, vp=v, num_microbatches=m, stage_time=stage, transfer_time=x, overlap=False
            )
            case = f"p={p} v={v} m={m} x={ratio}·T/v: {model:.2f} vs {simulated:.2f}"
            worst = max(worst, model / simulated - 1)
            assert simulated - 1e-9 <= model <= simulated * 1.101, case
            overlapped = simulate_with_links(pp=p, vp=v, m=m, forward=forward, backward=backward, transfer=x)
            assert overlapped <= simulated + 1e-9, case  # overlapping never loses
    assert worst > 0.01


GPT3_1_3B = Workload(model=ModelArgs(**get_preset("gpt3-1.3b").model_flags()), precision="bf16")


def _step_by_vp(inter_node_gbps: float) -> dict[int, float]:
    """GPT-3 1.3B on 64 H100s, TP 1 × PP 4 × DP 16, micro-batch 1, global batch 512: step time by VP."""
    gpu = get_profile("h100-sxm").with_overrides(inter_node_gbps=inter_node_gbps)
    cluster = Cluster(gpus=64, gpus_per_node=8, gpu=gpu)
    steps = {}
    for vp in (1, 2, 3, 6):
        layout = ParallelLayout(
            world_size=64, pipeline_model_parallel_size=4, virtual_pipeline_model_parallel_size=vp if vp > 1 else None,
            micro_batch_size=1, global_batch_size=512, num_layers=24, num_attention_heads=16, seq_length=2048,
        )  # fmt: skip
        steps[vp] = evaluate(GPT3_1_3B, layout, cluster).time.step_s
    return steps


def test_a_slow_link_penalises_deep_interleaving_and_a_fast_one_keeps_its_bubble_advantage() -> None:
    slow = _step_by_vp(3)  # 3 GB/s per GPU: one 8 MiB activation takes longer than a chunk's compute
    assert slow[2] < slow[3] < slow[6] and slow[2] < slow[1]
    assert slow[6] > slow[1]  # six times the messages cost more than the bubble they save
    fast = _step_by_vp(400)  # NVLink-class network: the bubble (p − 1)/(v·m) decides
    assert fast[1] > fast[2] > fast[3] > fast[6]
    # At the profile's 46 GB/s interleaving still pays for itself.
    assert _step_by_vp(46)[3] < _step_by_vp(46)[1]


def test_the_search_on_a_slow_link_weighs_the_transfers() -> None:
    """The reviewer's case: --inter-node-gbps 3 used to pick TP 1 PP 8 VP 3 with 0.04 s of p2p for ~1 s of transfers."""
    gpu = get_profile("h100-sxm").with_overrides(inter_node_gbps=3)
    result = search(GPT3_1_3B, Cluster(gpus=64, gpus_per_node=8, gpu=gpu), global_batch_size=512)
    best = result.fitting[0]
    assert best.time.pp_comm_s < 0.15 * best.time.step_s
    deepest = next(e for e in result.fitting if (e.layout.pp, e.layout.vp, e.layout.micro_batch_size) == (8, 3, 1))
    # Its 384 messages of 8 MiB at 3 GB/s (about 1.07 s) cannot hide behind 0.41 s of compute.
    assert deepest.time.step_s > 1.07 > deepest.time.compute_s * 2
    assert deepest.time.step_s > 1.5 * best.time.step_s


@pytest.mark.parametrize(
    ("precision", "fused", "forward", "backward"),
    [("bf16", False, 38, 14), ("fp16", False, 38, 14), ("fp32", False, 32, 8),
     ("bf16", True, 22, 18), ("fp16", True, 22, 22), ("fp32", True, 20, 24)],
)  # fmt: skip
def test_the_cross_entropy_moves_its_kernels_bytes_per_logit(
    precision: str, fused: bool, forward: int, backward: int
) -> None:
    """Megatron-Core's vocabulary-parallel cross entropy, kernel by kernel (step_time.cross_entropy_bytes): unfused
    the cast to fp32, maximum, subtraction, exponential, sum and division, then the product and the cast back (no
    casts in fp32); --cross-entropy-loss-fusion's compiled kernels, whose backward copies the kept softmax and
    writes it back, and returns a bf16 gradient that other precisions cast."""
    model = ModelArgs(num_layers=2, hidden_size=64, num_attention_heads=4, vocab_size=1000,
                      cross_entropy_loss_fusion=fused)  # fmt: skip
    workload = Workload(model=model, precision=precision)
    assert cross_entropy_bytes(workload, tokens=10, vocab_per_rank=100) == (1000 * forward, 1000 * backward)


def test_the_cross_entropy_is_a_ninth_of_a_small_models_microbatch_with_a_large_vocabulary() -> None:
    """docs/layout-model.md: the Megatron-LM README's 1.7B (hidden 2048, 24 layers, 131,072 tokens, sequence 4096, TP 1,
    micro-batch 4) on an H100 spends about a ninth of its microbatch in the loss; the output layer's time carries it,
    forward and backward, and fusing the loss saves its bytes' difference."""
    model = ModelArgs(num_layers=24, hidden_size=2048, num_attention_heads=16, seq_length=4096,
                      max_position_embeddings=4096, vocab_size=131072, attention_backend="auto")  # fmt: skip
    layout = ParallelLayout(
        world_size=8, micro_batch_size=4, global_batch_size=32, gpus_per_node=8, **model_layout_facts(model)
    )
    gpu = get_profile("h100-sxm")
    bandwidth = gpu.memory_bandwidth * gpu.memory_efficiency
    unfused = Workload(model=model, precision="bf16")
    fused = Workload(model=dataclasses.replace(model, cross_entropy_loss_fusion=True), precision="bf16")
    plain, quick = (unit_times(w, layout, gpu, gpus_per_node=8) for w in (unfused, fused))
    loss = [cross_entropy_bytes(w, tokens=4 * 4096, vocab_per_rank=w.padded_vocab_size(1)) for w in (unfused, fused)]
    microbatch = 24 * (plain.layer_compute_s + plain.layer_tp_s) + plain.output_compute_s
    assert 0.10 < sum(loss[0]) / bandwidth / microbatch < 0.125
    assert plain.output_compute_s - quick.output_compute_s == pytest.approx((sum(loss[0]) - sum(loss[1])) / bandwidth)
    assert plain.output_forward_s - quick.output_forward_s == pytest.approx((loss[0][0] - loss[1][0]) / bandwidth)

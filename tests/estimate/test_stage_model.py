"""The per-stage model: every stage's time and memory, the slowest stage sets the pace, uneven splits where they win."""

from __future__ import annotations

import dataclasses
import io
import json
import random

import pytest

from megatron_ext.cli.layout import main as layout_tool
from megatron_ext.config.arguments import ModelArgs
from megatron_ext.estimate.hardware import get_profile
from megatron_ext.estimate.memory import estimate_memory
from megatron_ext.estimate.pipeline_schedule import simulate
from megatron_ext.estimate.schedule_comparison import _model_chunk_times
from megatron_ext.estimate.search import SPLIT_FIELDS, Cluster, LayoutEstimate, evaluate, search
from megatron_ext.estimate.step_time import unit_times
from megatron_ext.estimate.workload import Workload
from megatron_ext.parallel.layout import ParallelLayout
from megatron_ext.parallel.pipeline import pipeline_bubble
from megatron_ext.parallel.stages import balanced_splits
from tests.estimate.published import MEGATRON_BRIDGE_H100_FP8

pytestmark = pytest.mark.unit

# A Llama-3-8B-like shape with a 256k vocabulary: the output layer costs about 2.5 layers at TP 8.
BIG_VOCAB = (
    "--num-layers 32 --hidden-size 4096 --num-attention-heads 32 --group-query-attention --num-query-groups 8 "
    "--ffn-hidden-size 14336 --swiglu --seq-length 8192 --vocab-size 256000 --gpus 64 --bf16 "
    "--global-batch-size 128 --sequence-parallel --use-distributed-optimizer"
).split()


@pytest.mark.parametrize(("p", "v", "m"), [(4, 1, 8), (4, 1, 16), (8, 1, 32), (4, 2, 8), (8, 2, 16), (2, 2, 4)])
def test_the_bubble_formula_bounds_the_simulated_schedule(p: int, v: int, m: int) -> None:
    """m·max T + (Σ T − max T)/v against Megatron-Core's order simulated with those stage times: never
    below it, at most 15% above (stage times ±30% apart; issue 12 replaces the closed form by the simulation)."""
    rng = random.Random(p * 100 + v * 10 + m)
    for _ in range(5):
        stages = [rng.uniform(0.7, 1.3) for _ in range(p)]
        timeline = simulate(
            pp=p, vp=v, num_microbatches=m, chunk_times=[[(t / 3 / v, 2 * t / 3 / v)] * v for t in stages]
        )
        predicted = m * max(stages) + pipeline_bubble(stages, vp=v)
        assert timeline.makespan <= predicted * (1 + 1e-9) <= timeline.makespan * 1.15
    # Equal stages: exactly (p - 1)/v of a stage, the textbook bubble.
    equal = simulate(pp=p, vp=v, num_microbatches=m, forward_time=1.0, backward_time=2.0)
    assert equal.makespan == pytest.approx(m * 3.0 + pipeline_bubble([3.0] * p, vp=v))


def run_calculator(*argv: str) -> dict:
    out = io.StringIO()
    code = layout_tool([*BIG_VOCAB, *argv, "--json"], stdout=out, stderr=io.StringIO())
    assert code == 0
    return json.loads(out.getvalue())


def test_an_uneven_split_is_recommended_where_the_even_one_is_imbalanced() -> None:
    """256k vocabulary, 32 layers, PP 4: the even split's last stage is over 10% slower than the mean; the
    recommended split is under 7%, as close as integer layers get, and faster."""
    doc = run_calculator("--tp", "8", "--pp", "4")
    (even,) = doc["layouts"]
    better = doc["better_split"]
    assert even["pipeline_split"] == "uniform" and even["stage_imbalance"] > 0.10
    assert max(range(4), key=lambda r: even["stages"][r]["microbatch_s"]) == 3  # the output layer's stage
    assert better["stage_imbalance"] < 0.07 and better["step_time_s"] < even["step_time_s"] * 0.95
    # docs/layout-model.md's figures: 30% -> 1.2%, 20.8% faster.
    assert round(even["stage_imbalance"], 2) == 0.30 and round(better["stage_imbalance"], 3) == 0.012
    assert 1 - better["step_time_s"] / even["step_time_s"] == pytest.approx(0.208, abs=0.002)
    # Integer layers: the output (its GEMM and the cross entropy) weighs between three and four layers, so no split
    # of 32 layers on 4 ranks does better than the heaviest stage holding 9 of the 32 + output's 35.5 layers' work.
    output = (32 * (1 + even["stage_imbalance"]) - 32) / (4 - (1 + even["stage_imbalance"]))  # (8 + o)/((32 + o)/4)
    assert 3.0 < output < 4.0 and better["stage_imbalance"] == pytest.approx(9 / ((32 + output) / 4) - 1, abs=0.01)
    assert sum(sum(s["layers"]) for s in better["stages"]) == 32
    assert better["stages"][3]["layers"][0] < 8  # the last stage gives layers away
    assert "--decoder-last-pipeline-num-layers" in better["pretrain_flags"] or "layout" in better["pretrain_flags"]


def test_the_search_ranks_uneven_splits_and_reaches_pipeline_sizes_that_do_not_divide_the_layers() -> None:
    doc = run_calculator("--top", "200")
    splits = {layout["pipeline_split"] for layout in doc["layouts"]}
    assert "uniform" in splits and splits - {"uniform"}
    # 32 layers on PP 16 needs no uneven split; 32 on PP 3 does (not a divisor), and PP 3 does not divide 64:
    # but PP 64/… layouts where layers % PP != 0 appear only with an uneven split.
    for layout in doc["layouts"]:
        if 32 % layout["pp"]:
            assert layout["pipeline_split"] != "uniform"


def test_an_uneven_split_is_kept_only_where_it_wins() -> None:
    """GPT-3 175B's 51k vocabulary is cheap next to its layers: every even layout of the search stays even."""
    model = ModelArgs(num_layers=96, hidden_size=12288, num_attention_heads=96, seq_length=2048, vocab_size=51200)
    cluster = Cluster(gpus=1024, gpus_per_node=8, gpu=get_profile("h100-sxm"))
    result = search(Workload(model=model, precision="bf16"), cluster, global_batch_size=1536, sequence_parallel=True,
                    tp=8, pp=16)  # fmt: skip
    best = result.fitting[0]
    assert not best.layout.uneven
    for e in result.estimates:
        if e.layout.uneven:  # kept: faster than the even split of the same factors by at least 1%
            even = [x for x in result.estimates if not x.layout.uneven and x.layout.vp == e.layout.vp
                    and x.layout.micro_batch_size == e.layout.micro_batch_size]  # fmt: skip
            assert not even or e.time.step_s < 0.99 * even[0].time.step_s or not even[0].fits


def test_a_middle_stage_can_be_the_most_loaded() -> None:
    """126 layers on PP 16 with 7 on each end: the middle ranks hold 8 and the most parameters."""
    model = ModelArgs(num_layers=126, hidden_size=4096, num_attention_heads=32, seq_length=4096, vocab_size=32000)
    layout = ParallelLayout.from_flags(
        world_size=16, pipeline_model_parallel_size=16, decoder_first_pipeline_num_layers=7,
        decoder_last_pipeline_num_layers=7, num_layers=126, num_attention_heads=32, global_batch_size=64,
    )  # fmt: skip
    memory = estimate_memory(Workload(model=model, precision="bf16"), layout)
    params = [st.parameters for st in memory.stages]
    assert params[1] == max(params) > params[0] and params[1] > params[-1]
    estimate = evaluate(Workload(model=model, precision="bf16"), layout, Cluster(gpus=16, gpus_per_node=8,
                                                                                  gpu=get_profile("h100-sxm")))  # fmt: skip
    stages = estimate.time.stage_microbatch_s
    assert stages[0] < stages[1] == stages[14]  # 7 layers and the embedding against 8 layers


def test_even_stages_only() -> None:
    doc = run_calculator("--top", "200", "--even-stages-only")
    assert {layout["pipeline_split"] for layout in doc["layouts"]} == {"uniform"}


def test_integer_layers_bound_the_balance_on_deep_pipelines() -> None:
    """README: 32 layers with a 256k vocabulary on PP 8 cannot get under about 12% (a layer is over a fifth of a
    stage)."""
    doc = run_calculator("--tp", "8", "--pp", "8")
    assert doc["layouts"][0]["stage_imbalance"] > 0.3
    assert 0.11 <= doc["better_split"]["stage_imbalance"] <= 0.13


def _chunk_by_chunk(workload: Workload, even: LayoutEstimate, layout: ParallelLayout) -> float:
    """Megatron-Core's order simulated with every (rank, chunk)'s own time, as ``--compare-schedules`` places them."""
    chunk_times = _model_chunk_times(workload, even)(layout)
    return simulate(
        pp=layout.pp, vp=layout.vp, num_microbatches=layout.num_microbatches, chunk_times=chunk_times
    ).makespan


def _pipeline_time(workload: Workload, layout: ParallelLayout, cluster: Cluster) -> float:
    """The estimate's compute, TP and CP communication and bubble: what the order's simulation places."""
    t = evaluate(workload, layout, cluster).time
    return t.compute_s + t.tp_comm_s + t.cp_comm_s + t.bubble_s


@pytest.mark.parametrize(
    ("layers", "pp", "vp"), [(80, 8, 5), (80, 4, 5), (80, 8, 2), (32, 4, 2), (32, 8, 2), (64, 4, 8)]
)
def test_the_searchs_uneven_splits_run_chunk_by_chunk_as_fast_as_estimated(layers: int, pp: int, vp: int) -> None:
    """The estimate prices a pipeline rank by its total work; Megatron-Core's interleaved order also feels how that
    work is spread over the rank's chunks (a heavy chunk holds back the next chunk of every rank). For every uneven
    split the search builds (``stages.balanced_splits``) of a Llama-3-70B-like shape in FP8 at TP 4, whose output
    layer weighs 1.8 layers, the order simulated chunk by chunk is never slower than the estimate's compute and
    bubble, and at most 5 % faster. A split the search does not build, the last rank's lighter chunk first and the
    output layer on a full last chunk, runs 5 % slower than its total says."""
    base = next(r for r in MEGATRON_BRIDGE_H100_FP8 if r.name == "Llama 3 70B (26.02)")
    row = dataclasses.replace(base, model=dataclasses.replace(base.model, num_layers=layers), pp=pp, vp=vp, gpus=8 * pp)
    workload, even = row.workload(), row.estimate()
    units = unit_times(workload, even.layout, row.cluster().gpu, gpus_per_node=8)
    assert units.output_in_layers == pytest.approx(1.8, abs=0.05)
    values = {k: v for k, v in even.layout.as_values().items() if k not in SPLIT_FIELDS}
    splits = balanced_splits(layers, pp, vp, loss=units.output_in_layers)
    assert splits
    for flags in splits:
        layout = ParallelLayout(**values, **flags)
        estimated = _pipeline_time(workload, layout, row.cluster())
        assert 0.95 * estimated < _chunk_by_chunk(workload, even, layout) <= estimated * (1 + 1e-9), flags
    if (layers, pp, vp) == (80, 8, 5):  # ten layers a rank: the last rank's one fewer taken from its first chunk
        light_first = "Et*2|(t*2|)*6,t|(t*2|)*27,t*3|(t*2|)*3,t*2L"
        layout = ParallelLayout(**values, pipeline_model_parallel_layout=light_first)
        assert all(ParallelLayout(**values, **flags).stages != layout.stages for flags in splits)
        assert [c.num_layers for c in layout.stages[7]] == [1, 2, 2, 2, 2] and layout.stages[7][4].loss
        estimated = _pipeline_time(workload, layout, row.cluster())
        assert _chunk_by_chunk(workload, even, layout) == pytest.approx(1.05 * estimated, abs=0.01 * estimated)

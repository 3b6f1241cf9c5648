"""GPipe, 1F1B and interleaved 1F1B side by side: bubble, activations in flight, p2p volume, microbatch groups."""

from __future__ import annotations

import dataclasses
import io
import itertools
import json
import re

import pytest

from megatron_ext.cli.layout import main as layout_tool
from megatron_ext.cli.plot_schedule import main as plot_tool
from megatron_ext.config.arguments import ModelArgs
from megatron_ext.config.exit_codes import ExitCode
from megatron_ext.config.layout_flags import model_layout_facts
from megatron_ext.config.presets import get_preset
from megatron_ext.config.training_config import parse_args
from megatron_ext.estimate.hardware import get_profile
from megatron_ext.estimate.pipeline_schedule import (
    gpipe_order,
    messages_sent,
    peak_in_flight,
    schedule_order,
    simulate,
    uniform_chunk_times,
)
from megatron_ext.estimate.schedule_comparison import (
    compare_schedules,
    group_candidates,
    run_schedule,
    runs_for_picture,
)
from megatron_ext.estimate.schedule_plot import MEMORY_COLOR, WEIGHT_COLORS
from megatron_ext.estimate.search import Cluster, evaluate
from megatron_ext.estimate.workload import Workload
from megatron_ext.parallel.layout import ParallelLayout
from megatron_ext.parallel.pipeline import in_flight_passes, valid_group_sizes

pytestmark = pytest.mark.unit

SHAPES = [(2, 1, 4), (4, 1, 8), (4, 1, 3), (2, 2, 4), (4, 2, 8), (4, 3, 12), (8, 2, 16), (3, 4, 9), (4, 2, 10)]


@pytest.mark.parametrize(("pp", "vp", "m"), SHAPES)
def test_activations_in_flight_read_off_the_order_are_the_memory_models(pp: int, vp: int, m: int) -> None:
    """The memory model's in-flight count (warm-up + 1) is what Megatron-Core's order holds at its peak, for every
    valid microbatch group; GPipe holds all m."""
    groups = valid_group_sizes(pp=pp, num_microbatches=m) if vp > 1 else [None]
    assert groups, "every shape here has a valid group"
    for rank, group in itertools.product(range(pp), groups):
        order = schedule_order(pp=pp, vp=vp, num_microbatches=m, pipeline_rank=rank, group_size=group)
        assert peak_in_flight(order) == in_flight_passes(
            pp=pp, vp=vp, num_microbatches=m, pipeline_rank=rank, group_size=group
        )
        assert peak_in_flight(gpipe_order(pp=pp, num_microbatches=m, pipeline_rank=rank)) == m


@pytest.mark.parametrize(("pp", "m"), [(2, 4), (4, 8), (4, 3), (8, 16), (3, 9)])
def test_gpipe_and_1f1b_idle_the_same_and_interleaving_cuts_it_by_v(pp: int, m: int) -> None:
    """Bubble (K−1)/(M+K−1) of the step for GPipe and 1F1B; (K−1)/(V·M+K−1) interleaved (equal stages, free p2p)."""
    flat = uniform_chunk_times(pp=pp, vp=1, forward_time=1.0, backward_time=2.0)
    for schedule in ("gpipe", "1f1b"):
        run = run_schedule(schedule, pp=pp, num_microbatches=m, chunk_times=flat, p2p_time=0.0)
        assert run.bubble_share == pytest.approx((pp - 1) / (m + pp - 1))
    if m % pp == 0:
        for vp in (2, 3):
            times = uniform_chunk_times(pp=pp, vp=vp, forward_time=1.0, backward_time=2.0)
            run = run_schedule("interleaved", pp=pp, num_microbatches=m, chunk_times=times, p2p_time=0.0)
            assert run.bubble_share == pytest.approx((pp - 1) / (vp * m + pp - 1))


@pytest.mark.parametrize(("pp", "vp", "m"), [(4, 1, 8), (2, 1, 4), (4, 2, 8), (2, 3, 6), (1, 1, 4)])
def test_messages_per_rank(pp: int, vp: int, m: int) -> None:
    """Every microbatch crosses every boundary once each way: 2·v·m messages from a middle rank, v·m…(2v−1)·m
    from the end ranks; none with one stage."""
    for rank in range(pp):
        sent = messages_sent(
            schedule_order(pp=pp, vp=vp, num_microbatches=m, pipeline_rank=rank), pp=pp, vp=vp, pipeline_rank=rank
        )
        if pp == 1:
            expected = 0
        elif rank in (0, pp - 1):
            expected = (2 * vp - 1) * m
        else:
            expected = 2 * vp * m
        assert sent == expected


def test_valid_group_sizes_are_what_the_layout_accepts() -> None:
    """The one rule (pipeline.valid_group_sizes) against ParallelLayout's check of every N from 1 to m + 1."""
    for pp, m in [(4, 10), (4, 8), (3, 7), (8, 85), (2, 3)]:
        accepted = []
        for n in range(1, m + 2):
            _, problems = ParallelLayout.check(
                world_size=pp, pipeline_model_parallel_size=pp, virtual_pipeline_model_parallel_size=2,
                micro_batch_size=1, global_batch_size=m, num_layers=2 * pp, num_attention_heads=1,
                microbatch_group_size_per_vp_stage=n,
            )  # fmt: skip
            if not problems:
                accepted.append(n)
        assert accepted == valid_group_sizes(pp=pp, num_microbatches=m)
    candidates = group_candidates(pp=8, num_microbatches=768)
    assert candidates[0] == 8 and candidates[-1] == 768 and len(candidates) <= 6
    assert all(n in valid_group_sizes(pp=8, num_microbatches=768) for n in candidates)


def test_a_larger_group_hides_the_transfers_at_the_cost_of_memory() -> None:
    """p = 4, v = 2, m = 8 with transfers of 1/20 of a stage's forward pass: the best group (N = m) exposes less
    p2p than the default N = p and holds (v − 1)·(N − p) more chunks on every rank."""
    runs = runs_for_picture(pp=4, vp=2, num_microbatches=8, forward_time=1.0, backward_time=2.0, p2p_time=0.05)
    gpipe, one_f_one_b, default, best = runs
    assert best.group_size == 8 and default.group_size is None
    assert best.p2p_exposed < default.p2p_exposed and best.timeline.makespan < default.timeline.makespan
    for rank in range(4):
        assert best.in_flight_chunks[rank] - default.in_flight_chunks[rank] == (2 - 1) * (8 - 4)
    # 1F1B's synchronous sends expose more than the interleaved schedule's overlapped ones.
    assert one_f_one_b.p2p_exposed > default.p2p_exposed
    assert gpipe.in_flight_microbatches[0] == 8 and one_f_one_b.in_flight_microbatches[0] == 4
    # Blocking sends never make a step shorter than overlapped ones on the same order.
    for blocking in (False, True):
        assert simulate(pp=4, vp=1, num_microbatches=8, p2p_time=0.05, blocking_p2p=blocking).makespan >= 24 + 3 * 3


def _gpt3_175b(tp: int, vp: int, batch: int = 256) -> tuple[Workload, ParallelLayout, Cluster]:
    workload = Workload(
        model=ModelArgs(**get_preset("gpt3-175b").model_flags()), precision="bf16", recompute_granularity="selective"
    )
    layout = ParallelLayout(
        world_size=128, tensor_model_parallel_size=tp, pipeline_model_parallel_size=8,
        virtual_pipeline_model_parallel_size=vp if vp > 1 else None, sequence_parallel=True,
        use_distributed_optimizer=True, micro_batch_size=1, global_batch_size=batch, gpus_per_node=8,
        **model_layout_facts(workload.model),
    )  # fmt: skip
    return workload, layout, Cluster(gpus=128, gpus_per_node=8, gpu=get_profile("h100-sxm"))


def test_gpt3_175b_schedules_side_by_side() -> None:
    """TP 8 PP 8 VP 4 on 128 H100s: GPipe does not fit (all 128 microbatches in flight), 1F1B fits in the least
    memory, interleaving is faster for v times the p2p volume, and the simulation agrees with the closed form."""
    workload, layout, cluster = _gpt3_175b(tp=8, vp=4)
    estimate = evaluate(workload, layout, cluster)
    options = {o.schedule: o for o in compare_schedules(workload, estimate)}
    gpipe, flat, inter, grouped = (options[s] for s in ("gpipe", "1f1b", "interleaved", "interleaved-group"))
    assert not gpipe.trainable and all(o.trainable for o in (flat, inter, grouped))
    assert gpipe.run and flat.run and inter.run and grouped.run
    assert gpipe.run.in_flight_microbatches[0] == layout.num_microbatches and not gpipe.fits
    assert flat.fits and flat.peak_bytes < inter.peak_bytes < gpipe.peak_bytes
    assert inter.peak_bytes == pytest.approx(estimate.memory.total_bytes)
    assert inter.step_s < flat.step_s and inter.run.bubble_share < flat.run.bubble_share / 3
    assert inter.p2p_bytes == pytest.approx(4 * flat.p2p_bytes, rel=0.01)
    assert inter.step_s == pytest.approx(estimate.time.step_s, rel=0.01)
    assert grouped.step_s <= inter.step_s and grouped.layout is not None
    # Without interleaving in the layout, the comparison picks the fastest VP for the interleaved rows.
    workload, layout, cluster = _gpt3_175b(tp=8, vp=1)
    options = {o.schedule: o for o in compare_schedules(workload, evaluate(workload, layout, cluster))}
    assert options["interleaved"].layout is not None and options["interleaved"].layout.vp > 1


def test_zero_bubble_schedules_beat_their_counterparts_at_their_memory() -> None:
    """GPT-3 175B, TP 8 PP 8 VP 4, 128 microbatches (docs/layout-model.md): ZB-H1 halves 1F1B's bubble, ZB
    interleaved cuts interleaved 1F1B's, each holding the activations its counterpart holds."""
    workload, layout, cluster = _gpt3_175b(tp=8, vp=4, batch=256)
    options = {o.schedule: o for o in compare_schedules(workload, evaluate(workload, layout, cluster))}
    flat, h1, inter, zb = (options[s] for s in ("1f1b", "zb-h1", "interleaved", "zb-interleaved"))
    assert h1.run and flat.run and inter.run and zb.run
    # Transformer Engine's layers (the default spec) defer their weight gradients too (delay_wgrad_compute); its
    # bulk weight-gradient overlap (--tp-comm-overlap) excludes that.
    assert h1.trainable and zb.trainable
    overlapped = dataclasses.replace(workload, tp_comm_overlap=True)
    options = {o.schedule: o for o in compare_schedules(overlapped, evaluate(overlapped, layout, cluster))}
    assert not options["zb-h1"].trainable and not options["zb-interleaved"].trainable
    assert h1.run.bubble_share < flat.run.bubble_share / 2 and h1.step_s < flat.step_s * 0.98
    # Rank r keeps r W passes back: every rank holds as many microbatches as 1F1B's rank 0 (the last rank's
    # activations, with the logits', come to 0.4% more), and the most loaded stage's memory is 1F1B's.
    assert h1.run.in_flight_microbatches == (max(flat.run.in_flight_microbatches),) * layout.pp
    assert max(h1.activation_bytes) <= 1.01 * max(flat.activation_bytes)
    assert h1.peak_bytes == pytest.approx(flat.peak_bytes)
    assert zb.run.bubble_share < inter.run.bubble_share / 2 and zb.step_s < inter.step_s
    assert zb.peak_bytes <= inter.peak_bytes
    assert zb.p2p_bytes == inter.p2p_bytes  # W passes send nothing


def test_layout_tool_compares_schedules_in_text_and_json() -> None:
    args = (
        "--gpus 128 --gpu h100-sxm --model gpt3-175b --bf16 --sequence-parallel --use-distributed-optimizer "
        "--recompute-granularity selective --global-batch-size 256 --tp 8 --pp 8 "
        "--num-layers-per-virtual-pipeline-stage 3 --compare-schedules"
    )
    out, err = io.StringIO(), io.StringIO()
    assert layout_tool(args.split(), stdout=out, stderr=err) == ExitCode.OK
    text = out.getvalue()
    assert "GPipe is not a Megatron-Core schedule: shown for comparison only" in text
    rows = [line for line in text.splitlines() if re.match(r" (GPipe|1F1B|interleaved|ZB)", line)]
    assert len(rows) == 6 and " NO " in rows[0] and " yes " in rows[1]
    # The layout as given (VP 4 at the default group, without zero bubble) is marked: here the best group is the
    # default, so both rows are it.
    assert [row.split("  ")[0].endswith(" *") for row in rows] == [False, False, False, True, True, False]
    assert "--enable-zero-bubble runs ZB-H1, and ZB interleaved" in text and "ZB-H1 (--enable-zero-bubble)" in rows[2]
    out = io.StringIO()
    assert layout_tool([*args.split(), "--json"], stdout=out, stderr=io.StringIO()) == ExitCode.OK
    schedules = json.loads(out.getvalue())["schedules"]
    assert [s["schedule"] for s in schedules] == [
        "gpipe", "1f1b", "zb-h1", "interleaved", "interleaved-group", "zb-interleaved"
    ]  # fmt: skip
    assert schedules[0]["trainable"] is False and schedules[0]["fits"] is False
    assert [s["as_given"] for s in schedules] == [False, False, False, True, True, False]
    # Transformer Engine's layers (the default spec) defer their weight gradients: every schedule but GPipe runs.
    assert [s["trainable"] for s in schedules] == [False, True, True, True, True, True]
    assert all(s["possible"] and len(s["activation_bytes"]) == 8 for s in schedules)
    # One pipeline stage: nothing to compare, said once.
    out = io.StringIO()
    flat = "--gpus 8 --gpu h100-sxm --model gpt3-1.3b --bf16 --tp 1 --pp 1 --global-batch-size 64 --compare-schedules"
    assert layout_tool(flat.split(), stdout=out, stderr=io.StringIO()) == ExitCode.OK
    assert "PP = 1, no pipeline" in out.getvalue()


def test_the_schedules_are_judged_on_memory_as_the_layouts_are() -> None:
    """Before: a schedule at 77.6 GiB was "fits: yes" while the main table called the same layout tight (the
    comparison judged against the card's 79.6 GiB, the table against the usable 71.7), and the given group size's
    row was not marked."""
    args = (
        "--gpus 64 --gpu h100-sxm --model gpt3-13b --bf16 --tp 1 --pp 4 --vp 10 --micro-batch-size 1 "
        "--microbatch-group-size-per-virtual-pipeline-stage 6 --compare-schedules --json"
    )
    out = io.StringIO()
    assert layout_tool(args.split(), stdout=out, stderr=io.StringIO()) == ExitCode.OK
    doc = json.loads(out.getvalue())
    (layout,) = doc["layouts"]
    (given,) = [s for s in doc["schedules"] if s["as_given"]]
    assert given["schedule"] == "interleaved-group" and given["microbatch_group_size"] == 6
    assert given["peak_memory_bytes"] == layout["memory"]["total_bytes"]
    assert given["memory_verdict"] == layout["memory_verdict"] == "tight"
    usable = layout["memory"]["usable_bytes"]
    for s in doc["schedules"]:
        assert (s["memory_verdict"] == "fits") == (s["peak_memory_bytes"] <= usable), s["schedule"]


def test_plot_tool_draws_the_schedules_on_one_axis_with_memory(tmp_path) -> None:
    out = io.StringIO()
    stem = tmp_path / "cmp"
    code = plot_tool(
        [*"--pp 4 --vp 2 -m 8 --p2p-time 0.05 --compare-schedules --output".split(), str(stem)],
        stdout=out,
        stderr=io.StringIO(),
    )
    assert code == ExitCode.OK
    text = out.getvalue()
    assert "GPipe is not a Megatron-Core schedule: shown for comparison only" in text
    assert "interleaved 1F1B (VP 2, best N = 8)" in text
    svg = (tmp_path / "cmp.svg").read_text()
    # One memory strip per schedule (the zero-bubble ones too), and GPipe's strip reaches the full height (the
    # largest peak: all 8).
    assert svg.count("peak ") == 6 and "peak 8 microbatches" in svg
    assert f"rgb{MEMORY_COLOR}" in svg
    # The zero-bubble rows: W passes drawn in their own colour, the bubble below their counterparts'.
    bubble = {line[:46].strip(): float(line[46:].split()[0].rstrip("%")) for line in text.splitlines()[2:8]}
    assert bubble["ZB-H1 (--enable-zero-bubble)"] < bubble["1F1B"] / 2
    assert (
        bubble["ZB interleaved (VP 2; --enable-zero-bubble)"]
        < bubble["interleaved 1F1B (VP 2, N = PP, the default)"] / 2
    )
    assert "W chunk 1" in svg and f"rgb{WEIGHT_COLORS[1]}" in svg
    assert (tmp_path / "cmp.png").read_bytes().startswith(b"\x89PNG")


def test_search_takes_the_smallest_group_megatron_core_accepts_when_pp_does_not_divide_the_microbatches() -> None:
    """GPT-3 13B on 48 H100s, batch 1020: TP 1 PP 4 VP 10 with 85 microbatches needs N = 5 (docs/layout-model.md);
    the emitted flags carry it and pretrain_gpt.py's parser rebuilds the same layout from them."""
    out = io.StringIO()
    args = (
        "--gpus 48 --gpu h100-sxm --model gpt3-13b --bf16 --global-batch-size 1020 --recompute-granularity "
        "selective --use-distributed-optimizer --sequence-parallel --top 1 --json"
    )
    assert layout_tool(args.split(), stdout=out, stderr=io.StringIO()) == ExitCode.OK
    best = json.loads(out.getvalue())["layouts"][0]
    assert (best["tp"], best["pp"], best["vp"], best["num_microbatches"]) == (1, 4, 10, 85)
    assert best["microbatch_group_size"] == 5
    assert "--microbatch-group-size-per-virtual-pipeline-stage 5" in best["pretrain_flags"]
    cfg = parse_args([*best["pretrain_flags"].split(), "--mock-data", "--world-size", "48"])
    assert cfg.layout.microbatch_group_size_per_vp_stage == 5 and cfg.layout.vp == 10


def _compared(args: str) -> dict[str, dict]:
    """``tools/layout.py ARGS`` (with --compare-schedules --json): its schedules by name."""
    out = io.StringIO()
    assert layout_tool(args.split(), stdout=out, stderr=io.StringIO()) == ExitCode.OK
    return {s["schedule"]: s for s in json.loads(out.getvalue())["schedules"]}


def test_fewer_microbatches_than_stages_compares_what_megatron_core_runs_and_says_why_not_the_rest() -> None:
    """Before: a LayoutError traceback (a candidate layout with problems was taken for a valid one)."""
    args = (
        "--gpus 8 --gpus-per-node 8 --gpu h100-sxm --num-layers 16 --hidden-size 1024 --num-attention-heads 16 "
        "--seq-length 2048 --vocab-size 50257 --tp 1 --pp 8 --micro-batch-size 1 --global-batch-size 4 "
        "--compare-schedules --json"
    )
    schedules = _compared(args)
    assert set(schedules) == {"gpipe", "1f1b", "zb-h1", "interleaved", "interleaved-group", "zb-interleaved"}
    assert all(schedules[s]["possible"] for s in ("gpipe", "1f1b", "zb-h1"))
    for name in ("interleaved", "interleaved-group", "zb-interleaved"):
        assert not schedules[name]["possible"]
        assert "microbatches per step (4 = global_batch 4" in schedules[name]["reason"]
        assert "must be at least pipeline(8); try global_batch_size 8" in schedules[name]["reason"]


def test_a_zero_bubble_layout_evaluated_alone_is_priced_as_zero_bubble() -> None:
    """Before: --enable-zero-bubble never reached the workload of one evaluated layout, which was priced as 1F1B
    (the same step time with and without the flag) although --compare-schedules and the search priced it."""
    args = "--gpus 64 --gpu h100-sxm --model gpt3-13b --bf16 --tp 8 --pp 8 --global-batch-size 64 --json"

    def layout(flags: str) -> dict:
        out = io.StringIO()
        assert layout_tool([*args.split(), *flags.split()], stdout=out, stderr=io.StringIO()) == ExitCode.OK
        return json.loads(out.getvalue())["layouts"][0]

    one_f_one_b, zb = layout("--transformer-impl local"), layout("--transformer-impl local --enable-zero-bubble")
    assert (one_f_one_b["schedule"], zb["schedule"]) == ("1f1b", "zb-h1")
    assert zb["time"]["bubble_s"] < one_f_one_b["time"]["bubble_s"] / 1.5
    assert zb["step_time_s"] == pytest.approx(
        one_f_one_b["step_time_s"] - one_f_one_b["time"]["bubble_s"] + zb["time"]["bubble_s"], rel=1e-6
    )
    # Transformer Engine's layers defer theirs too, priced alike; as pretrain_gpt.py, not beside --tp-comm-overlap's
    # bulk weight-gradient overlap.
    assert layout("--enable-zero-bubble")["step_time_s"] == pytest.approx(zb["step_time_s"], rel=0.02)
    err = io.StringIO()
    overlapped = [*args.split(), "--enable-zero-bubble", "--sequence-parallel", "--tp-comm-overlap"]
    assert layout_tool(overlapped, stdout=io.StringIO(), stderr=err) == ExitCode.INVALID
    assert "add --disable-tp-comm-bulk-wgrad" in err.getvalue()
    # The text names the zero-bubble schedule's own bubble, as pretrain_gpt.py --dry-run does, beside 1F1B's.
    out = io.StringIO()
    assert layout_tool([*args.split()[:-1], "--enable-zero-bubble"], stdout=out, stderr=io.StringIO()) == 0
    assert "schedule: ZB-H1 (--enable-zero-bubble): pipeline bubble (p-1)/(3*m) = " in out.getvalue()


def test_a_stage_of_embedding_only_is_simulated_pass_by_pass_like_any_other() -> None:
    """Before: the embedding's chunk (no layers: passes of no time) made every waiting rank step forward by
    1e-12 s, and this comparison ran for over 11 minutes; the same placement given as uneven first and last
    stages took 0.3 s."""
    args = (
        "--gpus 8 --gpus-per-node 8 --gpu h100-sxm --num-layers 22 --hidden-size 2048 --num-attention-heads 16 "
        "--seq-length 2048 --vocab-size 50257 --tp 1 --pp 8 --micro-batch-size 1 --global-batch-size 24 "
        "--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split "
        "--num-layers-per-virtual-pipeline-stage 1 --compare-schedules --json"
    )
    schedules = _compared(args)
    assert all(s["possible"] for s in schedules.values())
    zb, interleaved = schedules["zb-interleaved"], schedules["interleaved"]
    # The loss slot's chunk holds only the output layer, which keeps its weight gradient in B (GPTModel builds it
    # outside the layer spec): its W passes are empty, and the bubble shrinks by about a fifth, not by half.
    assert 0.7 < zb["bubble_share_of_step"] / interleaved["bubble_share_of_step"] < 0.85
    assert zb["step_time_s"] < interleaved["step_time_s"]


def test_the_virtual_stages_compared_count_the_embedding_and_loss_slots() -> None:
    """Before: only the divisors of a rank's layer count were tried (VP 2 for ranks of 2 layers and an embedding),
    so with 3 slots a rank the interleaved rows said 'not possible' although VP 3 splits them evenly."""
    args = (
        "--gpus 8 --gpus-per-node 8 --gpu h100-sxm --num-layers 22 --hidden-size 2048 --num-attention-heads 16 "
        "--seq-length 2048 --vocab-size 50257 --tp 1 --pp 8 --micro-batch-size 1 --global-batch-size 24 "
        "--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split --compare-schedules --json"
    )
    schedules = _compared(args)
    assert schedules["interleaved"]["possible"] and schedules["interleaved"]["vp"] == 3


def test_a_layout_string_the_search_places_is_compared_under_every_schedule() -> None:
    """Before: the search places 22 layers on PP 8 with a balanced layout string, and comparing that layout's
    schedules kept the string while trying other VPs (and 1F1B without its VP): an IndexError, or a placement of
    the wrong layers. Each VP now gets the balanced string of its own length, as the search would place it."""
    args = (
        "--gpus 8 --gpus-per-node 8 --gpu h100-sxm --num-layers 22 --hidden-size 2048 --num-attention-heads 16 "
        "--seq-length 2048 --vocab-size 50257 --tp 1 --pp 8 --micro-batch-size 1 --global-batch-size 24 "
        "--pipeline-model-parallel-layout Ettt|tt|ttt|ttt|ttt|ttt|ttt|ttL --compare-schedules --json"
    )
    schedules = _compared(args)
    assert all(s["possible"] for s in schedules.values()), schedules
    interleaved = schedules["interleaved"]
    assert interleaved["vp"] > 1 and schedules["1f1b"]["vp"] == 1
    # A layout whose string and VP disagree is not one (Megatron-LM derives VP from the string).
    _, problems = ParallelLayout.check(
        **ParallelLayout.from_flags(
            world_size=8, num_layers=22, num_attention_heads=16, pipeline_model_parallel_size=8,
            pipeline_model_parallel_layout="Ettt|tt|ttt|ttt|ttt|ttt|ttt|ttL", global_batch_size=24,
        ).as_values() | {"virtual_pipeline_model_parallel_size": 2}
    )  # fmt: skip
    assert any("contradicts virtual(2)" in p for p in problems)

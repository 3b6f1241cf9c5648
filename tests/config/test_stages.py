"""Uneven pipeline stages: our placement arithmetic against Megatron-Core's, and the rules' messages.

``ParallelLayout.stages`` (``megatron_ext/parallel/stages.py``) predicts the
layers, embedding and loss of every (pipeline rank, virtual stage) without
torch; the calculator, ``--dry-run`` and the run's own check read it. Here it
must equal what Megatron-Core 0.16 builds: ``get_num_layers_to_build`` and
``get_transformer_layer_offset`` for first/last sizes and the account-for
flags, ``PipelineParallelLayerLayout`` for layout strings. And it must accept
exactly the splits Megatron-Core accepts, over a grid of shapes.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest

from megatron_ext.parallel.layout import LayoutError, ParallelLayout
from megatron_ext.parallel.stages import StageSplit, balanced_layout, expand_layout, split_problems, stages, suggest

pytestmark = pytest.mark.unit


def layout_of(num_layers: int, pp: int, **flags: Any) -> ParallelLayout:
    values: dict[str, Any] = {"micro_batch_size": 1, "global_batch_size": 4 * pp, **flags}
    return ParallelLayout.from_flags(
        world_size=pp, pipeline_model_parallel_size=pp, num_layers=num_layers, num_attention_heads=2, **values
    )


FLAG_NAMES = {
    "first": "decoder_first_pipeline_num_layers",
    "last": "decoder_last_pipeline_num_layers",
    "account_for_embedding": "account_for_embedding_in_pipeline_split",
    "account_for_loss": "account_for_loss_in_pipeline_split",
    "layout": "pipeline_model_parallel_layout",
}

VALID = [
    # (layers, PP, VP, split flags): the Llama-3 405B shapes, 30 on PP4, odd counts, empty chunks.
    (126, 16, 1, {"first": 7, "last": 7}),
    (126, 16, 2, {"account_for_embedding": True, "account_for_loss": True}),
    (126, 16, 2, {"first": 6, "last": 8}),
    (126, 16, 2, {"layout": "Et*3|(t*4|)*30,t*3L"}),
    (30, 4, 1, {"first": 6}),
    (30, 4, 1, {"last": 9}),
    (8, 3, 1, {"first": 2, "last": 2}),
    (8, 2, 2, {"first": 2}),
    (12, 3, 2, {"first": 2, "last": 6}),
    (16, 4, 2, {"first": 2, "last": 2}),
    (10, 3, 1, {"account_for_embedding": True, "account_for_loss": True}),
    (11, 2, 2, {"account_for_loss": True}),
    (7, 3, 1, {"account_for_embedding": True, "account_for_loss": True}),
    (7, 2, 2, {"layout": "Et|tt|tt|ttL"}),
    (8, 2, 1, {"layout": "E|t*8L"}),
    (6, 2, 3, {"layout": "E|t|(tt|)*2,t|L"}),
]


def mcore_config(num_layers: int, pp: int, vp: int, split: dict[str, Any]) -> Any:
    import torch
    from megatron.core.transformer import TransformerConfig

    return TransformerConfig(
        pipeline_dtype=torch.float32,
        num_layers=num_layers,
        hidden_size=8,
        num_attention_heads=2,
        pipeline_model_parallel_size=pp,
        virtual_pipeline_model_parallel_size=vp if vp > 1 and "layout" not in split else None,
        num_layers_in_first_pipeline_stage=split.get("first"),
        num_layers_in_last_pipeline_stage=split.get("last"),
        account_for_embedding_in_pipeline_split=split.get("account_for_embedding", False),
        account_for_loss_in_pipeline_split=split.get("account_for_loss", False),
        pipeline_model_parallel_layout=split.get("layout"),
    )


def mcore_placement(config: Any, pp: int, vp: int) -> Iterator[tuple[int, int, int, int]]:
    """(rank, virtual stage, layers, first layer) of every chunk, from Megatron-Core's own functions."""
    from megatron.core import parallel_state
    from megatron.core.transformer.enums import LayerType
    from megatron.core.transformer.transformer_block import get_num_layers_to_build
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    layout = config.pipeline_model_parallel_layout
    # The layout object reads the virtual size from parallel_state to decide whether vp_stage counts.
    parallel_state.set_virtual_pipeline_model_parallel_world_size(vp if vp > 1 else None)
    try:
        for r, v in itertools.product(range(pp), range(vp)):
            vp_stage = v if vp > 1 else None
            if layout is not None:
                count = layout.get_num_layers_to_build(LayerType.decoder, vp_stage=vp_stage, pp_rank=r)
                offset = layout.get_layer_offset(LayerType.decoder, vp_stage=vp_stage, pp_rank=r)
            else:
                count = get_num_layers_to_build(config, vp_stage=vp_stage, pp_rank=r)
                offset = get_transformer_layer_offset(config, vp_stage=vp_stage, pp_rank=r)
            yield r, v, count, offset
    finally:
        parallel_state.set_virtual_pipeline_model_parallel_world_size(None)


@pytest.mark.parametrize(("num_layers", "pp", "vp", "split"), VALID, ids=lambda x: str(x))
def test_every_chunk_holds_what_megatron_core_builds(num_layers: int, pp: int, vp: int, split: dict[str, Any]) -> None:
    flags = {FLAG_NAMES[k]: v for k, v in split.items()}
    if "layout" not in split and vp > 1:
        flags["virtual_pipeline_model_parallel_size"] = vp
    layout = layout_of(num_layers, pp, **flags)
    assert layout.vp == vp
    config = mcore_config(num_layers, pp, vp, split)
    for r, v, count, offset in mcore_placement(config, pp, vp):
        chunk = layout.stages[r][v]
        assert (chunk.num_layers, chunk.first_layer) == (count, offset), (r, v, chunk, count, offset)
    # Every layer exactly once.
    held = sorted(i for rank in layout.stages for chunk in rank for i in chunk.layers)
    assert held == list(range(num_layers))


def megatron_core_accepts(num_layers: int, pp: int, vp: int, split: dict[str, Any]) -> bool:
    """Megatron-Core builds every chunk of the split (its config checks and placement asserts pass)."""
    try:
        config = mcore_config(num_layers, pp, vp, split)
        counts = [count for _, _, count, _ in mcore_placement(config, pp, vp)]
    except (AssertionError, ValueError, ZeroDivisionError):  # ZeroDivisionError: see test below
        return False
    return sum(counts) == num_layers and min(counts) >= 0


def grid() -> Iterator[tuple[int, int, int, dict[str, Any]]]:
    for num_layers, pp, vp in itertools.product(range(5, 13), [2, 3, 4], [1, 2]):
        for first, last in itertools.product([None, 1, 2, 3, 4], [None, 1, 2, 3, 5]):
            if first is not None or last is not None:
                yield num_layers, pp, vp, {"first": first, "last": last}
        for e, lo in [(True, False), (False, True), (True, True)]:
            yield num_layers, pp, vp, {"account_for_embedding": e, "account_for_loss": lo}


def test_we_refuse_exactly_the_splits_megatron_core_refuses() -> None:
    accepted = refused = 0
    disagreements = []
    for num_layers, pp, vp, split in grid():
        flags = {FLAG_NAMES[k]: v for k, v in split.items()}
        ours = split_problems(StageSplit.of(num_layers=num_layers, pp=pp, vp=vp, flags=flags))
        theirs = megatron_core_accepts(num_layers, pp, vp, {k: v for k, v in split.items() if v is not None})
        accepted += theirs
        refused += not theirs
        if (not ours) != theirs:
            disagreements.append(f"{num_layers} layers PP{pp} VP{vp} {split}: ours {ours or 'accepted'}")
    assert not disagreements, "\n".join(disagreements[:20])
    assert accepted >= 50 and refused >= 50, (accepted, refused)


def test_both_end_sizes_on_two_interleaved_ranks_are_refused_as_megatron_core_crashes() -> None:
    """Megatron-Core 0.16's layer offset divides by the middle ranks, of which PP2 has none (interleaved)."""
    assert not megatron_core_accepts(8, 2, 2, {"first": 2, "last": 6})
    with pytest.raises(LayoutError, match="give --decoder-first-pipeline-num-layers 2 alone"):
        layout_of(8, 2, virtual_pipeline_model_parallel_size=2, decoder_first_pipeline_num_layers=2,
                  decoder_last_pipeline_num_layers=6)  # fmt: skip
    assert [c.num_layers for c in layout_of(8, 2, virtual_pipeline_model_parallel_size=2,
                                            decoder_first_pipeline_num_layers=2).stages[1]] == [3, 3]  # fmt: skip


# ------------------------------------------------------------------ layout strings
def test_layout_strings_expand_as_megatron_cores() -> None:
    from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout

    for text in ["Et*3|(t*4|)*30,t*3L", "E|(tt|)*2,(t|)*4,L", "Ettt|(tt|)*29,tL", "(Et|)*1,t*2L"]:
        theirs = PipelineParallelLayerLayout.parse_str_to_list(text)
        ours = expand_layout(text)
        letters = {"embedding": "E", "decoder": "t", "loss": "L"}
        assert [[letters[x.name] for x in stage] for stage in theirs] == [list(stage) for stage in ours]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("Et|tmtL", "'m' at position 4 of the expanded layout m (multi-token prediction) is not supported"),
        ("Et|tx|tL", "'x' at position 4 of the expanded layout is not a layer"),
        ("Et|tt|tL", "has 3 stages, not a multiple of pipeline(2)"),
        ("Ett|ttL", "places 4 transformer layers but num_layers=5"),
        ("tEt|tttL", "the embedding E must appear once, at the start of the first stage"),
        ("Ettt|tLt", "the loss L must appear once, at the end of the last stage"),
    ],
)
def test_broken_layout_strings_are_named(text: str, message: str) -> None:
    with pytest.raises(LayoutError) as info:
        layout_of(5, 2, pipeline_model_parallel_layout=text)
    assert any(message in p for p in info.value.problems), info.value.problems


def test_suggested_fixes_are_valid_and_named_in_the_refusal() -> None:
    """126 layers on PP16 × VP2 (Llama 3 405B): refused evenly, with uneven splits that work."""
    with pytest.raises(LayoutError) as info:
        layout_of(126, 16, virtual_pipeline_model_parallel_size=2)
    (problem,) = info.value.problems
    assert "num_layers=126 is not divisible by pipeline(16)" in problem
    options = suggest(126, 16, 2)
    assert options[0] == "--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split"
    assert any(o.startswith("--decoder-first-pipeline-num-layers") for o in options)
    assert any(o.startswith("--pipeline-model-parallel-layout") for o in options)
    for option in options:
        assert option in problem
    # Each suggestion, given back, is accepted.
    for n, pp, vp in [(126, 16, 2), (126, 16, 1), (30, 4, 1), (30, 4, 2), (7, 2, 2), (13, 4, 1)]:
        for option in suggest(n, pp, vp):
            words = option.replace('"', "").split()
            flags: dict[str, Any] = {}
            for i, word in enumerate(words):
                if word.startswith("--"):
                    name = word[2:].replace("-", "_").replace("decoder_first_pipeline", "decoder_first_pipeline")
                    value = words[i + 1] if i + 1 < len(words) and not words[i + 1].startswith("--") else True
                    flags[name] = int(value) if isinstance(value, str) and value.isdigit() else value
            if vp > 1 and "pipeline_model_parallel_layout" not in flags:
                flags["virtual_pipeline_model_parallel_size"] = vp
            assert layout_of(n, pp, **flags).vp == vp, option


def test_balanced_layout_spreads_embedding_and_loss_as_layers() -> None:
    text = balanced_layout(126, 16, 2)
    assert text == "Et*3|(t*4|)*30,t*3L"
    split = StageSplit(num_layers=126, pp=16, vp=2, layout=text)
    chunks = [c for rank in stages(split) for c in rank]
    assert sorted({c.num_layers + c.embedding + c.loss for c in chunks}) == [4]


def test_one_way_of_placing_layers_at_a_time() -> None:
    with pytest.raises(LayoutError, match="give one of them"):
        layout_of(8, 2, decoder_first_pipeline_num_layers=3, account_for_loss_in_pipeline_split=True)
    with pytest.raises(LayoutError, match="give the layout string alone"):
        layout_of(8, 2, decoder_first_pipeline_num_layers=3, pipeline_model_parallel_layout="Ettt|t*5L")
    with pytest.raises(LayoutError, match="each set the virtual pipeline size"):
        layout_of(8, 2, virtual_pipeline_model_parallel_size=2, pipeline_model_parallel_layout="Et|ttt|t|tttL")
    with pytest.raises(LayoutError, match="give --num-virtual-stages-per-pipeline-rank instead"):
        layout_of(8, 2, decoder_first_pipeline_num_layers=2, num_layers_per_virtual_pipeline_stage=1)
    with pytest.raises(LayoutError, match="need pipeline parallelism: use PP >= 2"):
        layout_of(8, 1, decoder_first_pipeline_num_layers=8)


def test_layers_per_virtual_stage_counts_the_accounted_embedding_and_loss() -> None:
    """Megatron-LM: with the account-for flags, --num-layers-per-virtual-pipeline-stage counts them as layers."""
    layout = layout_of(
        14,
        4,
        account_for_embedding_in_pipeline_split=True,
        account_for_loss_in_pipeline_split=True,
        num_layers_per_virtual_pipeline_stage=2,
    )
    assert layout.vp == 2
    assert [c.num_layers for c in layout.stages[0]] == [1, 2]


def test_microbatch_group_size_rules() -> None:
    ok = layout_of(8, 2, virtual_pipeline_model_parallel_size=2, microbatch_group_size_per_vp_stage=4)
    assert ok.microbatch_group_size == 4
    with pytest.raises(LayoutError, match="must lie between pipeline"):
        layout_of(8, 2, virtual_pipeline_model_parallel_size=2, microbatch_group_size_per_vp_stage=9)
    with pytest.raises(LayoutError, match="leave a last group of 1 after groups of 3"):
        layout_of(
            8, 2, virtual_pipeline_model_parallel_size=2, microbatch_group_size_per_vp_stage=3, global_batch_size=7
        )
    with pytest.raises(LayoutError, match="only applies to the interleaved schedule"):
        layout_of(8, 2, microbatch_group_size_per_vp_stage=2)


def test_the_stage_table_of_the_dry_run() -> None:
    layout = layout_of(126, 16, decoder_first_pipeline_num_layers=6, decoder_last_pipeline_num_layers=8,
                       virtual_pipeline_model_parallel_size=2)  # fmt: skip
    table = "\n".join(layout.stage_table())
    assert "rank 0      E+3t | 3t  (6 layers)" in table
    assert "ranks 1-14  4t | 4t    (8 layers each)" in table
    assert "rank 15     4t | 4t+L  (8 layers)" in table

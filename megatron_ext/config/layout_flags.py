"""Megatron-LM's layout flags and ``ParallelLayout``, both ways: the layout of the parsed flags
(``build_layout``) and the flags of a layout (``layout_args``), each field named once in each direction."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence

from megatron_ext.config.arguments import BatchArgs, ConfigError, ModelArgs, ParallelArgs
from megatron_ext.config.flags import add_options, flag_of, to_argv
from megatron_ext.parallel.layout import ParallelLayout

LAYOUT_FLAGS = frozenset(f.name for f in dataclasses.fields(ParallelArgs) if f.metadata["layout"])
"""The ParallelArgs that ``build_layout`` maps into a ``ParallelLayout`` (marked ``layout=True`` in the flag
table) and ``layout_args`` maps back; ``replace_layout_flags`` swaps exactly these."""


def build_layout(
    model: ModelArgs, parallel: ParallelArgs, batch: BatchArgs, *, world_size: int, gpus_per_node: int | None = None
) -> ParallelLayout:
    """The layout of these flags (LayoutError if invalid): pretrain_gpt.py, --dry-run and the calculator build it here."""
    return ParallelLayout.from_flags(
        world_size=world_size,
        tensor_model_parallel_size=parallel.tensor_model_parallel_size,
        pipeline_model_parallel_size=parallel.pipeline_model_parallel_size,
        context_parallel_size=parallel.context_parallel_size,
        virtual_pipeline_model_parallel_size=parallel.virtual_pipeline_model_parallel_size,
        num_layers_per_virtual_pipeline_stage=parallel.num_layers_per_virtual_pipeline_stage,
        pipeline_model_parallel_layout=parallel.pipeline_model_parallel_layout,
        decoder_first_pipeline_num_layers=parallel.decoder_first_pipeline_num_layers,
        decoder_last_pipeline_num_layers=parallel.decoder_last_pipeline_num_layers,
        account_for_embedding_in_pipeline_split=parallel.account_for_embedding_in_pipeline_split,
        account_for_loss_in_pipeline_split=parallel.account_for_loss_in_pipeline_split,
        microbatch_group_size_per_vp_stage=parallel.microbatch_group_size_per_vp_stage,
        sequence_parallel=parallel.sequence_parallel,
        use_distributed_optimizer=parallel.use_distributed_optimizer,
        micro_batch_size=batch.micro_batch_size,
        global_batch_size=batch.global_batch_size,
        num_layers=model.num_layers,
        num_attention_heads=model.num_attention_heads,
        num_query_groups=model.effective_num_query_groups,
        ffn_hidden_size=model.effective_ffn_hidden_size,
        seq_length=model.seq_length,
        gpus_per_node=gpus_per_node,
    )


def layout_args(
    layout: ParallelLayout, *, overlap_grad_reduce: bool = False, overlap_param_gather: bool = False
) -> ParallelArgs:
    """The ParallelArgs that give ``layout`` (and the overlap switches, which are not layout).

    VP is spelled as layers per virtual stage when the split is even (every Megatron-LM version knows that
    flag), as virtual stages per rank when it is not, and not at all with a layout string (which sets it).
    """
    per_chunk = layout.layers_per_virtual_stage if layout.interleaved and not layout.uneven else None
    spelled_otherwise = per_chunk is not None or layout.pipeline_model_parallel_layout is not None
    return ParallelArgs(
        tensor_model_parallel_size=layout.tensor_model_parallel_size,
        pipeline_model_parallel_size=layout.pipeline_model_parallel_size,
        context_parallel_size=layout.context_parallel_size,
        virtual_pipeline_model_parallel_size=None if spelled_otherwise else layout.virtual_pipeline_model_parallel_size,
        num_layers_per_virtual_pipeline_stage=per_chunk,
        pipeline_model_parallel_layout=layout.pipeline_model_parallel_layout,
        decoder_first_pipeline_num_layers=layout.decoder_first_pipeline_num_layers,
        decoder_last_pipeline_num_layers=layout.decoder_last_pipeline_num_layers,
        account_for_embedding_in_pipeline_split=layout.account_for_embedding_in_pipeline_split,
        account_for_loss_in_pipeline_split=layout.account_for_loss_in_pipeline_split,
        microbatch_group_size_per_vp_stage=layout.microbatch_group_size_per_vp_stage,
        sequence_parallel=layout.sequence_parallel,
        use_distributed_optimizer=layout.use_distributed_optimizer,
        overlap_grad_reduce=overlap_grad_reduce,
        overlap_param_gather=overlap_param_gather,
    )


def replace_layout_flags(argv: Sequence[str], layout: ParallelLayout) -> list[str]:
    """``argv`` (a pretrain_gpt.py command line) with its layout flags and micro-batch size replaced by those of
    ``layout``, every other argument kept in order: how a launcher moves a run to another layout."""
    fields = [f for f in dataclasses.fields(ParallelArgs) if f.name in LAYOUT_FLAGS]
    micro = next(f for f in dataclasses.fields(BatchArgs) if f.name == "micro_batch_size")
    strip = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    group = strip.add_argument_group("layout")
    add_options(group, ParallelArgs, fields)
    add_options(group, BatchArgs, [micro])
    _, kept = strip.parse_known_args(list(argv))
    new = to_argv(
        layout_args(layout),
        only=LAYOUT_FLAGS,
        always=("tensor_model_parallel_size", "pipeline_model_parallel_size"),
    )
    return [*kept, *new, flag_of(micro), str(layout.micro_batch_size)]


def model_layout_facts(model: ModelArgs) -> dict[str, int]:
    """What the layout rules need to know of the model (layers, heads, groups, MLP width, sequence)."""
    return {
        "num_layers": model.num_layers,
        "num_attention_heads": model.num_attention_heads,
        "num_query_groups": model.effective_num_query_groups,
        "ffn_hidden_size": model.effective_ffn_hidden_size,
        "seq_length": model.seq_length,
    }


def context_parallel_refusal(cp: int, why: str) -> ConfigError:
    """Context parallelism refused where Megatron-Core's attention cannot split the sequence (its own attention
    asserts CP 1): before launch from the flags, at start-up from the device and the installed packages."""
    return ConfigError(
        f"--context-parallel-size {cp} needs Transformer Engine's attention, {why}; use CP 1 (split long sequences "
        "over TP with --sequence-parallel), or run on GPUs with Transformer Engine"
    )


def context_parallel_problem(model: ModelArgs, cp: int) -> ConfigError | None:
    """Why the model's flags cannot split sequences over ``cp`` ranks, or None: Megatron-Core's own attention (the
    local spec) asserts CP 1, and Transformer Engine's unfused backend does not split sequences (Transformer
    Engine disables it under context parallelism, and ``--attention-backend unfused`` disables the others).
    ``pretrain_gpt.py`` refuses these from the flags; the layout search does not offer them."""
    if cp == 1:
        return None
    if (flag := model.local_spec_flag) is not None:
        return context_parallel_refusal(cp, f"which {flag} does not build")
    if model.attention_backend == "unfused":
        return ConfigError(
            f"--context-parallel-size {cp} needs Transformer Engine's flash or fused attention: its unfused backend "
            "does not split sequences (Transformer Engine turns it off under context parallelism, and "
            "--attention-backend unfused turns off the others); give --attention-backend auto, flash or fused, or "
            "use CP 1"
        )
    return None


def megatron_lm_adjustments(parallel: ParallelArgs) -> tuple[ParallelArgs, tuple[str, ...]]:
    """The flags Megatron-LM's ``validate_args`` changes instead of refusing, changed the same way, each with why
    (``pretrain_gpt.py`` and the calculator)."""
    notes = []
    if parallel.sequence_parallel and parallel.tensor_model_parallel_size == 1:
        # Megatron-LM's Llama examples rely on it: --sequence-parallel is given whatever the TP.
        parallel = dataclasses.replace(parallel, sequence_parallel=False)
        notes.append("--sequence-parallel turned off: it needs tensor parallelism, and TP is 1 (as Megatron-LM)")
    return parallel, tuple(notes)


def gloo_problem(parallel: ParallelArgs) -> str | None:
    """Why ``parallel`` cannot run over gloo (the CPU processes' backend), or None."""
    if parallel.pipeline_model_parallel_comm_backend:
        return (
            f"--pipeline-model-parallel-comm-backend {parallel.pipeline_model_parallel_comm_backend} is a GPU "
            "backend; a CPU rehearsal's pipeline groups are gloo's: drop it on CPU"
        )
    if parallel.ddp_average_in_collective:
        return (
            "--ddp-average-in-collective reduces the gradients with an averaging collective, which gloo (the CPU "
            "backend) does not have; drop it on CPU (summing then scaling, the default, gives the same gradients)"
        )
    return None


def pipeline_p2p_problems(parallel: ParallelArgs, layout: ParallelLayout) -> None:
    """Megatron-LM's rules for the pipeline's p2p switches, which need the interleaved schedule (ConfigError)."""
    if parallel.overlap_p2p_communication_warmup_flush and not layout.interleaved:
        raise ConfigError(
            "--overlap-p2p-communication-warmup-flush applies to the interleaved schedule only: give virtual "
            "stages (--num-virtual-stages-per-pipeline-rank) or drop it"
        )
    if parallel.no_overlap_p2p_communication and layout.interleaved and layout.pp <= 2:
        raise ConfigError(
            f"--no-overlap-p2p-communication with the interleaved schedule needs PP > 2 (PP is {layout.pp}): its "
            "batched transfers would pair several sends and receives between the same two ranks (Megatron-LM "
            "refuses it too); drop the flag or use PP 3 or more"
        )


def wgrad_deferral_problems(parallel: ParallelArgs, layout: ParallelLayout) -> None:
    """``--defer-embedding-wgrad-compute`` needs a pipeline, whose drain the deferred GEMMs fill: Megatron-Core's
    ``ModelParallelConfig`` refuses it without one (ConfigError). What it needs beside the layout is checked with
    the other groups (``training_config.cross_group_problems``)."""
    if parallel.defer_embedding_wgrad_compute and layout.pp == 1:
        raise ConfigError(
            "--defer-embedding-wgrad-compute moves the output layer's weight-gradient GEMMs into the pipeline's "
            "drain, and there is no pipeline: give --pipeline-model-parallel-size 2 or more, or drop the flag "
            "(Megatron-Core refuses it too)"
        )


def zero_bubble_problems(parallel: ParallelArgs, layout: ParallelLayout, *, transformer_engine: bool) -> None:
    """What ``--enable-zero-bubble`` (ZB-H1; with virtual stages, ZB interleaved) needs, each with the fix
    (ConfigError)."""
    if not parallel.enable_zero_bubble:
        return
    problems = []
    if layout.pp == 1:
        problems.append("a pipeline to fill: give --pipeline-model-parallel-size 2 or more, or drop the flag")
    if transformer_engine and parallel.tp_comm_overlap and not parallel.no_tp_comm_bulk_wgrad:
        # Transformer Engine's delay_wgrad_compute, which defers its layers' weight gradients, excludes it.
        problems.append(
            "the weight-gradient GEMM out of --tp-comm-overlap's bulk overlap (Transformer Engine defers that GEMM "
            "to the W pass): add --disable-tp-comm-bulk-wgrad"
        )
    if problems:
        raise ConfigError("--enable-zero-bubble needs " + "; ".join(problems))

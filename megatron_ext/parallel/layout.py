"""The parallel layout: one frozen object, validated in one place.

``ParallelLayout`` holds the factors of a run (TP, PP, VP, derived DP, micro
and global batch) and checks every rule Megatron-Core imposes *before* any
process group exists. The training script, ``--dry-run``, the layout
calculator and the recipes all build this object, so they agree on the rules
and on the messages.

The process grid is Megatron-Core's default order ``tp-cp-ep-dp-pp``: ranks
that differ only in their TP index are adjacent (so a TP group sits inside a
node), and pipeline stages are the slowest-varying factor (so stages span
nodes).
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, fields
from functools import cached_property
from typing import Any

from megatron_ext.parallel.factors import divisors, nearest_multiples
from megatron_ext.parallel.pipeline import bubble_fraction, valid_group_sizes
from megatron_ext.parallel.stages import Stage, StageSplit, expand_layout, rank_rows, split_problems
from megatron_ext.parallel.stages import stages as stages_of


class LayoutError(ValueError):
    """One or more layout rules are broken; ``problems`` lists each message."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("invalid parallel layout:\n" + "\n".join(f"  - {p}" for p in problems))


@dataclass(frozen=True, kw_only=True)
class ParallelLayout:
    """A TP × PP (× VP) × DP layout with its batch split, validated on creation."""

    world_size: int
    """Total number of processes (GPUs)."""
    tensor_model_parallel_size: int = 1
    """TP: ranks that split every layer's matrices (keep within a node)."""
    pipeline_model_parallel_size: int = 1
    """PP: pipeline stages, each holding a contiguous share of the layers."""
    context_parallel_size: int = 1
    """CP: ranks that split every sequence, exchanging keys and values in a ring inside attention."""
    virtual_pipeline_model_parallel_size: int | None = None
    """VP: model chunks per pipeline rank (interleaved 1F1B when > 1)."""
    decoder_first_pipeline_num_layers: int | None = None
    """Transformer layers on the first pipeline rank (None: an even share); see ``stages.py``."""
    decoder_last_pipeline_num_layers: int | None = None
    """Transformer layers on the last pipeline rank (None: an even share)."""
    account_for_embedding_in_pipeline_split: bool = False
    """Count the embedding as one layer when splitting (its chunk builds one layer fewer)."""
    account_for_loss_in_pipeline_split: bool = False
    """Count the output layer and loss as one layer when splitting."""
    pipeline_model_parallel_layout: str | None = None
    """Megatron-Core's layout string placing E, t and L on every virtual stage (sets VP)."""
    microbatch_group_size_per_vp_stage: int | None = None
    """Interleaved 1F1B: microbatches run through one chunk before the next (None: PP, depth-first)."""
    sequence_parallel: bool = False
    """Split LayerNorm/dropout activations along the sequence in TP regions."""
    use_distributed_optimizer: bool = False
    """Shard optimizer state (and master weights) over the data-parallel ranks."""
    micro_batch_size: int = 1
    """Sequences per microbatch on one data-parallel rank."""
    global_batch_size: int
    """Sequences per optimizer step over all data-parallel ranks."""
    num_layers: int
    """Transformer layers of the model."""
    num_attention_heads: int
    """Attention heads of the model."""
    num_query_groups: int | None = None
    """Key/value groups (grouped-query attention); None means one per head."""
    ffn_hidden_size: int | None = None
    """MLP hidden size (checked against TP when known: both MLP linears split it)."""
    seq_length: int | None = None
    """Sequence length (checked against TP when sequence parallel is on)."""
    gpus_per_node: int | None = None
    """When known: TP must fit within one node."""

    @classmethod
    def from_flags(
        cls,
        *,
        world_size: int,
        num_layers: int,
        num_attention_heads: int,
        global_batch_size: int | None,
        micro_batch_size: int = 1,
        tensor_model_parallel_size: int = 1,
        pipeline_model_parallel_size: int = 1,
        context_parallel_size: int = 1,
        virtual_pipeline_model_parallel_size: int | None = None,
        num_layers_per_virtual_pipeline_stage: int | None = None,
        pipeline_model_parallel_layout: str | None = None,
        decoder_first_pipeline_num_layers: int | None = None,
        decoder_last_pipeline_num_layers: int | None = None,
        account_for_embedding_in_pipeline_split: bool = False,
        account_for_loss_in_pipeline_split: bool = False,
        microbatch_group_size_per_vp_stage: int | None = None,
        sequence_parallel: bool = False,
        use_distributed_optimizer: bool = False,
        num_query_groups: int | None = None,
        ffn_hidden_size: int | None = None,
        seq_length: int | None = None,
        gpus_per_node: int | None = None,
    ) -> ParallelLayout:
        """Build from Megatron-LM's flags, each by its field name (LayoutError if a rule is broken).

        Resolves the three ways to give VP (``virtual_stages``) and a missing
        global batch into micro-batch × DP, with Megatron-LM's rules
        (Megatron-LM's ``arguments.py``); everything else is the field of the same name.
        """
        pp = pipeline_model_parallel_size
        vp = virtual_stages(
            num_layers=num_layers,
            pp=pp,
            per_rank=virtual_pipeline_model_parallel_size,
            layers_per_chunk=num_layers_per_virtual_pipeline_stage,
            layout=pipeline_model_parallel_layout,
            uneven=decoder_first_pipeline_num_layers is not None or decoder_last_pipeline_num_layers is not None,
            extra_slots=int(account_for_embedding_in_pipeline_split) + int(account_for_loss_in_pipeline_split),
        )
        if global_batch_size is None:
            dp = max(world_size // (tensor_model_parallel_size * context_parallel_size * pp), 1)
            global_batch_size = micro_batch_size * dp
        return cls(
            world_size=world_size,
            tensor_model_parallel_size=tensor_model_parallel_size,
            pipeline_model_parallel_size=pp,
            context_parallel_size=context_parallel_size,
            virtual_pipeline_model_parallel_size=vp,
            decoder_first_pipeline_num_layers=decoder_first_pipeline_num_layers,
            decoder_last_pipeline_num_layers=decoder_last_pipeline_num_layers,
            account_for_embedding_in_pipeline_split=account_for_embedding_in_pipeline_split,
            account_for_loss_in_pipeline_split=account_for_loss_in_pipeline_split,
            pipeline_model_parallel_layout=pipeline_model_parallel_layout,
            microbatch_group_size_per_vp_stage=microbatch_group_size_per_vp_stage,
            sequence_parallel=sequence_parallel,
            use_distributed_optimizer=use_distributed_optimizer,
            micro_batch_size=micro_batch_size,
            global_batch_size=global_batch_size,
            num_layers=num_layers,
            num_attention_heads=num_attention_heads,
            num_query_groups=num_query_groups,
            ffn_hidden_size=ffn_hidden_size,
            seq_length=seq_length,
            gpus_per_node=gpus_per_node,
        )

    @classmethod
    def check(cls, **values: Any) -> tuple[ParallelLayout, list[str]]:
        """Build without raising: ``(layout, problems)``, valid exactly when ``problems`` is empty.

        The same rules and messages as the constructor, for callers that try
        many candidates (the layout calculator's search) and would otherwise pay
        for an exception per invalid one. Use the returned layout only when
        ``problems`` is empty: it is then equal to ``ParallelLayout(**values)``.
        """
        layout = object.__new__(cls)
        for f in fields(cls):
            value = values.pop(f.name, f.default)
            if value is MISSING:
                raise TypeError(f"ParallelLayout.check() needs {f.name}")
            object.__setattr__(layout, f.name, value)
        if values:
            raise TypeError(f"ParallelLayout has no field(s) {sorted(values)}")
        return layout, layout.problems()

    @classmethod
    def check_grouped(cls, **values: Any) -> tuple[ParallelLayout, list[str]]:
        """``check``, and where the interleaved schedule's default microbatch group (PP) is refused because PP
        does not divide the microbatches, the smallest group size Megatron-Core accepts instead."""
        layout, problems = cls.check(**values)
        if not problems or layout.vp == 1 or values.get("microbatch_group_size_per_vp_stage") is not None:
            return layout, problems
        per_step = layout.micro_batch_size * layout.dp
        if not per_step or layout.global_batch_size % per_step:
            return layout, problems
        groups = valid_group_sizes(pp=layout.pp, num_microbatches=layout.global_batch_size // per_step)
        if not groups or groups[0] == layout.pp:
            return layout, problems
        grouped, grouped_problems = cls.check(**values | {"microbatch_group_size_per_vp_stage": groups[0]})
        return (grouped, []) if not grouped_problems else (layout, problems)

    def as_values(self) -> dict[str, Any]:
        """The constructor's keyword arguments that rebuild this layout (change some, then ``check``)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    # ----------------------------------------------------------------- derived
    @property
    def tp(self) -> int:
        return self.tensor_model_parallel_size

    @property
    def pp(self) -> int:
        return self.pipeline_model_parallel_size

    @property
    def cp(self) -> int:
        return self.context_parallel_size

    @property
    def model_parallel_size(self) -> int:
        """Ranks that hold one replica of the model and its batch between them: TP × CP × PP."""
        return self.tp * self.cp * self.pp

    @property
    def vp(self) -> int:
        """Virtual stages per pipeline rank (1 when not interleaved)."""
        return self.virtual_pipeline_model_parallel_size or 1

    @property
    def interleaved(self) -> bool:
        return self.vp > 1

    @property
    def data_parallel_size(self) -> int:
        return self.world_size // self.model_parallel_size

    @property
    def dp(self) -> int:
        return self.data_parallel_size

    @property
    def num_microbatches(self) -> int:
        """Microbatches per step on each pipeline (gradient-accumulation steps)."""
        return self.global_batch_size // (self.micro_batch_size * self.dp)

    @property
    def bubble_fraction(self) -> float:
        """Pipeline bubble relative to ideal compute, (p − 1)/(v·m): ``parallel.pipeline.bubble_fraction``."""
        return bubble_fraction(pp=self.pp, vp=self.vp, num_microbatches=self.num_microbatches)

    @property
    def microbatch_group_size(self) -> int:
        """Microbatches per chunk before the next (Megatron-Core's default: PP)."""
        return self.microbatch_group_size_per_vp_stage or self.pp

    @cached_property
    def split(self) -> StageSplit:
        """The flags that place the layers."""
        return StageSplit(
            num_layers=self.num_layers,
            pp=self.pp,
            vp=self.vp,
            first=self.decoder_first_pipeline_num_layers,
            last=self.decoder_last_pipeline_num_layers,
            account_for_embedding=self.account_for_embedding_in_pipeline_split,
            account_for_loss=self.account_for_loss_in_pipeline_split,
            layout=self.pipeline_model_parallel_layout,
        )

    @property
    def uneven(self) -> bool:
        """One of the uneven-split flags places the layers."""
        return self.split.mode != "uniform"

    @cached_property
    def stages(self) -> tuple[tuple[Stage, ...], ...]:
        """Every model chunk, ``[pipeline_rank][virtual_stage]``: layers, embedding, loss (``stages.py``)."""
        return stages_of(self.split)

    def stage_layers(self, pipeline_rank: int, virtual_rank: int = 0) -> range:
        """Global layer indices held by one (pipeline rank, model chunk)."""
        return self.stages[pipeline_rank][virtual_rank].layers

    @cached_property
    def layers_per_rank(self) -> tuple[int, ...]:
        """Transformer layers on every pipeline rank (all of its chunks)."""
        return tuple(sum(chunk.num_layers for chunk in rank) for rank in self.stages)

    def rank_layers(self, pipeline_rank: int) -> int:
        """Transformer layers on one pipeline rank (all of its chunks)."""
        return self.layers_per_rank[pipeline_rank]

    @property
    def layers_per_pipeline_stage(self) -> int:
        """The most transformer layers on one pipeline rank (every rank's count when the split is even)."""
        return max(self.layers_per_rank)

    @property
    def layers_per_virtual_stage(self) -> int:
        """The most transformer layers in one model chunk (every chunk's count when the split is even)."""
        return max(chunk.num_layers for rank in self.stages for chunk in rank)

    # -------------------------------------------------------------- validation
    def __post_init__(self) -> None:
        problems = self.problems()
        if problems:
            raise LayoutError(problems)

    def problems(self) -> list[str]:
        """Every broken rule, each naming its factors and a value that would fix it."""
        p: list[str] = []
        tp, pp, vp = self.tp, self.pp, self.vp
        for name, value in (
            ("world_size", self.world_size),
            ("tensor_model_parallel_size", tp),
            ("pipeline_model_parallel_size", pp),
            ("context_parallel_size", self.cp),
            ("virtual_pipeline_model_parallel_size", vp),
            ("micro_batch_size", self.micro_batch_size),
            ("global_batch_size", self.global_batch_size),
            ("num_layers", self.num_layers),
            ("num_attention_heads", self.num_attention_heads),
        ):
            if value < 1:
                p.append(f"{name}={value} must be at least 1")
        if p:
            return p

        cp, mp = self.cp, self.model_parallel_size
        if self.world_size % mp:
            factors = f"tensor({tp}) × context({cp}) × pipeline({pp})" if cp > 1 else f"tensor({tp}) × pipeline({pp})"
            p.append(
                f"world_size={self.world_size} is not divisible by {factors} "
                f"= {mp}; use {nearest_multiples(self.world_size, mp)} processes, "
                f"or {'TP × CP × PP' if cp > 1 else 'TP × PP'} in {sorted({d for d in divisors(self.world_size)})}"
            )
        if cp > 1 and self.seq_length is not None:
            # Megatron-Core splits each sequence into 2·CP chunks, two per rank, to balance causal attention.
            if self.seq_length % (2 * cp):
                p.append(
                    f"seq_length={self.seq_length} is not divisible by 2 × context({cp}) = {2 * cp} (each rank "
                    f"holds two of 2·CP chunks); try {nearest_multiples(self.seq_length, 2 * cp)}"
                )
            elif self.sequence_parallel and (self.seq_length // cp) % tp:
                p.append(
                    f"seq_length={self.seq_length} / context({cp}) = {self.seq_length // cp} tokens per rank is not "
                    f"divisible by tensor({tp}) with sequence parallel; try seq_length "
                    f"{nearest_multiples(self.seq_length, 2 * cp * tp)}"
                )
        if self.gpus_per_node is not None and tp > self.gpus_per_node:
            p.append(
                f"tensor_model_parallel_size={tp} exceeds gpus_per_node={self.gpus_per_node}; "
                f"tensor parallelism must stay within a node: use TP <= {self.gpus_per_node}"
            )
        if vp > 1 and pp == 1 and self.pipeline_model_parallel_layout is not None:
            p.append(
                f"pipeline_model_parallel_layout has {vp} stages on pipeline(1): give the pipeline size it was "
                f"written for, --pipeline-model-parallel-size N with N dividing {vp} (its stages are N ranks × "
                f"{vp}/N virtual stages)"
            )
        elif vp > 1 and pp == 1:
            p.append(
                f"virtual_pipeline_model_parallel_size={vp} needs pipeline parallelism: "
                "interleaving splits the layers of each pipeline rank; use PP >= 2 or VP=1"
            )
        else:
            p += split_problems(self.split)
        heads = self.num_attention_heads
        if heads % tp:
            p.append(
                f"num_attention_heads={heads} is not divisible by tensor({tp}); "
                f"use TP in {divisors(heads)} or {nearest_multiples(heads, tp)} heads"
            )
        groups = self.num_query_groups
        if groups is not None and groups != heads:
            if heads % groups:
                p.append(
                    f"num_attention_heads={heads} is not divisible by num_query_groups={groups}; "
                    f"use query groups in {divisors(heads)}"
                )
            if groups % tp:
                p.append(f"num_query_groups={groups} is not divisible by tensor({tp}); use TP in {divisors(groups)}")
        ffn = self.ffn_hidden_size
        if ffn is not None and ffn % tp:
            # Megatron-Core's MLP: fc2 (row-parallel) asserts divide(ffn_hidden_size, TP) at model build.
            # SwiGLU doubles fc1's (column-parallel) outputs but does not relax it: each rank holds
            # [gate, up] halves of ffn_hidden_size / TP rows.
            ok_tp = [d for d in divisors(ffn) if d <= max(2 * tp, 8)]
            p.append(
                f"ffn_hidden_size={ffn} is not divisible by tensor({tp}); use TP in {ok_tp} "
                f"or an ffn_hidden_size of {nearest_multiples(ffn, tp)}"
            )
        if self.sequence_parallel:
            if tp == 1:
                p.append("sequence_parallel needs tensor parallelism: use TP > 1 or drop --sequence-parallel")
            elif self.seq_length is not None and self.seq_length % tp:
                p.append(
                    f"seq_length={self.seq_length} is not divisible by tensor({tp}) with sequence "
                    f"parallel; try {nearest_multiples(self.seq_length, tp)}"
                )
        if p:
            return p  # the batch rules below need a whole DP

        dp = self.dp
        per_step = self.micro_batch_size * dp
        if self.global_batch_size % per_step:
            p.append(
                f"global_batch_size={self.global_batch_size} is not divisible by "
                f"micro_batch({self.micro_batch_size}) × data_parallel({dp}) = {per_step}; "
                f"try {nearest_multiples(self.global_batch_size, per_step)}"
            )
        else:
            p += self._group_problems()
        return p

    def _group_problems(self) -> list[str]:
        """Interleaved 1F1B's microbatch groups (Megatron-Core's ``forward_backward_pipelining_with_interleaving``)."""
        m, pp, given = self.num_microbatches, self.pp, self.microbatch_group_size_per_vp_stage
        if given is not None and not self.interleaved:
            return [
                f"microbatch_group_size_per_vp_stage={given} only applies to the interleaved schedule (VP > 1); "
                "drop it, or interleave with --num-virtual-stages-per-pipeline-rank"
            ]
        if not self.interleaved:
            return []
        group = self.microbatch_group_size
        source = f"microbatch_group_size_per_vp_stage={group}" if given else f"the microbatch group (PP = {pp})"
        counted = (
            f"microbatches per step ({m} = global_batch {self.global_batch_size} / (micro_batch "
            f"{self.micro_batch_size} × data_parallel {self.dp}))"
        )
        need = self.micro_batch_size * self.dp * pp
        if given is not None and not pp <= group <= m:
            return [f"{source} must lie between pipeline({pp}) and the {counted}; use {pp}..{max(m, pp)}"]
        if group > m:
            return [
                f"interleaved schedule: {counted} must be at least pipeline({pp}); try global_batch_size "
                f"{nearest_multiples(self.global_batch_size, need)} or VP=1"
            ]
        if 0 < m % group < pp:
            groups = valid_group_sizes(pp=pp, num_microbatches=m)
            return [
                f"interleaved schedule: {counted} leave a last group of {m % group} after groups of {group} "
                f"({source}), fewer than pipeline({pp}): Megatron-Core refuses it (it would stall the "
                f"pipeline); use --microbatch-group-size-per-virtual-pipeline-stage in {groups[:8]}, or "
                f"global_batch_size {nearest_multiples(self.global_batch_size, need)}, or VP=1"
            ]
        return []

    # ---------------------------------------------------------------- report
    def describe(self) -> list[str]:
        """The derived numbers, one 'name: value' line each, and the stage table when the layers are uneven."""
        vp_text = f" × VP {self.vp} (interleaved 1F1B)" if self.interleaved else ""
        cp_text = f" × CP {self.cp}" if self.cp > 1 else ""
        group = self.microbatch_group_size_per_vp_stage
        lines = [
            f"world size: {self.world_size} = TP {self.tp}{cp_text} × PP {self.pp} × DP {self.dp}{vp_text}",
            f"micro-batch: {self.micro_batch_size}, global batch: {self.global_batch_size}, "
            f"microbatches per step (gradient accumulation): {self.num_microbatches}"
            + (f", in groups of {group} per virtual stage" if group is not None else ""),
        ]
        if self.uneven:
            lines += self.stage_table()
        else:
            lines.append(
                f"layers per pipeline stage: {self.layers_per_pipeline_stage}"
                + (f", per virtual stage: {self.layers_per_virtual_stage}" if self.interleaved else "")
            )
        lines.append(f"pipeline bubble (p-1)/(v*m): {self.bubble_fraction:.3f}")
        return lines

    def stage_table(self) -> list[str]:
        """What every pipeline rank holds, chunk by chunk; consecutive ranks that hold alike share a row."""
        head = f"pipeline stages ({self.split.mode} split; E embedding, Nt transformer layers, L loss"
        lines = [head + (", virtual stages left to right):" if self.interleaved else "):")]
        rows = rank_rows([" | ".join(chunk.summary() for chunk in rank) for rank in self.stages])
        label_width = max(len(label) for label, *_ in rows)
        text_width = max(len(text) for *_, text in rows)
        for label, first, last, text in rows:
            lines.append(
                f"  {label:<{label_width}}  {text:<{text_width}}  "
                f"({self.rank_layers(first)} layers{' each' if last > first else ''})"
            )
        return lines


def virtual_stages(
    *,
    num_layers: int,
    pp: int,
    per_rank: int | None,
    layers_per_chunk: int | None,
    layout: str | None,
    uneven: bool,
    extra_slots: int,
) -> int | None:
    """VP from whichever of Megatron-LM's three flags gives it (None: not interleaved); LayoutError if the flags clash.

    ``--num-virtual-stages-per-pipeline-rank`` (``per_rank``) is VP itself; a
    ``--pipeline-model-parallel-layout`` string sets it to its stages over PP;
    ``--num-layers-per-virtual-pipeline-stage`` (``layers_per_chunk``) divides
    the layers per stage, counting the embedding and loss as layers when the
    account-for flags are given (``extra_slots``), and needs an even split
    (``uneven``: first/last stage layers given). At most one of the three
    (Megatron-LM's ``validate_args``).
    """
    problems: list[str] = []
    vp = per_rank
    given = [
        flag
        for flag, value in (
            ("--num-layers-per-virtual-pipeline-stage", layers_per_chunk),
            ("--num-virtual-stages-per-pipeline-rank", per_rank),
            ("--pipeline-model-parallel-layout", layout),
        )
        if value is not None
    ]
    if len(given) > 1:
        problems.append(f"{' and '.join(given)} each set the virtual pipeline size; give one of them")
    elif layout is not None:
        try:
            entries = len(expand_layout(layout))
        except ValueError as exc:
            problems.append(str(exc))
        else:
            if entries % pp == 0:
                vp = entries // pp
            # otherwise problems() names the stage count
    elif layers_per_chunk is not None:
        if uneven:
            problems.append(
                "--num-layers-per-virtual-pipeline-stage assumes an even split; with "
                "--decoder-first/last-pipeline-num-layers give --num-virtual-stages-per-pipeline-rank instead"
            )
        else:
            slots = num_layers + extra_slots
            if layers_per_chunk < 1 or slots % pp or (slots // pp) % layers_per_chunk:
                per_stage = f"{slots // pp}" if slots % pp == 0 else "not whole"
                choices = divisors(slots // pp) if slots % pp == 0 else "the divisors of layers per stage"
                problems.append(
                    f"num_layers_per_virtual_pipeline_stage={layers_per_chunk} does not divide the layers per "
                    f"pipeline stage ({slots} / pipeline({pp}) = {per_stage}); choose one of {choices}"
                )
            else:
                vp = slots // pp // layers_per_chunk
    if problems:
        raise LayoutError(problems)
    return vp if vp is not None and vp > 1 else None

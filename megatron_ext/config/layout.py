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
from typing import Any

from megatron_ext.estimate.pipeline import bubble_fraction


class LayoutError(ValueError):
    """One or more layout rules are broken; ``problems`` lists each message."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("invalid parallel layout:\n" + "\n".join(f"  - {p}" for p in problems))


def divisors(n: int) -> list[int]:
    """The positive divisors of ``n``, ascending."""
    return [d for d in range(1, n + 1) if n % d == 0]


def _nearest_multiples(value: int, multiple: int) -> str:
    """'32' or '24 or 32': the multiples of `multiple` around `value`."""
    below = (value // multiple) * multiple
    above = below + multiple
    return f"{above}" if below == 0 else f"{below} or {above}"


@dataclass(frozen=True, kw_only=True)
class ParallelLayout:
    """A TP × PP (× VP) × DP layout with its batch split, validated on creation."""

    world_size: int
    """Total number of processes (GPUs)."""
    tensor_model_parallel_size: int = 1
    """TP: ranks that split every layer's matrices (keep within a node)."""
    pipeline_model_parallel_size: int = 1
    """PP: pipeline stages, each holding a contiguous share of the layers."""
    virtual_pipeline_model_parallel_size: int | None = None
    """VP: model chunks per pipeline rank (interleaved 1F1B when > 1)."""
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
        global_batch_size: int | None,
        num_layers_per_virtual_pipeline_stage: int | None = None,
        **kwargs: object,
    ) -> ParallelLayout:
        """Build from Megatron-LM style flags.

        Resolves ``--num-layers-per-virtual-pipeline-stage`` into VP and a
        missing global batch into micro-batch × DP, checking the flags agree.
        """
        problems: list[str] = []
        tp = int(kwargs.get("tensor_model_parallel_size", 1) or 1)  # type: ignore[call-overload]
        pp = int(kwargs.get("pipeline_model_parallel_size", 1) or 1)  # type: ignore[call-overload]
        vp = kwargs.get("virtual_pipeline_model_parallel_size")
        num_layers = int(kwargs["num_layers"])  # type: ignore[call-overload]
        if num_layers_per_virtual_pipeline_stage is not None:
            per_stage = num_layers_per_virtual_pipeline_stage
            if per_stage < 1 or num_layers % pp or (num_layers // pp) % per_stage:
                problems.append(
                    f"num_layers_per_virtual_pipeline_stage={per_stage} does not divide the "
                    f"layers per pipeline stage (num_layers={num_layers} / pipeline({pp})"
                    f"{' = ' + str(num_layers // pp) if num_layers % pp == 0 else ' is not whole'}); "
                    f"choose one of {divisors(num_layers // pp) if num_layers % pp == 0 else 'the divisors of layers per stage'}"
                )
            else:
                derived = num_layers // pp // per_stage
                if vp is not None and vp != derived:
                    problems.append(
                        f"--virtual-pipeline-model-parallel-size {vp} contradicts "
                        f"--num-layers-per-virtual-pipeline-stage {per_stage} "
                        f"(which gives {derived} = {num_layers} layers / pipeline({pp}) / {per_stage}); give one of them"
                    )
                vp = derived
        if problems:
            raise LayoutError(problems)
        if global_batch_size is None:
            world = int(kwargs["world_size"])  # type: ignore[call-overload]
            dp = max(world // (tp * pp), 1)
            global_batch_size = int(kwargs.get("micro_batch_size", 1) or 1) * dp  # type: ignore[call-overload]
        if vp is not None and int(vp) <= 1:  # type: ignore[call-overload]
            vp = None
        kwargs["virtual_pipeline_model_parallel_size"] = vp
        return cls(global_batch_size=global_batch_size, **kwargs)  # type: ignore[arg-type]

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

    # ----------------------------------------------------------------- derived
    @property
    def tp(self) -> int:
        return self.tensor_model_parallel_size

    @property
    def pp(self) -> int:
        return self.pipeline_model_parallel_size

    @property
    def vp(self) -> int:
        """Virtual stages per pipeline rank (1 when not interleaved)."""
        return self.virtual_pipeline_model_parallel_size or 1

    @property
    def interleaved(self) -> bool:
        return self.vp > 1

    @property
    def data_parallel_size(self) -> int:
        return self.world_size // (self.tp * self.pp)

    @property
    def dp(self) -> int:
        return self.data_parallel_size

    @property
    def num_microbatches(self) -> int:
        """Microbatches per step on each pipeline (gradient-accumulation steps)."""
        return self.global_batch_size // (self.micro_batch_size * self.dp)

    @property
    def layers_per_pipeline_stage(self) -> int:
        return self.num_layers // self.pp

    @property
    def layers_per_virtual_stage(self) -> int:
        """Layers in one model chunk (= per pipeline stage when not interleaved)."""
        return self.num_layers // (self.pp * self.vp)

    @property
    def bubble_fraction(self) -> float:
        """Pipeline bubble relative to ideal compute, (p − 1)/(v·m): ``estimate.pipeline.bubble_fraction``."""
        return bubble_fraction(pp=self.pp, vp=self.vp, num_microbatches=self.num_microbatches)

    def stage_layers(self, pipeline_rank: int, virtual_rank: int = 0) -> range:
        """Global layer indices held by one (pipeline rank, model chunk).

        Interleaving assigns chunk v of rank r the layers of virtual stage
        ``v·p + r``, so each rank holds v non-contiguous groups.
        """
        per = self.layers_per_virtual_stage
        start = (virtual_rank * self.pp + pipeline_rank) * per
        return range(start, start + per)

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

        if self.world_size % (tp * pp):
            p.append(
                f"world_size={self.world_size} is not divisible by tensor({tp}) × pipeline({pp}) "
                f"= {tp * pp}; use {_nearest_multiples(self.world_size, tp * pp)} processes, "
                f"or TP × PP in {sorted({d for d in divisors(self.world_size)})}"
            )
        if self.gpus_per_node is not None and tp > self.gpus_per_node:
            p.append(
                f"tensor_model_parallel_size={tp} exceeds gpus_per_node={self.gpus_per_node}; "
                f"tensor parallelism must stay within a node: use TP <= {self.gpus_per_node}"
            )
        if self.num_layers % pp:
            fits = [d for d in divisors(self.num_layers) if d <= max(pp * 2, 8)]
            p.append(
                f"num_layers={self.num_layers} is not divisible by pipeline({pp}); "
                f"try {_nearest_multiples(self.num_layers, pp)} layers or PP in {fits}"
            )
        elif vp > 1:
            if pp == 1:
                p.append(
                    f"virtual_pipeline_model_parallel_size={vp} needs pipeline parallelism: "
                    "interleaving splits the layers of each pipeline rank; use PP >= 2 or VP=1"
                )
            if self.num_layers % (pp * vp):
                ok_vp = [d for d in divisors(self.num_layers // pp) if d > 1]
                p.append(
                    f"num_layers={self.num_layers} is not divisible by pipeline({pp}) × "
                    f"virtual({vp}) = {pp * vp}; try {_nearest_multiples(self.num_layers, pp * vp)} "
                    f"layers or VP in {[1, *ok_vp]}"
                )
        heads = self.num_attention_heads
        if heads % tp:
            p.append(
                f"num_attention_heads={heads} is not divisible by tensor({tp}); "
                f"use TP in {divisors(heads)} or {_nearest_multiples(heads, tp)} heads"
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
                f"or an ffn_hidden_size of {_nearest_multiples(ffn, tp)}"
            )
        if self.sequence_parallel:
            if tp == 1:
                p.append("sequence_parallel needs tensor parallelism: use TP > 1 or drop --sequence-parallel")
            elif self.seq_length is not None and self.seq_length % tp:
                p.append(
                    f"seq_length={self.seq_length} is not divisible by tensor({tp}) with sequence "
                    f"parallel; try {_nearest_multiples(self.seq_length, tp)}"
                )
        if p:
            return p  # the batch rules below need a whole DP

        dp = self.dp
        per_step = self.micro_batch_size * dp
        if self.global_batch_size % per_step:
            p.append(
                f"global_batch_size={self.global_batch_size} is not divisible by "
                f"micro_batch({self.micro_batch_size}) × data_parallel({dp}) = {per_step}; "
                f"try {_nearest_multiples(self.global_batch_size, per_step)}"
            )
        elif vp > 1 and self.num_microbatches % pp:
            m = self.num_microbatches
            need = per_step * pp
            p.append(
                f"interleaved schedule: microbatches per step ({m} = global_batch {self.global_batch_size} / "
                f"(micro_batch {self.micro_batch_size} × data_parallel {dp})) must be a multiple of "
                f"pipeline({pp}); try global_batch_size {_nearest_multiples(self.global_batch_size, need)} "
                f"or VP=1"
            )
        return p

    # ---------------------------------------------------------------- report
    def describe(self) -> list[str]:
        """The derived numbers, one 'name: value' line each."""
        vp_text = f" × VP {self.vp} (interleaved 1F1B)" if self.interleaved else ""
        return [
            f"world size: {self.world_size} = TP {self.tp} × PP {self.pp} × DP {self.dp}{vp_text}",
            f"micro-batch: {self.micro_batch_size}, global batch: {self.global_batch_size}, "
            f"microbatches per step (gradient accumulation): {self.num_microbatches}",
            f"layers per pipeline stage: {self.layers_per_pipeline_stage}"
            + (f", per virtual stage: {self.layers_per_virtual_stage}" if self.interleaved else ""),
            f"pipeline bubble (p-1)/(v*m): {self.bubble_fraction:.3f}",
        ]

"""What is trained, independent of how it is split: the input of the memory and time models."""

from __future__ import annotations

from dataclasses import dataclass

from megatron_ext.config.arguments import BatchArgs, ModelArgs, ParallelArgs
from megatron_ext.config.flags import to_argv
from megatron_ext.config.optimizer_args import FP8_RECIPES, OptimizerArgs
from megatron_ext.config.training_config import TrainingConfig, pad_vocab_size, unpadded_vocab_size
from megatron_ext.estimate.coverage import APPROXIMATED, approximations
from megatron_ext.estimate.shapes import ParameterCounts, parameter_counts

PRECISIONS = ("bf16", "fp16", "fp32")
RECOMPUTE_GRANULARITIES = ("none", "selective", "full")
RECOMPUTE_METHODS = ("uniform", "block")


@dataclass(frozen=True, kw_only=True)
class Workload:
    """A model shape and the training options that change memory or time (not the layout)."""

    model: ModelArgs
    """The model, exactly as ``pretrain_gpt.py`` takes it (validated by ``ModelArgs``)."""
    precision: str = "bf16"
    """``bf16`` / ``fp16`` (mixed precision, fp32 master weights) or ``fp32``."""
    recompute_granularity: str = "none"
    """Activation recomputation: ``none``, ``selective`` (attention core) or ``full`` (whole layers)."""
    recompute_method: str = "uniform"
    """With ``full``: ``uniform`` (checkpoint every group of layers) or ``block`` (the first layers of a chunk)."""
    recompute_num_layers: int = 1
    """With ``full``: layers per checkpointed group (uniform) or recomputed layers per chunk (block)."""
    overlap_grad_reduce: bool = False
    """Overlap the data-parallel gradient reduction with the last backward pass."""
    overlap_param_gather: bool = False
    """Overlap the distributed optimizer's parameter all-gather with the first forward pass."""
    ddp_bucket_size: int | None = None
    """``--ddp-bucket-size``: parameters per gradient bucket (None: Megatron-Core's default)."""
    ddp_num_buckets: int | None = None
    """``--ddp-num-buckets``: buckets per rank instead of a size."""
    grad_reduce_in_bf16: bool = False
    """``--grad-reduce-in-bf16``: Megatron-Core's DDP holds and reduces the gradients in bf16 (2 bytes per
    parameter, half the data-parallel traffic) instead of fp32."""
    overlap_p2p_comm: bool = True
    """The interleaved schedule's pipeline transfers overlap compute (Megatron-LM's default); False:
    ``--no-overlap-p2p-communication``, each pass waits for its batched send and receive."""
    tp_comm_overlap: bool = False
    """``--tp-comm-overlap``: Transformer Engine overlaps each tensor-parallel collective with its GEMM, chunk by
    chunk around the ring; only the first chunk (``1/TP`` of it), or what the GEMM cannot cover, is exposed."""
    fp8_format: str | None = None
    """``--fp8-format``: the transformer layers' GEMMs run in FP8 (Transformer Engine), at the GPU's FP8 peak,
    their inputs and output gradients cast to FP8 first; the logits and the attention core stay in the training
    precision."""
    fp8_recipe: str = "delayed"
    """``--fp8-recipe``: how Transformer Engine scales each FP8 tensor, which decides the casts' memory traffic
    (``fp8.fp8_cast_bytes``): ``delayed`` (from an amax history: the norm writes FP8 itself), ``tensorwise`` (current
    scaling: each tensor's amax first, a pass of its own unless the norm computes it), ``blockwise`` (1×128 and
    128×128 blocks, each block's scale in the cast kernel, both layouts gathered) or ``mxfp8`` (Blackwell's
    microscaling; no profile here has it)."""
    fp8_param_gather: bool = False
    """``--fp8-param-gather``: Transformer Engine keeps the layers' linear weights in FP8, and the distributed
    optimizer all-gathers them in FP8 (1 byte each; the other parameters in the training precision)."""
    zero_bubble: bool = False
    """``--enable-zero-bubble``: the backward split into B and W passes, W passes filling part of the bubble (ZB-H1,
    or ZB interleaved with virtual stages), priced as ``parallel.pipeline.zb_bubble_scale`` of 1F1B's bubble at 1F1B's
    activation memory (``estimate.zero_bubble`` simulates both within it)."""
    approximated: tuple[str, ...] = ()
    """The flags given whose effect the estimate follows only approximately, as ``pretrain_gpt.py`` spells them
    (``coverage.APPROXIMATED``): carried into the printed command."""
    approximations: tuple[str, ...] = ()
    """One line for each of them: how the estimate approximates it."""
    tokenizer_vocab_size: int | None = None
    """The tokenizer's vocabulary (``--tokenizer-vocab-size``; a run's preflight reads it from the tokenizer);
    None: the null tokenizer's, ``--vocab-size`` + 1."""
    p2p_scatter_gather: bool = False
    """Send 1/TP of each pipeline activation per TP rank and all-gather it after (Narayanan et al. 2021,
    §4.1; Megatron-LM 2021). Megatron-Core splits p2p messages only with sequence parallelism."""

    @classmethod
    def of_config(cls, cfg: TrainingConfig) -> Workload:
        """The workload of a run's configuration (what ``pretrain_gpt.py`` trains with these flags)."""
        return cls.of_flags(
            cfg.model, cfg.optim, cfg.parallel, cfg.batch, tokenizer_vocab_size=cfg.tokenizer_vocab_size
        )

    @classmethod
    def of_flags(
        cls,
        model: ModelArgs,
        optim: OptimizerArgs,
        parallel: ParallelArgs,
        batch: BatchArgs | None = None,
        *,
        tokenizer_vocab_size: int | None = None,
    ) -> Workload:
        """The workload of ``pretrain_gpt.py``'s argument groups, each already checked on its own (``batch``: for
        the flags the estimate approximates; ``tokenizer_vocab_size``: the tokenizer's, None for the null one)."""
        approximate = {"model": model, "optim": optim, "parallel": parallel, **({"batch": batch} if batch else {})}
        return cls(
            model=model,
            precision="bf16" if optim.bf16 else "fp16" if optim.fp16 else "fp32",
            recompute_granularity=optim.recompute_granularity or "none",
            recompute_method=optim.recompute_method or "uniform",
            recompute_num_layers=optim.recompute_num_layers or 1,
            overlap_grad_reduce=parallel.overlap_grad_reduce,
            overlap_param_gather=parallel.overlap_param_gather,
            ddp_bucket_size=parallel.ddp_bucket_size,
            ddp_num_buckets=parallel.ddp_num_buckets,
            grad_reduce_in_bf16=optim.grad_reduce_in_bf16,
            fp8_format=optim.fp8_format,
            fp8_recipe=optim.fp8_recipe,
            fp8_param_gather=optim.fp8_param_gather,
            overlap_p2p_comm=not parallel.no_overlap_p2p_communication,
            tp_comm_overlap=parallel.tp_comm_overlap,
            zero_bubble=parallel.enable_zero_bubble,
            tokenizer_vocab_size=tokenizer_vocab_size,
            approximated=tuple(approximated_flags(*approximate.values())),
            approximations=tuple(approximations(approximate)),
        )

    def __post_init__(self) -> None:
        problems = []
        if self.precision not in PRECISIONS:
            problems.append(f"precision {self.precision!r} is not one of {', '.join(PRECISIONS)}")
        if self.recompute_granularity not in RECOMPUTE_GRANULARITIES:
            problems.append(
                f"--recompute-granularity {self.recompute_granularity!r} is not one of "
                f"{', '.join(RECOMPUTE_GRANULARITIES)}"
            )
        if self.recompute_method not in RECOMPUTE_METHODS:
            problems.append(
                f"--recompute-method {self.recompute_method!r} is not one of {', '.join(RECOMPUTE_METHODS)}"
            )
        if self.fp8_recipe not in FP8_RECIPES:
            problems.append(f"--fp8-recipe {self.fp8_recipe!r} is not one of {', '.join(FP8_RECIPES)}")
        if self.grad_reduce_in_bf16 and self.precision != "bf16":
            problems.append("--grad-reduce-in-bf16 needs --bf16")
        if self.fp8_param_gather and self.fp8_format is None:
            problems.append("--fp8-param-gather applies with --fp8-format only")
        if self.recompute_num_layers < 1:
            problems.append(f"--recompute-num-layers must be at least 1, got {self.recompute_num_layers}")
        if self.tokenizer_vocab_size is None and (self.model.vocab_size is None or self.model.vocab_size < 1):
            problems.append("--vocab-size must be given (the tokenizer's vocabulary, e.g. 50257 for GPT-2 BPE)")
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def mixed_precision(self) -> bool:
        return self.precision != "fp32"

    @property
    def gradient_bytes(self) -> float:
        """Bytes per gradient in the DDP buffer, held and reduced: fp32 (``grad_reduce_in_fp32``, Megatron-LM's
        default with --bf16/--fp16), bf16 with --grad-reduce-in-bf16."""
        return 2.0 if self.grad_reduce_in_bf16 else 4.0

    @property
    def activation_bytes(self) -> int:
        """Bytes per activation element: 2 in bf16/fp16, 4 in fp32."""
        return 2 if self.mixed_precision else 4

    def padded_vocab_size(self, tensor_parallel: int) -> int:
        """Megatron's padding of the run's vocabulary (``unpadded_vocab_size``: the tokenizer's, else
        ``--vocab-size`` and the null tokenizer's end of document): a multiple of ``make_vocab_size_divisible_by ×
        TP``, as ``pretrain_gpt.py --dry-run`` counts it."""
        vocab = unpadded_vocab_size(self.model.vocab_size, self.tokenizer_vocab_size)
        return pad_vocab_size(vocab, self.model.make_vocab_size_divisible_by, tensor_parallel)

    def parameter_counts(self, *, tp: int, pp: int, stage_layers: tuple[int, ...] | None = None) -> ParameterCounts:
        """Exact parameter counts of the model split TP × PP (``shapes.parameter_counts``)."""
        return parameter_counts(
            self.model, padded_vocab_size=self.padded_vocab_size(tp), tp=tp, pp=pp, stage_layers=stage_layers
        )


def approximated_flags(*groups: object) -> list[str]:
    """The approximated flags (``coverage.APPROXIMATED``) that ``groups`` give, as command-line words."""
    return [word for values in groups for word in to_argv(values, only=APPROXIMATED)]

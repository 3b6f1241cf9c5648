"""Command line and configuration: Megatron-LM's flag names, frozen dataclasses.

Every option is a field of one of the argument-group dataclasses below; the
field's ``help`` metadata is its ``--help`` text and the flag is the field
name with dashes (Megatron-LM's spelling). ``parse_args`` returns one frozen
:class:`TrainingConfig`; nothing reads process-wide globals.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from megatron_ext.config import schedule
from megatron_ext.config.flags import Parser, add_options, bound_problems, flag_of, opt, to_argv
from megatron_ext.config.layout import ParallelLayout
from megatron_ext.config.megatron_lm import split_unknown
from megatron_ext.config.presets import PRESETS, get_preset
from megatron_ext.config.tokenizer_types import TOKENIZER_TYPES, VOCAB_FILE_TOKENIZERS, tokenizer_type_problem


class ConfigError(ValueError):
    """Contradictory or out-of-range options (not layout rules: see LayoutError)."""


class _Options:
    """An argument group: on creation every value is checked against its field's bounds (the flag table's
    ``minimum``/``maximum``/``above``), then against the others (``_relations``); every problem is named."""

    def __post_init__(self) -> None:
        problems = bound_problems(self)
        if problems:
            raise ConfigError("; ".join(problems))
        self._relations()

    def _relations(self) -> None:
        """Rules between fields (ConfigError naming the flags and a fix)."""


@dataclass(frozen=True, kw_only=True)
class ModelArgs(_Options):
    """Shape of the GPT."""

    num_layers: int = opt(2, "Number of transformer layers.", estimate=True, minimum=1)
    hidden_size: int = opt(64, "Transformer hidden size.", estimate=True, minimum=1)
    ffn_hidden_size: int | None = opt(
        None,
        "MLP hidden size (default 4 × hidden, or 8/3 × hidden rounded to 64 with --swiglu).",
        estimate=True,
        minimum=1,
    )
    num_attention_heads: int = opt(4, "Number of attention heads.", estimate=True, minimum=1)
    group_query_attention: bool = opt(False, "Use grouped-query attention (see --num-query-groups).", estimate=True)
    num_query_groups: int | None = opt(
        None, "Number of key/value groups with --group-query-attention.", estimate=True, minimum=1
    )
    kv_channels: int | None = opt(None, "Projection size per head (default hidden / heads).", estimate=True, minimum=1)
    seq_length: int = opt(128, "Sequence length in tokens.", estimate=True, minimum=1)
    max_position_embeddings: int | None = opt(
        None, "Positions of the learned position embedding (default --seq-length).", estimate=True, minimum=1
    )
    position_embedding_type: str = opt(
        "learned_absolute", "Position embedding.", choices=["learned_absolute", "rope", "none"], estimate=True
    )
    rotary_base: int = opt(10000, "Base of the rotary embedding with rope.", above=0)
    rotary_percent: float = opt(1.0, "Share of each head's dimensions that rope rotates.", above=0, maximum=1)
    swiglu: bool = opt(False, "Use a SwiGLU MLP (gated SiLU) instead of GeLU.", estimate=True)
    normalization: str = opt("LayerNorm", "Normalization layer.", choices=["LayerNorm", "RMSNorm"], estimate=True)
    norm_epsilon: float = opt(1e-5, "Epsilon of the normalization layers.", above=0)
    apply_layernorm_1p: bool = opt(
        False, "Zero-centred norm weights: each norm stores gamma − 1, starting at 0, and scales by weight + 1."
    )
    untie_embeddings_and_output_weights: bool = opt(
        False, "Separate input embedding and output layer weights.", estimate=True
    )
    disable_bias_linear: bool = opt(False, "No bias in the linear layers.", estimate=True)
    # Probabilities in [0, 1): 1 would zero every activation (or every attention weight) and train nothing.
    hidden_dropout: float = opt(0.1, "Dropout probability after attention and MLP.", estimate=True, minimum=0, below=1)
    attention_dropout: float = opt(0.1, "Dropout probability on attention scores.", estimate=True, minimum=0, below=1)
    init_method_std: float = opt(0.02, "Standard deviation of the normal weight initialisation.", above=0)
    vocab_size: int | None = opt(
        None,
        "Vocabulary before padding: the null tokenizer's (mock data) here; the tokenizer's in the layout calculator "
        "(default there 50257, GPT-2 BPE, unless --model).",
        estimate=True,
        minimum=1,
    )
    make_vocab_size_divisible_by: int = opt(
        128, "Pad the vocabulary to a multiple of this × tensor-parallel size.", estimate=True, minimum=1
    )
    transformer_impl: str = opt(
        "auto",
        "Layer implementation: transformer_engine, local, or auto (TE when importable on GPU).",
        choices=["auto", "local", "transformer_engine"],
        estimate=True,
    )
    attention_backend: str = opt(
        "auto",
        "Attention kernel. With Transformer Engine: its flash, fused or unfused backend (auto: TE chooses). "
        "With the local spec: PyTorch's scaled_dot_product_attention restricted to its flash, fused "
        "(memory-efficient) or unfused (math) kernel (auto: PyTorch chooses); local: Megatron-Core's own "
        "DotProductAttention.",
        choices=["auto", "flash", "fused", "unfused", "local"],
        estimate=True,
    )
    cross_entropy_loss_fusion: bool = opt(False, "Fused vocabulary-parallel cross entropy (GPU).")
    no_bias_gelu_fusion: bool = opt(False, "Do not fuse bias and GeLU (fused on GPU by default).")
    no_bias_swiglu_fusion: bool = opt(False, "Do not fuse bias and SwiGLU (fused on GPU by default).")
    no_bias_dropout_fusion: bool = opt(False, "Do not fuse bias, dropout and residual add (fused on GPU by default).")
    no_masked_softmax_fusion: bool = opt(
        False, "Do not use Megatron-Core's fused attention-softmax kernels (apex's; used on GPU when installed)."
    )
    no_rope_fusion: bool = opt(False, "Do not fuse the rotary embedding (Transformer Engine's kernel).")
    no_gradient_accumulation_fusion: bool = opt(
        False,
        "Do not fuse the weight-gradient GEMM with its accumulation into the fp32 gradient buffer (Transformer "
        "Engine's or apex's kernel).",
    )

    @property
    def effective_ffn_hidden_size(self) -> int:
        if self.ffn_hidden_size is not None:
            return self.ffn_hidden_size
        if self.swiglu:
            # Megatron-LM: 2/3 of 4h, rounded to a multiple of 64 for kernel efficiency.
            return int((4 * self.hidden_size * 2 / 3) / 64) * 64
        return 4 * self.hidden_size

    @property
    def effective_num_query_groups(self) -> int:
        if self.group_query_attention and self.num_query_groups is not None:
            return self.num_query_groups
        return self.num_attention_heads

    @property
    def effective_kv_channels(self) -> int:
        return self.kv_channels or self.hidden_size // self.num_attention_heads

    def _relations(self) -> None:
        if self.group_query_attention and self.num_query_groups is None:
            raise ConfigError("--group-query-attention needs --num-query-groups")
        if self.kv_channels is None and self.hidden_size % self.num_attention_heads:
            raise ConfigError(
                f"hidden_size={self.hidden_size} is not divisible by "
                f"num_attention_heads={self.num_attention_heads}; set --kv-channels or change one"
            )
        max_pos = self.max_position_embeddings
        if self.position_embedding_type == "learned_absolute" and max_pos is not None and max_pos < self.seq_length:
            raise ConfigError(
                f"--max-position-embeddings {max_pos} is smaller than --seq-length {self.seq_length}: learned "
                f"positions need one per token; raise it to {self.seq_length} or more (or use --position-embedding-type rope)"
            )
        if self.transformer_impl == "transformer_engine" and self.attention_backend == "local":
            raise ConfigError(
                "--attention-backend local is Megatron-Core's attention of the local spec and contradicts "
                "--transformer-impl transformer_engine; use --transformer-impl local (or auto), or another backend"
            )


@dataclass(frozen=True, kw_only=True)
class ParallelArgs(_Options):
    """How the model and the batch are split over processes."""

    tensor_model_parallel_size: int = opt(
        1, "Tensor-parallel size (keep it within a node).", estimate=True, short="--tp", env="TP", minimum=1
    )
    pipeline_model_parallel_size: int = opt(
        1, "Pipeline-parallel size (stages across nodes).", estimate=True, short="--pp", env="PP", minimum=1
    )
    context_parallel_size: int = opt(
        1,
        "Context-parallel size: ranks that split every sequence (ring attention over their keys and values); needs "
        "Transformer Engine's attention.",
        estimate=True,
        short="--cp",
        env="CP",
        minimum=1,
    )
    num_layers_per_virtual_pipeline_stage: int | None = opt(
        None,
        "Layers per virtual stage (even splits only): turns on the interleaved 1F1B schedule.",
        estimate=True,
        minimum=1,
    )
    virtual_pipeline_model_parallel_size: int | None = opt(
        None,
        "Virtual stages (model chunks) per pipeline rank; interleaved 1F1B when > 1.",
        flag="--num-virtual-stages-per-pipeline-rank",
        aliases=("--virtual-pipeline-model-parallel-size",),
        estimate=True,
        short="--vp",
        env="VP",
        minimum=1,
    )
    decoder_first_pipeline_num_layers: int | None = opt(
        None,
        "Transformer layers on the first pipeline stage (the other stages share the rest evenly).",
        estimate=True,
        env="FIRST_STAGE_LAYERS",
        minimum=1,
    )
    decoder_last_pipeline_num_layers: int | None = opt(
        None,
        "Transformer layers on the last pipeline stage (the other stages share the rest evenly).",
        estimate=True,
        env="LAST_STAGE_LAYERS",
        minimum=1,
    )
    account_for_embedding_in_pipeline_split: bool = opt(
        False,
        "Count the embedding as a layer when splitting layers over pipeline stages.",
        estimate=True,
        env="ACCOUNT_FOR_EMBEDDING",
    )
    account_for_loss_in_pipeline_split: bool = opt(
        False,
        "Count the output layer and loss as a layer when splitting layers over pipeline stages.",
        estimate=True,
        env="ACCOUNT_FOR_LOSS",
    )
    pipeline_model_parallel_layout: str | None = opt(
        None,
        'Megatron-Core layout string placing every layer, e.g. "Et*3|(t*4|)*30,t*3L" (E embedding, '
        "t transformer layer, L loss, | between virtual stages); sets VP.",
        estimate=True,
        env="PIPELINE_LAYOUT",
    )
    microbatch_group_size_per_vp_stage: int | None = opt(
        None,
        "Interleaved 1F1B: microbatches run through one virtual stage before the next (default PP).",
        flag="--microbatch-group-size-per-virtual-pipeline-stage",
        estimate=True,
        env="MICROBATCH_GROUP_SIZE",
        minimum=1,
    )
    sequence_parallel: bool = opt(
        False, "Sequence parallelism in the TP regions (needs TP > 1).", estimate=True, env="SEQUENCE_PARALLEL"
    )
    use_distributed_optimizer: bool = opt(
        False, "Shard optimizer state over data-parallel ranks.", estimate=True, env="DISTRIBUTED_OPTIMIZER"
    )
    overlap_grad_reduce: bool = opt(False, "Overlap the gradient reduce-scatter with backward.", estimate=True)
    overlap_param_gather: bool = opt(
        False, "Overlap the parameter all-gather with forward (needs the distributed optimizer).", estimate=True
    )
    world_size: int | None = opt(
        None, "World size for --dry-run (default: $WORLD_SIZE, or 1). Ignored in real runs.", minimum=1
    )


@dataclass(frozen=True, kw_only=True)
class BatchArgs(_Options):
    micro_batch_size: int = opt(
        1, "Sequences per microbatch per data-parallel rank.", estimate=True, env="MICRO_BATCH", minimum=1
    )
    global_batch_size: int | None = opt(
        None,
        "Sequences per optimizer step over all ranks (default micro-batch × DP).",
        estimate=True,
        env="GLOBAL_BATCH",
        minimum=1,
    )
    rampup_batch_size: tuple[int, ...] | None = opt(
        None,
        "Ramp the global batch up: START INCREMENT SAMPLES. Steps start with START sequences, which grows by "
        "INCREMENT in equal shares of the first SAMPLES samples, up to --global-batch-size (with --train-samples).",
    )
    decrease_batch_size_if_needed: bool = opt(
        False,
        "With --rampup-batch-size: round a global batch that micro-batch × DP does not divide down to a multiple, "
        "instead of refusing the ramp.",
    )

    def _relations(self) -> None:
        ramp = self.rampup_batch_size
        if ramp is not None and (len(ramp) != 3 or ramp[0] < 1 or ramp[1] < 1 or ramp[2] < 0):
            raise ConfigError(
                f"--rampup-batch-size takes three numbers, START INCREMENT SAMPLES (START and INCREMENT at least "
                f"1), got {' '.join(map(str, ramp))}"
            )
        if self.decrease_batch_size_if_needed and ramp is None:
            raise ConfigError("--decrease-batch-size-if-needed applies only with --rampup-batch-size")


@dataclass(frozen=True, kw_only=True)
class OptimizerArgs(_Options):
    optimizer: str = opt("adam", "Optimizer.", choices=["adam", "sgd"])
    lr: float = opt(1e-4, "Peak learning rate.", above=0)
    min_lr: float = opt(0.0, "Learning rate at the end of decay.", minimum=0)
    lr_warmup_iters: int = opt(0, "Iterations of linear warm-up.", minimum=0)
    lr_warmup_samples: int = opt(0, "Samples of linear warm-up (with --train-samples).", minimum=0)
    lr_warmup_fraction: float | None = opt(
        None, "Warm-up as a fraction of the decay length (instead of --lr-warmup-iters/-samples).", minimum=0
    )
    lr_warmup_init: float = opt(0.0, "Learning rate at the start of the warm-up.", minimum=0)
    lr_decay_iters: int | None = opt(None, "Iterations of decay (default --train-iters).", minimum=0)
    lr_decay_samples: int | None = opt(
        None, "Samples of decay, with --train-samples (default --train-samples).", minimum=0
    )
    lr_decay_style: str = opt(
        "linear",
        "Decay shape. WSD: warm-up, stable at --lr, then an anneal to --min-lr over the decay's last "
        "--lr-wsd-decay-iters/-samples.",
        choices=["constant", "linear", "cosine", "inverse-square-root", "WSD"],
    )
    lr_wsd_decay_style: str = opt(
        "exponential",
        "Shape of the WSD anneal.",
        choices=["exponential", "linear", "cosine", "minus_sqrt"],
    )
    lr_wsd_decay_iters: int | None = opt(None, "Iterations of the WSD anneal.", minimum=0)
    lr_wsd_decay_samples: int | None = opt(None, "Samples of the WSD anneal (with --train-samples).", minimum=0)
    decoupled_lr: float | None = opt(
        None, "Peak learning rate of the input embedding and output layer (default --lr).", above=0
    )
    decoupled_min_lr: float | None = opt(
        None, "Final learning rate of the input embedding and output layer (default --min-lr).", minimum=0
    )
    weight_decay: float = opt(0.01, "Weight decay (with --weight-decay-incr-style constant).", minimum=0)
    start_weight_decay: float | None = opt(None, "Weight decay at the start (a non-constant style).", minimum=0)
    end_weight_decay: float | None = opt(None, "Weight decay at the end of training (a non-constant style).", minimum=0)
    weight_decay_incr_style: str = opt(
        "constant",
        "How weight decay goes from --start-weight-decay to --end-weight-decay over training.",
        choices=["constant", "linear", "cosine"],
    )
    adam_beta1: float = opt(0.9, "Adam beta1.", minimum=0, maximum=1)
    adam_beta2: float = opt(0.999, "Adam beta2.", minimum=0, maximum=1)
    adam_eps: float = opt(1e-8, "Adam epsilon.", above=0)
    sgd_momentum: float = opt(0.9, "SGD momentum.", minimum=0, maximum=1)
    clip_grad: float = opt(1.0, "Clip the global gradient norm to this (0 disables).", minimum=0)
    bf16: bool = opt(False, "bf16 mixed precision (fp32 master weights).", estimate=True)
    fp16: bool = opt(False, "fp16 mixed precision with dynamic loss scaling.", estimate=True)
    loss_scale: float | None = opt(None, "Static loss scale for fp16 (default dynamic).", above=0)
    initial_loss_scale: float = opt(2.0**32, "Initial dynamic loss scale for fp16.", above=0)
    min_loss_scale: float = opt(1.0, "Lowest dynamic loss scale for fp16.", above=0)
    loss_scale_window: float = opt(1000, "Steps without overflow before the dynamic loss scale grows.", above=0)
    hysteresis: int = opt(2, "Overflows tolerated before the dynamic loss scale shrinks.", minimum=1)
    grad_reduce_in_bf16: bool = opt(
        False, "With --bf16: reduce gradients in bf16 instead of fp32 (half the traffic, less precise)."
    )
    seed: int = opt(1234, "Random seed.", minimum=0)
    recompute_granularity: str | None = opt(
        None, "Activation recomputation.", choices=["full", "selective"], estimate=True
    )
    recompute_method: str | None = opt(
        None, "With full recomputation: which layers.", choices=["uniform", "block"], estimate=True
    )
    recompute_num_layers: int | None = opt(None, "With full recomputation: layers per group.", estimate=True, minimum=1)
    calculate_per_token_loss: bool = opt(
        False, "Average the loss over all tokens of the step instead of per microbatch."
    )

    def _relations(self) -> None:
        if self.bf16 and self.fp16:
            raise ConfigError("--bf16 and --fp16 are mutually exclusive; choose one")
        if self.grad_reduce_in_bf16 and not self.bf16:
            raise ConfigError("--grad-reduce-in-bf16 applies only with --bf16 (Megatron-LM ignores it otherwise)")
        if self.lr_warmup_fraction is not None and (self.lr_warmup_iters or self.lr_warmup_samples):
            raise ConfigError("give one of --lr-warmup-fraction and --lr-warmup-iters/--lr-warmup-samples")
        wsd_length = self.lr_wsd_decay_iters is not None or self.lr_wsd_decay_samples is not None
        if self.lr_decay_style == "WSD" and not wsd_length:
            raise ConfigError("--lr-decay-style WSD needs the anneal's length: --lr-wsd-decay-iters (or -samples)")
        if self.lr_decay_style != "WSD" and (wsd_length or self.lr_wsd_decay_style != "exponential"):
            raise ConfigError("--lr-wsd-decay-iters/-samples/-style apply only with --lr-decay-style WSD")
        if self.decoupled_min_lr is not None and self.decoupled_lr is None:
            raise ConfigError("--decoupled-min-lr applies only with --decoupled-lr")
        if self.decoupled_lr is not None and (self.decoupled_min_lr or self.min_lr) > self.decoupled_lr:
            raise ConfigError(
                f"the embedding and output layer's final learning rate "
                f"({self.decoupled_min_lr if self.decoupled_min_lr is not None else self.min_lr:g}: "
                f"--decoupled-min-lr, default --min-lr) is larger than --decoupled-lr {self.decoupled_lr:g}"
            )
        if self.lr_warmup_fraction is not None and self.lr_warmup_fraction >= 1:
            raise ConfigError(
                f"--lr-warmup-fraction {self.lr_warmup_fraction:g} must be below 1: the warm-up must end before "
                "the decay does"
            )
        varying = self.start_weight_decay is not None or self.end_weight_decay is not None
        if self.weight_decay_incr_style == "constant" and varying:
            raise ConfigError(
                "--start-weight-decay/--end-weight-decay need --weight-decay-incr-style linear or cosine "
                "(constant uses --weight-decay)"
            )
        if self.weight_decay_incr_style != "constant" and (
            self.start_weight_decay is None or self.end_weight_decay is None
        ):
            raise ConfigError(
                f"--weight-decay-incr-style {self.weight_decay_incr_style} needs both --start-weight-decay and "
                "--end-weight-decay"
            )
        if self.recompute_granularity == "full" and self.recompute_method is None:
            raise ConfigError("--recompute-granularity full needs --recompute-method uniform|block")
        if self.recompute_method is not None and self.recompute_granularity != "full":
            raise ConfigError("--recompute-method is only used with --recompute-granularity full")
        if self.min_lr > self.lr:
            raise ConfigError(
                f"--min-lr {self.min_lr:g} is larger than --lr {self.lr:g}; lower --min-lr to --lr or less"
            )


_SPLIT_SEPARATOR = re.compile(r"\s*[,/]\s*|\s+")
_SPLIT_PART = re.compile(r"\+?(?:\d+\.?\d*|\.\d+)")
_SPLIT_EXAMPLE = "give up to three proportions (train, valid, test) separated by ',' or '/', e.g. 969,30,1"


def parse_split(text: str) -> tuple[float, float, float]:
    """Megatron's split string as (train, valid, test) weights, or a one-line ConfigError naming ``--split``.

    Megatron-Core reads the string as every run of digits and dots in it (``parse_and_normalize_split``), fewer
    than three padded with zeros; Megatron-LM's older reader splits on ``,`` or ``/``. Both read plain decimals
    between those separators alike, and so does this. What they would misread is refused: a sign or exponent
    Megatron-Core drops (``100,-5,5`` becomes 100,5,5; ``1e3`` becomes 1,3), a word (``abc``, ``nan``), an empty
    part (``969,,1`` would shift the test share into valid), more than three parts (an assertion there), and
    proportions summing to 0 (a NaN there).
    """
    stripped = text.strip()
    if not stripped:
        raise ConfigError(f"--split is empty; {_SPLIT_EXAMPLE}")
    parts = _SPLIT_SEPARATOR.split(stripped)
    for part in parts:
        if not _SPLIT_PART.fullmatch(part):
            what = "an empty part" if not part else f"{part!r}, which is not a non-negative decimal number"
            raise ConfigError(f"--split {text!r} has {what}; {_SPLIT_EXAMPLE}")
    if len(parts) > 3:
        raise ConfigError(f"--split {text!r} has {len(parts)} parts; {_SPLIT_EXAMPLE}")
    weights = [float(part) for part in parts] + [0.0] * (3 - len(parts))
    if not all(math.isfinite(w) for w in weights):
        raise ConfigError(f"--split {text!r} has a number too large to be a proportion; {_SPLIT_EXAMPLE}")
    if sum(weights) <= 0:
        raise ConfigError(f"--split {text!r} gives every split a share of 0; {_SPLIT_EXAMPLE}")
    train, valid, test = weights
    return train, valid, test


@dataclass(frozen=True, kw_only=True)
class DataArgs(_Options):
    """Training data (Megatron indexed datasets, made by tools/preprocess_data.py) and the tokenizer."""

    mock_data: bool = opt(False, "Train on Megatron-Core's mock GPT dataset (no files).")
    data_path: tuple[str, ...] = opt(
        (), "Indexed dataset prefixes (no .bin/.idx), optionally weighted: 'P1 P2 …' or 'W1 P1 W2 P2 …'."
    )
    split: str = opt(
        "969,30,1", "Train/valid/test proportions of --data-path (Megatron's split string).", env="DATA_SPLIT"
    )
    train_data_path: tuple[str, ...] = opt((), "Training blend when the splits come from separate datasets.")
    valid_data_path: tuple[str, ...] = opt((), "Validation blend (with --train-data-path).")
    test_data_path: tuple[str, ...] = opt((), "Test blend (with --train-data-path).")
    data_cache_path: str | None = opt(
        None,
        "Where Megatron-Core caches its sample/shuffle indices (default: next to each dataset).",
        env="DATA_CACHE_PATH",
    )
    tokenizer_type: str = opt(
        "NullTokenizer",
        f"Tokenizer, with Megatron-LM's names and semantics (must be the one the data was preprocessed with): "
        f"{', '.join(TOKENIZER_TYPES)}. Default: GPT2BPETokenizer with --vocab-file and --merge-file, else "
        "NullTokenizer.",
        env="TOKENIZER_TYPE",
    )
    tokenizer_model: str | None = opt(
        None, "SentencePiece .model file, or a local Hugging Face tokenizer directory.", env="TOKENIZER_MODEL"
    )
    vocab_file: str | None = opt(None, "GPT2BPETokenizer: vocab.json.")
    merge_file: str | None = opt(None, "GPT2BPETokenizer: merges.txt.")
    num_workers: int = opt(0, "Data-loader worker processes.", minimum=0)
    no_mmap_bin_files: bool = opt(False, "Read the .bin files with file reads instead of memory-mapping them.")
    eod_mask_loss: bool = opt(False, "Leave the end-of-document tokens out of the loss (their loss mask is 0).")
    reset_position_ids: bool = opt(
        False, "Restart position ids at 0 after every end-of-document token (learned absolute positions)."
    )

    def _relations(self) -> None:
        parse_split(self.split)  # raises, naming --split
        problem = tokenizer_type_problem(self.tokenizer_type)
        if problem is not None:
            raise ConfigError(problem)
        if (self.vocab_file or self.merge_file) and self.tokenizer_type not in VOCAB_FILE_TOKENIZERS:
            raise ConfigError(
                f"--vocab-file/--merge-file are read by {' and '.join(VOCAB_FILE_TOKENIZERS)}, not by "
                f"--tokenizer-type {self.tokenizer_type}; drop them or change the tokenizer type"
            )
        per_split = self.train_data_path or self.valid_data_path or self.test_data_path
        if self.data_path and per_split:
            raise ConfigError("--data-path and --train/valid/test-data-path are mutually exclusive; use one form")
        if per_split and not self.train_data_path:
            raise ConfigError("--valid-data-path/--test-data-path need --train-data-path")
        if self.mock_data and (self.data_path or per_split):
            raise ConfigError("--mock-data and a data path are mutually exclusive; drop one")


CHECKPOINT_FORMATS = {
    "torch": "Megatron-LM's legacy format (one file per rank, loadable only under the layout that wrote it)",
    "torch_dcp": "PyTorch's own distributed checkpoint, not Megatron-Core's",
    "fsdp_dtensor": "Megatron-FSDP's format (this project does not use FSDP)",
}
"""Megatron-LM's other ``--ckpt-format`` values and why they are refused."""


@dataclass(frozen=True, kw_only=True)
class RunArgs(_Options):
    train_iters: int = opt(10, "Optimizer steps to train (or give --train-samples).", env="TRAIN_ITERS", minimum=0)
    train_samples: int | None = opt(
        None,
        "Samples (sequences) to train on, instead of --train-iters: the iterations follow from the global batch "
        "and its ramp-up, and the --lr-*-samples flags give the schedule.",
        minimum=1,
    )
    log_interval: int = opt(1, "Log every this many iterations.", env="LOG_INTERVAL", minimum=1)
    eval_interval: int = opt(
        0, "Evaluate every this many iterations (0: only at the end if --eval-iters).", env="EVAL_INTERVAL", minimum=0
    )
    eval_iters: int = opt(0, "Batches per evaluation (0 disables evaluation).", env="EVAL_ITERS", minimum=0)
    save: str | None = opt(None, "Directory to save checkpoints into.")
    load: str | None = opt(None, "Directory to load a checkpoint from.")
    save_interval: int = opt(0, "Save every this many iterations (0: only at the end).", env="SAVE_INTERVAL", minimum=0)
    exit_interval: int = opt(
        0, "Save a checkpoint and stop (exit code 75) after an iteration divisible by this (0: never).", minimum=0
    )
    exit_duration_in_mins: float | None = opt(
        None, "Save and stop (exit code 75) once the longest-running rank has trained this many minutes.", minimum=0
    )
    exit_signal_handler: bool = opt(
        False, "On SIGTERM, SIGUSR1 or SIGUSR2: finish the iteration, save, stop with exit code 75."
    )
    async_save: bool = opt(
        False,
        "Write checkpoints in the background (Megatron-Core's async dist-checkpointing); the tracker "
        "names a checkpoint only once its files are complete.",
    )
    keep_last_checkpoints: int = opt(0, "Keep only the newest K complete checkpoints under --save (0: all).", minimum=0)
    strict_load: bool = opt(
        False,
        "Fail when --load holds no checkpoint instead of starting fresh.",
        aliases=["--exit-on-missing-checkpoint"],
    )
    max_consecutive_skipped: int = opt(
        3,
        "Tolerate this many non-finite losses in a row (fp16: overflows at the minimum loss scale); one more "
        "stops the run with an error (exit code 4).",
        minimum=0,
    )
    no_load_optim: bool = opt(False, "Do not load optimizer state from --load.")
    manual_gc: bool = opt(
        False,
        "Turn Python's garbage collector off and collect at set points instead, so that ranks do not pause at "
        "different times.",
    )
    manual_gc_interval: int = opt(
        0, "With --manual-gc: collect every this many iterations (0: only at start and around evaluations).", minimum=0
    )
    no_manual_gc_eval: bool = opt(
        False, "With --manual-gc: do not collect around evaluations.", aliases=["--disable-manual-gc-eval"]
    )
    empty_unused_memory_level: int = opt(
        0,
        "Release PyTorch's cached GPU memory: 1 after each forward-backward, 2 also after each optimizer step.",
        choices=[0, 1, 2],
    )
    ckpt_format: str = opt(
        "torch_dist",
        "Checkpoint format: torch_dist (Megatron-Core's distributed checkpoint, loadable under any layout) is the "
        "one written and read here.",
    )
    dist_ckpt_optim_fully_reshardable: bool = opt(
        False,
        "Save the distributed optimizer's state per parameter, loadable under any TP, PP, VP and DP; it is "
        "gathered over the data-parallel ranks at every save. Default (Megatron-LM's): each rank writes its "
        "own shard in parallel, loadable under another DP only.",
    )
    distrib_optim_fully_reshardable_mem_efficient: bool = opt(
        False, "With --dist-ckpt-optim-fully-reshardable: gather on one rank over gloo (less memory, slower)."
    )
    override_opt_param_scheduler: bool = opt(
        False,
        "On --load, take the learning-rate schedule from this run's flags, not from the checkpoint.",
        flag="--override-opt_param-scheduler",
        aliases=["--override-opt-param-scheduler"],
    )
    use_checkpoint_opt_param_scheduler: bool = opt(
        False,
        "On --load, keep the checkpoint's learning-rate schedule whatever this run's flags say. Without "
        "either flag a schedule that differs from the checkpoint's is an error.",
        flag="--use-checkpoint-opt_param-scheduler",
        aliases=["--use-checkpoint-opt-param-scheduler"],
    )
    no_checkpoint_checksums: bool = opt(
        False, "Do not compute (on save) or verify (on load) the CRC-32 of every checkpoint file."
    )
    no_load_rng: bool = opt(False, "Do not load RNG state from --load.")
    finetune: bool = opt(False, "Load only the model from --load and start at iteration 0.")
    overwrite_checkpoints: bool = opt(
        False,
        "Start even though --load or --save holds finished checkpoints this run cannot account for (no tracker, "
        "or checkpoints beyond the iteration it starts from), replacing them as training reaches their "
        "iterations. Without it such a run stops before training and says what it found.",
    )
    accept_tokenizer_change: bool = opt(
        False,
        "Resume (or --finetune) from a checkpoint trained with another tokenizer: the checkpoint records its "
        "tokenizer's SHA-256, and a different one is refused without this flag.",
    )
    accept_data_change: bool = opt(
        False,
        "Resume from a checkpoint on other training data: the checkpoint records every dataset's index "
        "SHA-256, the blend's weights and --split, and a difference is refused without this flag.",
    )
    tensorboard_dir: str | None = opt(None, "Write TensorBoard scalars here.", env="TENSORBOARD_DIR")
    log_params_norm: bool = opt(
        False,
        "Log the L2 norm of the model's weights at every logged iteration (each weight counted once: the same "
        "under any layout).",
    )
    metrics_file: str | None = opt(
        None, "Append one JSON object per logged iteration (JSON Lines).", env="METRICS_FILE"
    )
    timeline: str | None = opt(
        None,
        "Write the start and end of every forward and backward pass of every rank, for the last few steps, "
        "to this JSON file (a Chrome trace: chrome://tracing or Perfetto; tools/plot_schedule.py --timeline).",
        env="TIMELINE",
    )
    straggler_margin: float = opt(
        0.1,
        "Name a rank as a straggler, in the log and the metrics file, when its compute time per microbatch "
        "exceeds the median of the other ranks of its pipeline stage by more than this fraction in "
        "--straggler-windows consecutive log windows.",
        above=0,
    )
    straggler_windows: int = opt(
        3,
        "Consecutive log windows a rank must be slower than its peers by --straggler-margin before it is named "
        "as a straggler.",
        minimum=1,
    )
    profile: bool = opt(
        False,
        "Profile iterations --profile-step-start+1 to --profile-step-end on --profile-ranks: CUDA profiler API and "
        "NVTX ranges for nsys (GPU), or PyTorch's profiler with --use-pytorch-profiler.",
    )
    use_pytorch_profiler: bool = opt(
        False, "With --profile: PyTorch's profiler, one trace per profiled rank in --tensorboard-dir (CPU too)."
    )
    profile_step_start: int = opt(10, "With --profile: iterations done before the first profiled one.", minimum=0)
    profile_step_end: int = opt(12, "With --profile: the last profiled iteration.", minimum=1)
    profile_ranks: tuple[int, ...] = opt((0,), "With --profile: the global ranks to profile.")
    record_memory_history: bool = opt(
        False,
        "Record CUDA allocations from the start; the last rank writes a snapshot to --memory-snapshot-path at "
        "every logged iteration (GPU).",
    )
    memory_snapshot_path: str = opt("snapshot.pickle", "With --record-memory-history: the snapshot file.")
    dry_run: bool = opt(False, "Validate and print the plan; create no process group; exit 0 if valid.")
    device: str = opt(
        "auto", "Where to run: cuda, cpu, or auto (cuda when available).", choices=["auto", "cuda", "cpu"], env="DEVICE"
    )
    distributed_timeout_minutes: int = opt(
        10,
        "Timeout of collective operations: how long ranks wait for a peer that died without closing its "
        "connections (a lost node) before the run fails.",
        env="COLLECTIVE_TIMEOUT_MINUTES",
        minimum=1,
    )
    timing_log_level: int = opt(
        0,
        "Megatron-Core timers: 0 none, 1 the step (forward-backward, optimizer), 2 also every microbatch's "
        "forward/backward compute and pipeline send/receive waits, which gives the measured pipeline bubble "
        "(synchronises the GPU around each; costs a little speed).",
        choices=[0, 1, 2],
    )

    def _relations(self) -> None:
        self._profile_relations()
        if (self.manual_gc_interval or self.no_manual_gc_eval) and not self.manual_gc:
            raise ConfigError("--manual-gc-interval and --no-manual-gc-eval apply only with --manual-gc")
        if self.ckpt_format != "torch_dist":
            why = CHECKPOINT_FORMATS.get(self.ckpt_format, "not a checkpoint format Megatron-LM knows")
            raise ConfigError(
                f"--ckpt-format {self.ckpt_format}: {why}; this project saves and loads torch_dist checkpoints "
                "(drop the flag or give torch_dist)"
            )

    def _profile_relations(self) -> None:
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        profiling = ("use_pytorch_profiler", "profile_step_start", "profile_step_end", "profile_ranks")
        changed = [f"--{n.replace('_', '-')}" for n in profiling if getattr(self, n) != defaults[n]]
        if changed and not self.profile:
            raise ConfigError(f"{', '.join(changed)} apply only with --profile")
        if self.memory_snapshot_path != defaults["memory_snapshot_path"] and not self.record_memory_history:
            raise ConfigError("--memory-snapshot-path applies only with --record-memory-history")
        if self.profile and self.profile_step_end <= self.profile_step_start:
            raise ConfigError(
                f"--profile-step-end {self.profile_step_end} must be after --profile-step-start "
                f"{self.profile_step_start}"
            )
        if self.use_pytorch_profiler and self.tensorboard_dir is None:
            raise ConfigError("--use-pytorch-profiler writes its traces into --tensorboard-dir; give one")
        if self.device == "cpu" and self.profile and not self.use_pytorch_profiler:
            raise ConfigError("--profile without --use-pytorch-profiler needs a GPU (nsys); add --use-pytorch-profiler")
        if self.device == "cpu" and self.record_memory_history:
            raise ConfigError("--record-memory-history records CUDA allocations; it needs a GPU")


@dataclass(frozen=True, kw_only=True)
class TrainingConfig:
    """The whole, validated configuration of one run."""

    model: ModelArgs
    parallel: ParallelArgs
    batch: BatchArgs
    optim: OptimizerArgs
    data: DataArgs
    run: RunArgs
    layout: ParallelLayout
    adjustments: tuple[str, ...] = ()
    """Flags changed the way Megatron-LM changes them, each with why (printed by the run and by --dry-run)."""
    tokenizer_vocab_size: int | None = None
    """The tokenizer's vocabulary before padding (filled in by ``data.preflight``; None: the null tokenizer's)."""
    checkpoint_padded_vocab_size: int | None = None
    """The padded vocabulary of the checkpoint under ``--load``, kept instead of this run's padding
    (``training.checkpointing.keep_checkpoint_vocabulary``): the padding depends on TP, and rows the
    checkpoint does not have would enter every softmax with fresh random weights."""

    @property
    def padded_vocab_size(self) -> int:
        """The checkpoint's padded vocabulary when resuming, else the vocabulary padded to a multiple of
        make_vocab_size_divisible_by × TP (Megatron)."""
        if self.checkpoint_padded_vocab_size is not None:
            return self.checkpoint_padded_vocab_size
        return pad_vocab_size(
            self.vocab_size,
            self.model.make_vocab_size_divisible_by,
            self.layout.tensor_model_parallel_size,
        )

    @property
    def vocab_size(self) -> int:
        """Unpadded vocabulary: the tokenizer's (the null tokenizer adds one id, end of document)."""
        if self.tokenizer_vocab_size is not None:
            return self.tokenizer_vocab_size
        return (self.model.vocab_size or 0) + 1


def pad_vocab_size(vocab_size: int, divisible_by: int, tensor_parallel: int) -> int:
    multiple = divisible_by * tensor_parallel
    return ((vocab_size + multiple - 1) // multiple) * multiple


GROUPS: dict[str, type] = {
    "model": ModelArgs,
    "parallel": ParallelArgs,
    "batch": BatchArgs,
    "optim": OptimizerArgs,
    "data": DataArgs,
    "run": RunArgs,
}


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        description="Pretrain a GPT with Megatron-Core (TP × interleaved PP × DP).",
        allow_abbrev=False,
    )
    for group_name, cls in GROUPS.items():
        group = parser.add_argument_group(group_name, cls.__doc__)
        if cls is ModelArgs:
            group.add_argument(
                "--model",
                dest=_PRESET,
                default=argparse.SUPPRESS,
                choices=list(PRESETS),
                help="A model preset: expands to its shape flags; flags given after --model override them.",
            )
        add_options(group, cls, dataclasses.fields(cls), dest=group_name + ".{name}")
    return parser


_PRESET = "preset"


def preset_argv(name: str) -> list[str]:
    """The pretrain_gpt.py flags of preset ``name`` (``--model NAME`` expands to these)."""
    shape = ModelArgs(**get_preset(name).model_flags())
    return to_argv(shape, always=("num_layers", "hidden_size", "num_attention_heads", "seq_length", "vocab_size"))


def expand_preset(argv: Sequence[str]) -> list[str]:
    """``argv`` with ``--model NAME`` replaced by the preset's flags, placed first so later flags win."""
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre.add_argument("--model", choices=list(PRESETS))
    known, rest = pre.parse_known_args(list(argv))
    return [*preset_argv(known.model), *rest] if known.model else list(argv)


def parse_args(argv: Sequence[str], *, world_size: int | None = None, default_world_size: int = 1) -> TrainingConfig:
    """Parse and validate (pure, see ``make_config``). Raises ConfigError or LayoutError with every problem named."""
    parser = build_parser()
    namespace, extras = parser.parse_known_args(expand_preset(argv))
    refused, unknown = split_unknown(extras)
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if refused:
        raise ConfigError(
            "Megatron-LM flags this project refuses (every Megatron-LM flag and what happens to it: "
            "docs/megatron-lm-flags.md):\n" + "\n".join(f"  {flag}: {why}" for flag, why in refused)
        )
    given: dict[str, dict[str, Any]] = {name: {} for name in GROUPS}
    for dest, value in vars(namespace).items():
        if dest == _PRESET:
            continue
        group, name = dest.split(".", 1)
        given[group][name] = tuple(value) if isinstance(value, list) else value
    return make_config(world_size=world_size, default_world_size=default_world_size, **given)


LAYOUT_FLAGS = frozenset(
    {f.name for f in dataclasses.fields(ParallelArgs)}
    & (
        {f.name for f in dataclasses.fields(ParallelLayout)} - {"world_size"}
        | {"num_layers_per_virtual_pipeline_stage"}
    )
)
"""The ParallelArgs the layout takes, by name: a new layout flag is a field of both and flows through."""


def layout_args(
    layout: ParallelLayout, *, overlap_grad_reduce: bool = False, overlap_param_gather: bool = False
) -> ParallelArgs:
    """The ParallelArgs that give ``layout`` (and the overlap switches, which are not layout).

    VP is spelled as layers per virtual stage when the split is even (every Megatron-LM version knows that
    flag), as virtual stages per rank when it is not, and not at all with a layout string (which sets it).
    """
    from_layout = {name: getattr(layout, name) for name in LAYOUT_FLAGS if hasattr(layout, name)}
    per_chunk = layout.layers_per_virtual_stage if layout.interleaved and not layout.uneven else None
    if per_chunk is not None or layout.pipeline_model_parallel_layout is not None:
        from_layout["virtual_pipeline_model_parallel_size"] = None
    return ParallelArgs(
        **from_layout,
        num_layers_per_virtual_pipeline_stage=per_chunk,
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


def megatron_lm_adjustments(parallel: ParallelArgs) -> tuple[ParallelArgs, tuple[str, ...]]:
    """The flags Megatron-LM's ``validate_args`` changes instead of refusing, changed the same way, each with why
    (``pretrain_gpt.py`` and the calculator)."""
    notes = []
    if parallel.sequence_parallel and parallel.tensor_model_parallel_size == 1:
        # Megatron-LM's Llama examples rely on it: --sequence-parallel is given whatever the TP.
        parallel = dataclasses.replace(parallel, sequence_parallel=False)
        notes.append("--sequence-parallel turned off: it needs tensor parallelism, and TP is 1 (as Megatron-LM)")
    return parallel, tuple(notes)


def build_layout(
    model: ModelArgs, parallel: ParallelArgs, batch: BatchArgs, *, world_size: int, gpus_per_node: int | None = None
) -> ParallelLayout:
    """The layout of these flags (LayoutError if invalid): pretrain_gpt.py, --dry-run and the calculator build it here."""
    flags = {name: getattr(parallel, name) for name in LAYOUT_FLAGS}
    return ParallelLayout.from_flags(
        world_size=world_size,
        **flags,
        micro_batch_size=batch.micro_batch_size,
        global_batch_size=batch.global_batch_size,
        **model_layout_facts(model),
        gpus_per_node=gpus_per_node,
    )


def make_config(
    *, world_size: int | None = None, default_world_size: int = 1, **groups: dict[str, Any]
) -> TrainingConfig:
    """Build a TrainingConfig from per-group keyword dicts (as parse_args does). Pure: no files, no environment.

    The world size is ``world_size``, else ``--world-size``, else ``default_world_size`` (the launcher's
    ``WORLD_SIZE``, which the caller reads). The tokenizer's vocabulary is filled in by
    ``megatron_ext.data.preflight``, which opens the files.
    """
    data_given = groups.get("data", {})
    if "tokenizer_type" not in data_given and data_given.get("vocab_file") and data_given.get("merge_file"):
        # What Megatron-LM's GPT examples mean by giving only the two files.
        groups = {**groups, "data": {**data_given, "tokenizer_type": "GPT2BPETokenizer"}}
    built = {name: cls(**groups.get(name, {})) for name, cls in GROUPS.items()}
    model: ModelArgs = built["model"]
    parallel: ParallelArgs = built["parallel"]
    batch: BatchArgs = built["batch"]
    optim: OptimizerArgs = built["optim"]
    run: RunArgs = built["run"]
    data: DataArgs = built["data"]

    if world_size is None:
        world_size = parallel.world_size or default_world_size
    if parallel.overlap_param_gather and not parallel.use_distributed_optimizer:
        raise ConfigError("--overlap-param-gather needs --use-distributed-optimizer")
    if not data.mock_data and not data.data_path and not data.train_data_path:
        raise ConfigError("no training data: give --mock-data or --data-path PREFIX [...]")
    if data.mock_data and model.vocab_size is None and data.tokenizer_type == "NullTokenizer":
        model = dataclasses.replace(model, vocab_size=1023)
    if run.override_opt_param_scheduler and run.use_checkpoint_opt_param_scheduler:
        raise ConfigError(
            "--override-opt_param-scheduler and --use-checkpoint-opt_param-scheduler contradict each other; give one"
        )
    if run.distrib_optim_fully_reshardable_mem_efficient and not run.dist_ckpt_optim_fully_reshardable:
        raise ConfigError(
            "--distrib-optim-fully-reshardable-mem-efficient only applies with --dist-ckpt-optim-fully-reshardable"
        )
    problems = schedule.unit_problems(optim, run, batch, train_iters_given="train_iters" in groups.get("run", {}))
    if problems:
        raise ConfigError("; ".join(problems))

    if parallel.context_parallel_size > 1 and (model.transformer_impl == "local" or run.device == "cpu"):
        why = "--transformer-impl local" if model.transformer_impl == "local" else "--device cpu"
        raise context_parallel_refusal(parallel.context_parallel_size, f"which {why} does not build")
    parallel, adjustments = megatron_lm_adjustments(parallel)
    layout = build_layout(model, parallel, batch, world_size=world_size)
    batch = dataclasses.replace(batch, global_batch_size=layout.global_batch_size)
    problems = schedule.ramp_problems(batch, layout)
    if problems:
        raise ConfigError("\n".join(problems))
    if run.train_samples is not None:
        run = dataclasses.replace(run, train_iters=schedule.training_iterations(run, batch, layout))
    problems = schedule.lr_problems(schedule.lr_steps(optim, run, layout.global_batch_size))
    if problems:
        raise ConfigError("; ".join(problems))
    return TrainingConfig(
        adjustments=adjustments,
        model=model,
        parallel=parallel,
        batch=batch,
        optim=optim,
        data=data,
        run=run,
        layout=layout,
    )

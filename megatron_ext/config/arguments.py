"""The argument groups of ``pretrain_gpt.py``: Megatron-LM's flag names, one frozen dataclass per group.

Every option is a field of one of these dataclasses (``OptimizerArgs`` is in
``optimizer_args.py``, ``DataArgs`` in ``data_args.py``, ``RunArgs``, the run's
files and behaviour, in ``run_args.py``); the field's ``help`` metadata is
its ``--help`` text and the flag is the field name with dashes (Megatron-LM's
spelling). A group checks its own values on creation; ``training_config``
combines the groups into one frozen ``TrainingConfig``. Nothing reads
process-wide globals.
"""

from __future__ import annotations

from dataclasses import dataclass

from megatron_ext.config.flags import bound_problems, opt


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


def parse_window(text: str) -> tuple[int, int]:
    """``--window-size`` text as Megatron-LM's ``tuple_type`` reads it ("4095,0" or "(4095,0)") → (left, right)."""
    try:
        left, right = (int(part) for part in text.strip().strip("()").split(","))
    except ValueError:
        raise ConfigError(
            f"--window-size {text!r} is not LEFT,RIGHT (two integers, e.g. 4095,0 for a 4096-token window)"
        ) from None
    if left < -1 or right < -1:
        raise ConfigError(f"--window-size {text!r}: each side is a token count, or -1 for unbounded")
    return left, right


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
    use_rope_scaling: bool = opt(
        False,
        "Llama 3.x's rope scaling (Megatron-Core's: low/high frequency factors 1 and 4, original context 8192, "
        "scaled by --rope-scaling-factor), applied once to the rotary frequencies; with --position-embedding-type "
        "rope.",
    )
    rope_scaling_factor: float = opt(
        8.0,
        "The factor of --use-rope-scaling: 8 for Llama 3.1, 32 for Llama 3.2. Passed to Megatron-Core's rotary "
        "embedding, as Megatron-LM after 0.16.1 does (0.16.1's GPT builder left it at 8).",
        above=0,
    )
    rotary_seq_len_interpolation_factor: int | None = opt(
        None,
        "Linear position interpolation of the rotary embedding: every position divided by this factor (Megatron-Core's "
        "seq_len_interpolation_factor, transformers' linear rope scaling); with --position-embedding-type rope.",
        minimum=1,
    )
    swiglu: bool = opt(False, "Use a SwiGLU MLP (gated SiLU) instead of GeLU.", estimate=True)
    squared_relu: bool = opt(False, "MLP activation relu(x)² instead of GeLU (not with --swiglu).")
    openai_gelu: bool = opt(
        False,
        "The GeLU MLP's activation is the tanh approximation (Megatron-Core's openai_gelu, GPT-2's gelu_new) instead "
        "of the exact (erf) GeLU; not with --swiglu or --squared-relu. Megatron-LM reads it in its legacy models only.",
    )
    qk_layernorm: bool = opt(
        False, "Normalize each head's queries and keys (the --normalization type) before the attention scores."
    )
    attention_softmax_in_fp32: bool = opt(
        False,
        "Run Megatron-Core's attention softmax in fp32 with bf16/fp16 (--attention-backend local's unfused path; "
        "the fused kernels and PyTorch's and Transformer Engine's attention choose their own precision).",
    )
    apply_query_key_layer_scaling: bool = opt(
        False,
        "Scale the attention scores by 1/layer number before the softmax and back inside it (an fp16 overflow "
        "guard of Megatron-Core's local attention; the result is unchanged); forces the softmax into fp32.",
    )
    normalization: str = opt("LayerNorm", "Normalization layer.", choices=["LayerNorm", "RMSNorm"], estimate=True)
    norm_epsilon: float = opt(1e-5, "Epsilon of the normalization layers.", above=0)
    apply_layernorm_1p: bool = opt(
        False, "Zero-centred norm weights: each norm stores gamma − 1, starting at 0, and scales by weight + 1."
    )
    untie_embeddings_and_output_weights: bool = opt(
        False, "Separate input embedding and output layer weights.", estimate=True
    )
    disable_bias_linear: bool = opt(False, "No bias in the linear layers.", estimate=True)
    add_qkv_bias: bool = opt(
        False,
        "A bias on the query, key and value projections even with --disable-bias-linear (Qwen2's attention); "
        "the linear layers' biases include it otherwise, as in Megatron-LM.",
        estimate=True,
    )
    window_size: str | None = opt(
        None,
        "Sliding-window attention as Megatron-LM writes it, LEFT,RIGHT (4095,0: each token sees itself and the "
        "4095 before it; -1: unbounded). Taken where the window covers --seq-length (full causal attention, as a "
        "Mistral imported to train within its window); a shorter one is refused: Megatron-Core's local attention "
        "builds the window's mask on CUDA only, and its fused softmax ignores it.",
    )
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
    cross_entropy_fusion_impl: str = opt(
        "native",
        "The kernel --cross-entropy-loss-fusion runs: Megatron-Core's native one. te (Transformer Engine's) is "
        "refused with it, as Megatron-LM refuses it (stability issues), and does nothing without it.",
        choices=["native", "te"],
    )
    no_bias_gelu_fusion: bool = opt(
        False,
        "Do not fuse bias and GeLU (fused on GPU by default, as in Megatron-LM). Megatron-Core's fused bias-GeLU is "
        "the tanh approximation: without it GeLU on GPU is exact, as on CPU.",
    )
    no_bias_swiglu_fusion: bool = opt(False, "Do not fuse bias and SwiGLU (fused on GPU by default).")
    no_bias_dropout_fusion: bool = opt(False, "Do not fuse bias, dropout and residual add (fused on GPU by default).")
    no_masked_softmax_fusion: bool = opt(
        False, "Do not use Megatron-Core's fused attention-softmax kernels (apex's; used on GPU when installed)."
    )
    no_rope_fusion: bool = opt(False, "Do not fuse the rotary embedding (Transformer Engine's kernel).")
    no_clone_scatter_output_in_embedding: bool = opt(
        False,
        "Keep the embedding's sequence-parallel scatter as a view instead of a copy (Megatron-Core).",
        aliases=("--disable-clone-scatter-output-in-embedding",),
    )
    no_gradient_accumulation_fusion: bool = opt(
        False,
        "Do not fuse the weight-gradient GEMM with its accumulation into the fp32 gradient buffer (Transformer "
        "Engine's or apex's kernel).",
    )

    @property
    def local_spec_flag(self) -> str | None:
        """The flag that builds Megatron-Core's own layers (the local spec) whatever the machine, or None:
        ``--transformer-impl local``, or ``--attention-backend local`` (Megatron-Core's own attention, which only the
        local spec has). Where it is None, a GPU with Transformer Engine builds Transformer Engine's layers."""
        if self.transformer_impl == "local":
            return "--transformer-impl local"
        return "--attention-backend local" if self.attention_backend == "local" else None

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

    @property
    def window_left(self) -> int | None:
        """The tokens before each one that its attention sees with --window-size (None: unbounded)."""
        if self.window_size is None:
            return None
        left = parse_window(self.window_size)[0]
        return None if left < 0 else left

    @property
    def context_length(self) -> int:
        """The most tokens one forward pass may attend over as trained: the positions, within the window."""
        positions = self.max_position_embeddings or self.seq_length
        left = self.window_left
        return positions if left is None else min(positions, left + 1)

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
        if self.cross_entropy_loss_fusion and self.cross_entropy_fusion_impl == "te":
            raise ConfigError(
                "--cross-entropy-fusion-impl te with --cross-entropy-loss-fusion: Transformer Engine's fused cross "
                "entropy has known stability issues and Megatron-LM refuses it; give --cross-entropy-fusion-impl "
                "native, or omit --cross-entropy-loss-fusion"
            )
        if self.squared_relu and self.swiglu:
            raise ConfigError("--squared-relu and --swiglu each set the MLP's activation; give one (as Megatron-LM)")
        if self.openai_gelu and (self.swiglu or self.squared_relu):
            other = "--swiglu" if self.swiglu else "--squared-relu"
            raise ConfigError(f"--openai-gelu approximates a GeLU MLP's activation and {other} replaces it; give one")
        if self.window_size is not None:
            left = parse_window(self.window_size)[0]  # ConfigError for text that is no window
            if 0 <= left < self.seq_length - 1:
                raise ConfigError(
                    f"--window-size {self.window_size}: a sliding window of {left + 1} tokens is shorter than "
                    f"--seq-length {self.seq_length}, and Megatron-Core's local attention has no sliding window here "
                    "(its mask is built on CUDA only, and its fused softmax ignores it); train at --seq-length "
                    f"{left + 1} or less, where the window covers every sequence"
                )
        for name in ("use_rope_scaling", "rotary_seq_len_interpolation_factor"):
            if getattr(self, name) not in (False, None) and self.position_embedding_type != "rope":
                flag = "--" + name.replace("_", "-")
                raise ConfigError(f"{flag} scales the rotary embedding: give --position-embedding-type rope")
        if self.transformer_impl == "transformer_engine" and self.attention_backend == "local":
            raise ConfigError(
                "--attention-backend local is Megatron-Core's attention of the local spec and contradicts "
                "--transformer-impl transformer_engine; use --transformer-impl local (or auto), or another backend"
            )


@dataclass(frozen=True, kw_only=True)
class ParallelArgs(_Options):
    """How the model and the batch are split over processes."""

    tensor_model_parallel_size: int = opt(
        1,
        "Tensor-parallel size (keep it within a node).",
        estimate=True,
        short="--tp",
        env="TP",
        minimum=1,
        layout=True,
    )
    pipeline_model_parallel_size: int = opt(
        1,
        "Pipeline-parallel size (stages across nodes).",
        estimate=True,
        short="--pp",
        env="PP",
        minimum=1,
        layout=True,
    )
    context_parallel_size: int = opt(
        1,
        "Context-parallel size: ranks that split every sequence (ring attention over their keys and values); needs "
        "Transformer Engine's attention.",
        estimate=True,
        short="--cp",
        env="CP",
        minimum=1,
        layout=True,
    )
    num_layers_per_virtual_pipeline_stage: int | None = opt(
        None,
        "Layers per virtual stage (even splits only): turns on the interleaved 1F1B schedule.",
        estimate=True,
        minimum=1,
        layout=True,
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
        layout=True,
    )
    decoder_first_pipeline_num_layers: int | None = opt(
        None,
        "Transformer layers on the first pipeline stage (the other stages share the rest evenly).",
        estimate=True,
        env="FIRST_STAGE_LAYERS",
        minimum=1,
        layout=True,
    )
    decoder_last_pipeline_num_layers: int | None = opt(
        None,
        "Transformer layers on the last pipeline stage (the other stages share the rest evenly).",
        estimate=True,
        env="LAST_STAGE_LAYERS",
        minimum=1,
        layout=True,
    )
    account_for_embedding_in_pipeline_split: bool = opt(
        False,
        "Count the embedding as a layer when splitting layers over pipeline stages.",
        estimate=True,
        env="ACCOUNT_FOR_EMBEDDING",
        layout=True,
    )
    account_for_loss_in_pipeline_split: bool = opt(
        False,
        "Count the output layer and loss as a layer when splitting layers over pipeline stages.",
        estimate=True,
        env="ACCOUNT_FOR_LOSS",
        layout=True,
    )
    pipeline_model_parallel_layout: str | None = opt(
        None,
        'Megatron-Core layout string placing every layer, e.g. "Et*3|(t*4|)*30,t*3L" (E embedding, '
        "t transformer layer, L loss, | between virtual stages); sets VP.",
        estimate=True,
        env="PIPELINE_LAYOUT",
        layout=True,
    )
    microbatch_group_size_per_vp_stage: int | None = opt(
        None,
        "Interleaved 1F1B: microbatches run through one virtual stage before the next (default PP).",
        flag="--microbatch-group-size-per-virtual-pipeline-stage",
        estimate=True,
        env="MICROBATCH_GROUP_SIZE",
        minimum=1,
        layout=True,
    )
    sequence_parallel: bool = opt(
        False,
        "Sequence parallelism in the TP regions (needs TP > 1).",
        estimate=True,
        env="SEQUENCE_PARALLEL",
        layout=True,
    )
    use_distributed_optimizer: bool = opt(
        False,
        "Shard optimizer state over data-parallel ranks.",
        estimate=True,
        env="DISTRIBUTED_OPTIMIZER",
        layout=True,
    )
    tp_comm_overlap: bool = opt(
        False,
        "Overlap tensor-parallel communication with the GEMMs (Transformer Engine's userbuffers; needs "
        "--sequence-parallel and TE's layers on GPUs).",
        estimate=True,
    )
    tp_comm_bootstrap_backend: str = opt(
        "nccl", "With --tp-comm-overlap: how the userbuffers are set up.", choices=["nccl", "mpi", "gloo"]
    )
    no_tp_comm_overlap_ag: bool = opt(
        False,
        "With --tp-comm-overlap: do not overlap the all-gathers with their GEMMs.",
        aliases=("--disable-tp-comm-overlap-ag",),
    )
    no_tp_comm_overlap_rs: bool = opt(
        False,
        "With --tp-comm-overlap: do not overlap the reduce-scatters with their GEMMs.",
        aliases=("--disable-tp-comm-overlap-rs",),
    )
    no_tp_comm_split_ag: bool = opt(
        False,
        "With --tp-comm-overlap: do not split the all-gather overlap into pipelined chunks (atomic otherwise).",
        aliases=("--disable-tp-comm-split-ag",),
    )
    no_tp_comm_split_rs: bool = opt(
        False,
        "With --tp-comm-overlap: do not split the reduce-scatter overlap into pipelined chunks (atomic otherwise).",
        aliases=("--disable-tp-comm-split-rs",),
    )
    no_tp_comm_bulk_dgrad: bool = opt(
        False,
        "With --tp-comm-overlap: do not overlap the input gradient's all-gather with the weight-gradient GEMM in bulk.",
        aliases=("--disable-tp-comm-bulk-dgrad",),
    )
    no_tp_comm_bulk_wgrad: bool = opt(
        False,
        "With --tp-comm-overlap: do not overlap the weight gradient's reduce-scatter with the input-gradient GEMM in bulk.",
        aliases=("--disable-tp-comm-bulk-wgrad",),
    )
    tp_comm_overlap_rs_dgrad: bool = opt(
        False, "With --tp-comm-overlap: overlap the input gradient's reduce-scatter with its GEMM."
    )
    tp_comm_overlap_cfg: str | None = opt(
        None, "With --tp-comm-overlap: a YAML file of Transformer Engine userbuffer settings by GEMM (ub_cfgs)."
    )
    defer_embedding_wgrad_compute: bool = opt(
        False,
        "The output layer's weight-gradient GEMMs wait until the last stage's final backward pass, and run while the "
        "other stages drain the pipeline (Megatron-Core). Needs PP > 1, the fused weight-gradient GEMMs (no "
        "--no-gradient-accumulation-fusion), a GPU and apex's fused weight-gradient kernel.",
    )
    wgrad_deferral_limit: int = opt(
        0, "With --defer-embedding-wgrad-compute: how many microbatches (the first ones) defer it; 0: all.", minimum=0
    )
    overlap_grad_reduce: bool = opt(False, "Overlap the gradient reduce-scatter with backward.", estimate=True)
    overlap_param_gather: bool = opt(
        False, "Overlap the parameter all-gather with forward (needs the distributed optimizer).", estimate=True
    )
    ddp_bucket_size: int | None = opt(
        None,
        "Parameters per data-parallel gradient bucket (Megatron-Core's default with --overlap-grad-reduce: "
        "max(40M, 1M × DP); without: one bucket).",
        minimum=1,
        estimate=True,
    )
    ddp_num_buckets: int | None = opt(
        None,
        "Gradient buckets per rank instead of --ddp-bucket-size: the rank's parameters / N each.",
        minimum=1,
        estimate=True,
    )
    ddp_average_in_collective: bool = opt(
        False, "Average the gradients inside the reduction collective instead of scaling them before it."
    )
    ddp_pad_buckets_for_high_nccl_busbw: bool = opt(
        False, "Pad each gradient bucket to a size NCCL reduces at high bus bandwidth."
    )
    no_gradient_reduce_div_fusion: bool = opt(
        False, "Scale the gradients in a kernel of their own, not fused into the reduction (NCCL's PreMulSum)."
    )
    no_align_grad_reduce: bool = opt(
        False, "With --overlap-grad-reduce: each pipeline stage starts its gradient reduction on its own."
    )
    no_align_param_gather: bool = opt(
        False, "With --overlap-param-gather and interleaving: each stage starts its parameter all-gathers on its own."
    )
    no_overlap_p2p_communication: bool = opt(
        False,
        "Interleaved schedule: block on each pipeline send and receive (batched) instead of overlapping them with "
        "compute; needs PP > 2, as in Megatron-LM.",
        estimate=True,
    )
    overlap_p2p_communication_warmup_flush: bool = opt(
        False, "Interleaved schedule: overlap the pipeline transfers of the warm-up and flush passes too."
    )
    enable_zero_bubble: bool = opt(
        False,
        "Zero-bubble pipeline schedules (Qi et al., ICLR 2024; their Megatron-LM fork's flag): each backward pass "
        "split into B (input gradients) and W (the linear layers' weight gradients), W passes kept back to fill "
        "the cool-down. One chunk per rank: ZB-H1 (1F1B's memory, about a third of its bubble); with virtual "
        "stages: ZB interleaved (interleaved 1F1B's memory). Needs PP > 1 and the local spec.",
        estimate=True,
    )
    use_tp_pp_dp_mapping: bool = opt(
        False, "Number the ranks TP, then PP, then DP (Megatron-Core's order is TP, CP, DP, PP): DP groups span nodes."
    )
    pipeline_model_parallel_comm_backend: str | None = opt(
        None, "The pipeline groups' backend on GPUs (default: the run's, NCCL).", choices=["nccl", "ucc"]
    )
    world_size: int | None = opt(
        None, "World size for --dry-run (default: $WORLD_SIZE, or 1). Ignored in real runs.", minimum=1
    )

    def _relations(self) -> None:
        if self.overlap_param_gather and not self.use_distributed_optimizer:
            raise ConfigError("--overlap-param-gather needs --use-distributed-optimizer")
        if self.ddp_bucket_size is not None and self.ddp_num_buckets is not None:
            raise ConfigError("give --ddp-bucket-size or --ddp-num-buckets, not both (as Megatron-LM requires)")
        if self.no_overlap_p2p_communication and self.overlap_p2p_communication_warmup_flush:
            raise ConfigError(
                "--overlap-p2p-communication-warmup-flush overlaps pipeline transfers that "
                "--no-overlap-p2p-communication makes blocking; give one"
            )
        if self.tp_comm_overlap and not self.sequence_parallel:
            raise ConfigError(
                "--tp-comm-overlap overlaps sequence parallelism's all-gathers and reduce-scatters: give "
                "--sequence-parallel (as Megatron-LM requires)"
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

"""Megatron-Core GPT: transformer config, layer spec, model chunks and DDP wrapping."""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from megatron_ext.config.arguments import ConfigError, ModelArgs
from megatron_ext.config.emerging_optimizer_args import EMERGING
from megatron_ext.config.layout_flags import context_parallel_refusal, gloo_problem
from megatron_ext.config.training_config import (
    TrainingConfig,
    precision_aware_refusal,
    transformer_engine_features,
    transformer_engine_refusal,
    wgrad_deferral_refusal,
)
from megatron_ext.parallel.layout import ParallelLayout


def params_dtype(cfg: TrainingConfig) -> torch.dtype:
    if cfg.optim.bf16:
        return torch.bfloat16
    if cfg.optim.fp16:
        return torch.float16
    return torch.float32


def use_transformer_engine(cfg: TrainingConfig, device: torch.device) -> bool:
    """TE when asked for, or (auto) on GPU when it is importable; never on CPU."""
    impl = cfg.model.transformer_impl
    available = importlib.util.find_spec("transformer_engine") is not None
    if impl == "transformer_engine":
        if device.type != "cuda":
            raise RuntimeError("--transformer-impl transformer_engine needs a GPU; use local on CPU")
        if not available:
            raise RuntimeError(
                "--transformer-impl transformer_engine: transformer_engine is not importable; "
                "install it or use --transformer-impl local"
            )
        return True
    # Megatron-Core's own attention lives in the local spec only.
    return impl == "auto" and device.type == "cuda" and available and cfg.model.local_spec_flag is None


def check_transformer_engine(cfg: TrainingConfig, device: torch.device) -> None:
    """ConfigError unless this run builds Transformer Engine's layers where the flags need them: context
    parallelism (Megatron-Core's own attention asserts CP 1), FP8 and TP communication overlap; and, where it
    builds them for a zero-bubble schedule, one that defers their weight gradients. The precision-aware optimizer
    needs Transformer Engine installed (its FusedAdam), whatever the layers. A per-document attention mask needs
    Megatron-Core's own attention: Transformer Engine's, built with the causal mask type, ignores a mask tensor.
    Deferring the output layer's weight gradients needs a GPU and apex's kernel, which Megatron-Core's drain calls."""
    if cfg.data.document_attention_mask and use_transformer_engine(cfg, device):
        raise ConfigError(
            "--reset-attention-mask: Transformer Engine's attention (causal mask type) ignores the per-document mask "
            "tensor, so packed documents would attend to each other; give --transformer-impl local (Megatron-Core's "
            "own attention applies it)"
        )
    if cfg.optim.use_precision_aware_optimizer and (
        device.type != "cuda" or importlib.util.find_spec("transformer_engine") is None
    ):
        raise ConfigError(
            precision_aware_refusal(
                "this run is on CPU" if device.type != "cuda" else "Transformer Engine is not installed"
            )
        )
    if cfg.parallel.enable_zero_bubble and use_transformer_engine(cfg, device):
        from megatron.core.utils import get_te_version, is_te_min_version

        if not is_te_min_version("2.3.0"):  # the first with delay_wgrad_compute and backward_dw()
            raise ConfigError(
                f"--enable-zero-bubble defers Transformer Engine's weight gradients (delay_wgrad_compute), which "
                f"needs Transformer Engine 2.3 or newer; {get_te_version()} is installed: upgrade it or give "
                "--transformer-impl local"
            )
    if cfg.parallel.defer_embedding_wgrad_compute and (
        device.type != "cuda" or importlib.util.find_spec("fused_weight_gradient_mlp_cuda") is None
    ):
        raise ConfigError(
            wgrad_deferral_refusal("this run is on CPU" if device.type != "cuda" else "apex's kernel is not installed")
        )
    features = transformer_engine_features(cfg.optim, cfg.parallel)
    if (cfg.layout.cp > 1 or features) and not use_transformer_engine(cfg, device):
        if device.type != "cuda":
            why = "this run is on CPU"
        elif importlib.util.find_spec("transformer_engine") is None:
            why = "Transformer Engine is not installed"
        else:
            why = f"--transformer-impl {cfg.model.transformer_impl} --attention-backend {cfg.model.attention_backend} "
            why += "selects the local spec"
        if cfg.layout.cp > 1:
            raise context_parallel_refusal(cfg.layout.cp, f"and {why}")
        raise ConfigError(transformer_engine_refusal(features, f"and {why}"))


TP_COMM_SWITCHES = ("overlap_ag", "overlap_rs", "split_ag", "split_rs", "bulk_dgrad", "bulk_wgrad")
"""Megatron-Core's ``tp_comm_*`` switches that Megatron-LM's ``--no-tp-comm-*`` (``--disable-tp-comm-*``) turn off."""


def initialize_tp_comm_overlap(cfg: TrainingConfig) -> None:
    """Transformer Engine's userbuffers for ``--tp-comm-overlap``, set up as Megatron-LM does
    (``megatron/training/initialize.py``): one sequence of micro-batches per CP rank, by hidden size, with FP8's
    quantization when it trains in FP8. After the process groups, before the model."""
    if not cfg.parallel.tp_comm_overlap:
        return
    from transformer_engine.pytorch import module as te_module

    shape = [cfg.model.seq_length * cfg.layout.micro_batch_size // cfg.layout.cp, cfg.model.hidden_size]
    kwargs: dict[str, Any] = {
        "shape": shape,
        "tp_size": cfg.layout.tp,
        "ub_cfgs": userbuffer_settings(cfg.parallel.tp_comm_overlap_cfg),
        "bootstrap_backend": cfg.parallel.tp_comm_bootstrap_backend,
    }
    modes = getattr(te_module.base, "UserBufferQuantizationMode", None)
    if modes is not None:  # Transformer Engine 2.7 and later
        kwargs["quantization_modes"] = [modes.FP8 if cfg.optim.fp8_format else modes.NONE]
    else:
        kwargs["use_fp8"] = cfg.optim.fp8_format is not None
    te_module.base.initialize_ub(**kwargs)


def userbuffer_settings(path: str | None) -> dict[str, Any]:
    """``--tp-comm-overlap-cfg``'s YAML (Transformer Engine's ``ub_cfgs``), read as Megatron-LM reads it; ``{}``
    without one. A ConfigError names a file that is missing or not a mapping."""
    if path is None:
        return {}
    import yaml

    try:
        with open(path, encoding="utf-8") as stream:
            settings = yaml.safe_load(stream)
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"--tp-comm-overlap-cfg {path}: {exc}") from None
    if not isinstance(settings, dict):
        raise ConfigError(f"--tp-comm-overlap-cfg {path}: not a YAML mapping of GEMM names to settings")
    return settings


def transformer_config(cfg: TrainingConfig, device: torch.device):  # -> TransformerConfig
    """Megatron-Core's TransformerConfig for this run."""
    from megatron.core.transformer import TransformerConfig

    return TransformerConfig(**transformer_config_arguments(cfg, device))


def transformer_config_arguments(cfg: TrainingConfig, device: torch.device) -> dict[str, Any]:
    """The TransformerConfig's arguments (its checks need the kernels it names, which a CPU machine lacks)."""
    from megatron.core.transformer.enums import AttnBackend

    m, layout, o = cfg.model, cfg.layout, cfg.optim
    on_gpu = device.type == "cuda"
    dtype = params_dtype(cfg)
    te = use_transformer_engine(cfg, device)
    return dict(
        num_layers=m.num_layers,
        hidden_size=m.hidden_size,
        ffn_hidden_size=m.effective_ffn_hidden_size,
        num_attention_heads=m.num_attention_heads,
        num_query_groups=m.effective_num_query_groups,
        kv_channels=m.effective_kv_channels,
        hidden_dropout=m.hidden_dropout,
        attention_dropout=m.attention_dropout,
        init_method_std=m.init_method_std,
        normalization=m.normalization,
        layernorm_epsilon=m.norm_epsilon,
        add_bias_linear=not m.disable_bias_linear,
        add_qkv_bias=m.add_qkv_bias,
        gated_linear_unit=m.swiglu,
        **mlp_activation(m, on_gpu=on_gpu),
        qk_layernorm=m.qk_layernorm,
        # FP8 and TP communication overlap: Transformer Engine's layers (check_transformer_engine refuses others).
        fp8=o.fp8_format,
        fp8_recipe=o.fp8_recipe,
        fp8_margin=o.fp8_margin,
        fp8_interval=o.fp8_interval,
        fp8_amax_history_len=o.fp8_amax_history_len,
        fp8_amax_compute_algo=o.fp8_amax_compute_algo,
        fp8_wgrad=not o.no_fp8_wgrad,
        fp8_param=o.fp8_param_gather,
        tp_comm_overlap=cfg.parallel.tp_comm_overlap,
        # Megatron-LM's switches of the overlap (Transformer Engine reads them only with --tp-comm-overlap).
        **{f"tp_comm_{name}": not getattr(cfg.parallel, f"no_tp_comm_{name}") for name in TP_COMM_SWITCHES},
        tp_comm_overlap_rs_dgrad=cfg.parallel.tp_comm_overlap_rs_dgrad,
        tp_comm_bootstrap_backend=cfg.parallel.tp_comm_bootstrap_backend,
        defer_embedding_wgrad_compute=cfg.parallel.defer_embedding_wgrad_compute,
        wgrad_deferral_limit=cfg.parallel.wgrad_deferral_limit,
        # Megatron-LM's defaults (its argument parser's), not TransformerConfig's own (True for the softmax).
        attention_softmax_in_fp32=m.attention_softmax_in_fp32,
        apply_query_key_layer_scaling=m.apply_query_key_layer_scaling,
        tensor_model_parallel_size=layout.tp,
        pipeline_model_parallel_size=layout.pp,
        context_parallel_size=layout.cp,
        virtual_pipeline_model_parallel_size=layout.vp if layout.interleaved else None,
        # Uneven stages: Megatron-Core places the layers (ParallelLayout.stages predicts the same placement).
        num_layers_in_first_pipeline_stage=layout.decoder_first_pipeline_num_layers,
        num_layers_in_last_pipeline_stage=layout.decoder_last_pipeline_num_layers,
        account_for_embedding_in_pipeline_split=layout.account_for_embedding_in_pipeline_split,
        account_for_loss_in_pipeline_split=layout.account_for_loss_in_pipeline_split,
        pipeline_model_parallel_layout=layout.pipeline_model_parallel_layout,
        microbatch_group_size_per_vp_stage=layout.microbatch_group_size_per_vp_stage,
        sequence_parallel=layout.sequence_parallel,
        params_dtype=dtype,
        pipeline_dtype=dtype,
        bf16=o.bf16,
        fp16=o.fp16,
        recompute_granularity=o.recompute_granularity,
        recompute_method=o.recompute_method,
        recompute_num_layers=o.recompute_num_layers,
        calculate_per_token_loss=o.calculate_per_token_loss,
        # Initialise on the CPU there: the weights are then identical for any TP.
        use_cpu_initialization=not on_gpu,
        # Fused kernels (torch.compile'd by Megatron-Core) on GPU; plain torch ops on CPU.
        bias_dropout_fusion=on_gpu and not m.no_bias_dropout_fusion,
        # Megatron-Core's own attention softmax kernels come with apex; without them
        # the fused path raises instead of falling back.
        masked_softmax_fusion=on_gpu and not m.no_masked_softmax_fusion and _has_softmax_kernels(),
        cross_entropy_loss_fusion=on_gpu and m.cross_entropy_loss_fusion,
        cross_entropy_fusion_impl=m.cross_entropy_fusion_impl,  # te only without the fusion: unused
        # With TE, Megatron-Core turns this into TE's backend switches; the local
        # spec's SDPA kernel choice is made in layer_spec().
        attention_backend=AttnBackend[m.attention_backend] if te else AttnBackend.local,
        # TE's fused rope and its weight-gradient GEMM accumulating into the fp32
        # main_grad buffer; the local spec's versions need apex's CUDA extensions.
        apply_rope_fusion=te and m.position_embedding_type == "rope" and not m.no_rope_fusion,
        persist_layer_norm=False,
        gradient_accumulation_fusion=not m.no_gradient_accumulation_fusion
        and (te or (on_gpu and importlib.util.find_spec("fused_weight_gradient_mlp_cuda") is not None)),
        layernorm_zero_centered_gamma=m.apply_layernorm_1p,
        clone_scatter_output_in_embedding=not m.no_clone_scatter_output_in_embedding,
        # Frees a stage's output right after its (asynchronous) send. Safe with
        # NCCL's stream ordering; gloo reads the buffer later from its own thread,
        # so on CPU the output must live until the send completes.
        deallocate_pipeline_outputs=on_gpu,
        # Megatron-LM: overlapped (unbatched) p2p for the interleaved schedule, else batched and blocking.
        overlap_p2p_comm=overlapped_p2p(cfg),
        batch_p2p_comm=not overlapped_p2p(cfg),
        overlap_p2p_comm_warmup_flush=cfg.parallel.overlap_p2p_communication_warmup_flush,
    )


def mlp_activation(m: ModelArgs, *, on_gpu: bool) -> dict[str, Any]:
    """The TransformerConfig's ``activation_func`` and ``bias_activation_fusion``: each flag's function exactly.

    - ``--swiglu``: SiLU, gated; fused with the bias on GPU unless ``--no-bias-swiglu-fusion``.
    - ``--squared-relu``: relu(x)², never fused (Megatron-Core fuses GeLU and SwiGLU only).
    - ``--openai-gelu``: the tanh approximation, Megatron-Core's ``openai_gelu``. On GPU with a bias, unless
      ``--no-bias-gelu-fusion``, Megatron-Core's fused bias-GeLU computes it instead: that kernel (``bias_gelu``) is
      the same tanh approximation, and Megatron-Core selects it for ``F.gelu`` only.
    - otherwise ``F.gelu``, as Megatron-LM builds it: fused with the bias on GPU unless ``--no-bias-gelu-fusion``
      (Megatron-Core's kernel then computes the tanh approximation, as a Megatron-LM run does), the exact (erf)
      GeLU elsewhere.
    """
    if m.swiglu:
        return {"activation_func": F.silu, "bias_activation_fusion": on_gpu and not m.no_bias_swiglu_fusion}
    if m.squared_relu:
        from megatron.core.activations import squared_relu

        return {"activation_func": squared_relu, "bias_activation_fusion": False}
    if m.openai_gelu:
        if on_gpu and not (m.no_bias_gelu_fusion or m.disable_bias_linear):  # the fused kernel needs a bias
            return {"activation_func": F.gelu, "bias_activation_fusion": True}
        from megatron.core.transformer.utils import openai_gelu

        return {"activation_func": openai_gelu, "bias_activation_fusion": False}
    # The bias-GeLU kernel needs a bias.
    return {
        "activation_func": F.gelu,
        "bias_activation_fusion": on_gpu and not (m.no_bias_gelu_fusion or m.disable_bias_linear),
    }


def _has_softmax_kernels() -> bool:
    return all(
        importlib.util.find_spec(name) is not None
        for name in ("scaled_masked_softmax_cuda", "scaled_upper_triang_masked_softmax_cuda", "scaled_softmax_cuda")
    )


def layer_spec(cfg: TrainingConfig, device: torch.device, *, config: Any, vp_stage: int | None):  # -> ModuleSpec
    """The layers of one model chunk: Megatron-Core's spec, with as many layers as it places on the chunk."""
    from megatron.core.models.gpt.gpt_layer_specs import (
        get_gpt_layer_local_spec,
        get_gpt_layer_with_transformer_engine_spec,
    )
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules, get_num_layers_to_build

    from megatron_ext.training.attention import SDPAttention, sdpa_kernels
    from megatron_ext.training.norms import TorchNorm

    qk_layernorm = cfg.model.qk_layernorm
    if use_transformer_engine(cfg, device):
        te_spec = get_gpt_layer_with_transformer_engine_spec(qk_layernorm=qk_layernorm)
        return (
            _deferring_weight_gradients(te_spec, transformer_engine=True)
            if cfg.parallel.enable_zero_bubble
            else te_spec
        )
    spec = get_gpt_layer_local_spec(normalization=cfg.model.normalization, qk_layernorm=qk_layernorm)
    backend = cfg.model.attention_backend
    if backend != "local":
        # Only the core (softmax(QK^T)V) changes; projections stay Megatron-Core's.
        spec.submodules.self_attention.submodules.core_attention = functools.partial(
            SDPAttention, kernels=sdpa_kernels(backend)
        )
    # PyTorch's norms (fused kernels on GPU), marked for the TP gradient sum of
    # sequence parallelism, whether or not apex is installed: Megatron-Core's
    # fallbacks refuse sequence parallelism (torch) or RMSNorm (apex). The final
    # norm is the block's, so the block is spelled out, with the chunk's layer
    # count from Megatron-Core's own placement (uneven stages included).
    spec.submodules.input_layernorm = TorchNorm
    spec.submodules.pre_mlp_layernorm = TorchNorm
    if qk_layernorm:  # one weight for every head: Megatron-Core sums its gradient over TP (by its name)
        spec.submodules.self_attention.submodules.q_layernorm = TorchNorm
        spec.submodules.self_attention.submodules.k_layernorm = TorchNorm
    if cfg.parallel.enable_zero_bubble:
        spec = _deferring_weight_gradients(spec, transformer_engine=False)
    layers = get_num_layers_to_build(config, vp_stage=vp_stage)
    return TransformerBlockSubmodules(layer_specs=[spec] * layers, layer_norm=TorchNorm)


def _deferring_weight_gradients(spec: Any, *, transformer_engine: bool) -> Any:
    """``spec`` (a transformer layer's) whose QKV, projection, FC1 and FC2 defer their weight gradients to the
    zero-bubble schedule's W passes (``split_backward.deferring``); the same structure in the local and the
    Transformer Engine spec."""
    from megatron_ext.training.split_backward import deferring

    attention = spec.submodules.self_attention.submodules
    attention.linear_qkv = deferring(attention.linear_qkv, transformer_engine=transformer_engine)
    attention.linear_proj = deferring(attention.linear_proj, transformer_engine=transformer_engine)
    mlp = spec.submodules.mlp  # functools.partial(MLP.as_mlp_submodule, submodules=MLPSubmodules(...))
    linears = mlp.keywords["submodules"]
    linears = dataclasses.replace(
        linears,
        linear_fc1=deferring(linears.linear_fc1, transformer_engine=transformer_engine),
        linear_fc2=deferring(linears.linear_fc2, transformer_engine=transformer_engine),
    )
    spec.submodules.mlp = functools.partial(mlp.func, *mlp.args, **(mlp.keywords | {"submodules": linears}))
    return spec


def gpt_model(
    cfg: TrainingConfig,
    *,
    pre_process: bool,
    post_process: bool,
    vp_stage: int | None,
    device: torch.device,
) -> Any:
    """Megatron-Core's GPTModel for one chunk (the layers of one virtual pipeline stage; the whole model in one
    process): ``pretrain_gpt.py``'s provider, and the one-process model of ``megatron_ext.inference`` and the
    Hugging Face converter."""
    from megatron.core.models.gpt import GPTModel

    m = cfg.model
    config = transformer_config(cfg, device)
    return GPTModel(
        config=config,
        transformer_layer_spec=layer_spec(cfg, device, config=config, vp_stage=vp_stage),
        vocab_size=cfg.padded_vocab_size,
        max_sequence_length=m.max_position_embeddings or m.seq_length,
        pre_process=pre_process,
        post_process=post_process,
        parallel_output=True,
        share_embeddings_and_output_weights=not m.untie_embeddings_and_output_weights,
        position_embedding_type=m.position_embedding_type,
        rotary_percent=m.rotary_percent,
        rotary_base=m.rotary_base,
        rope_scaling=m.use_rope_scaling,
        rope_scaling_factor=m.rope_scaling_factor,
        fp16_lm_cross_entropy=cfg.optim.fp16_lm_cross_entropy,
        seq_len_interpolation_factor=m.rotary_seq_len_interpolation_factor,
        vp_stage=vp_stage,
    )


ModelProvider = Callable[..., torch.nn.Module]


def in_training_precision(chunk: Any, cfg: TrainingConfig) -> Any:
    """``chunk`` as a run computes with it: with --bf16 or --fp16, as Megatron-LM, every parameter in half
    precision (the norms, which the local spec builds in fp32, included; the optimizer keeps fp32 main copies),
    half-precision inputs and fp32 outputs on the last stage (Megatron-Core's Float16Module)."""
    from megatron.core.transformer.module import Float16Module

    return Float16Module(chunk.config, chunk) if cfg.optim.bf16 or cfg.optim.fp16 else chunk


def build_model_chunks(provider: ModelProvider, *, cfg: TrainingConfig, device: torch.device) -> list[Any]:
    """One model chunk per virtual stage of this pipeline rank, wrapped in Megatron DDP."""
    from megatron.core import parallel_state
    from megatron.core.distributed import DistributedDataParallel

    layout = cfg.layout
    if device.type == "cpu" and (problem := gloo_problem(cfg.parallel)):
        raise ConfigError(problem)  # --device auto found no GPU
    chunks = []
    for vp_stage in range(layout.vp):
        vp_arg = vp_stage if layout.interleaved else None
        chunk = provider(
            pre_process=parallel_state.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp_arg),
            post_process=parallel_state.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp_arg),
            vp_stage=vp_arg,
        )
        check_placement(chunk, layout, vp_stage)
        chunk.to(device)
        chunks.append(in_training_precision(chunk, cfg))
    ddp = ddp_config(cfg, num_parameters=sum(p.nelement() for chunk in chunks for p in chunk.parameters()))
    layouts = layer_wise_param_layouts(chunks, cfg=cfg, ddp=ddp, device=device)
    return [
        DistributedDataParallel(
            config=chunk.config,
            ddp_config=ddp,
            module=chunk,
            # Megatron-LM: only the first chunk's buffers are bucketed for overlap.
            disable_bucketing=index > 0,
            full_param_layout=layout,
        )
        for index, (chunk, layout) in enumerate(zip(chunks, layouts, strict=True))
    ]


def layer_wise_param_layouts(chunks: list[Any], *, cfg: TrainingConfig, ddp: Any, device: torch.device) -> list[Any]:
    """Each chunk's DDP buffer layout for Megatron-Core's layer-wise distributed optimizer, as Megatron-LM's
    ``wrap_model_chunks_with_ddp`` makes it (None each: DDP's own layout).

    An emerging optimizer (Muon, Lion, SOAP) with --use-distributed-optimizer gives each DP rank whole weights
    (Newton-Schulz needs a whole matrix): the matrices Muon orthogonalizes go to shard-aligned buffers of their
    own, the rest to the distributed optimizer's byte-level ones. With --no-use-layer-wise-param-layout, plain
    DDP buffers, and the optimizer all-gathers the updated weights itself (Megatron-Core's legacy path).
    """
    from megatron.core import parallel_state
    from megatron.core.optimizer.layer_wise_optimizer import (
        LayerWiseDistributedOptimizer,
        tag_params_for_buffer_routing,
    )

    if not (cfg.layout.use_distributed_optimizer and cfg.optim.optimizer in EMERGING):
        return [None] * len(chunks)
    if cfg.optim.no_use_layer_wise_param_layout:
        if device.type == "cpu":
            raise ConfigError(
                "--no-use-layer-wise-param-layout: Megatron-Core's legacy layer-wise path all-gathers weights of "
                "unequal sizes, which gloo (the CPU backend) cannot; drop the flag on CPU"
            )
        ddp.use_distributed_optimizer = False
        return [None] * len(chunks)
    # Routes each parameter to its buffer (read by Megatron-Core's group_params_for_buffers).
    tag_params_for_buffer_routing(chunks)
    dp = parallel_state.get_data_parallel_world_size(with_context_parallel=True, partial_data_parallel=True)
    first_stage = parallel_state.get_pipeline_model_parallel_rank() == 0
    # DDP's default bucket size when none is given (DistributedDataParallel.__init__).
    bucket = ddp.bucket_size or max(40_000_000, 1_000_000 * parallel_state.get_data_parallel_world_size())
    return [
        LayerWiseDistributedOptimizer.compute_full_param_layout(
            [p for p in chunk.parameters() if p.requires_grad],
            # DDP's own bucket size for the chunk: buckets only with overlap, on the first chunk of the first stage.
            bucket if ddp.overlap_grad_reduce and index == 0 and first_stage else None,
            dp,
            ddp,
            expert_data_parallel_world_size=dp,
        )
        for index, chunk in enumerate(chunks)
    ]


def ddp_config(cfg: TrainingConfig, *, num_parameters: int = 0) -> Any:
    """Megatron-Core's ``DistributedDataParallelConfig`` for this run (``num_parameters``: the rank's, which
    ``--ddp-num-buckets`` divides)."""
    from megatron.core.distributed import DistributedDataParallelConfig

    half = cfg.optim.bf16 or cfg.optim.fp16
    p = cfg.parallel
    bucket_size = max(num_parameters // p.ddp_num_buckets, 1) if p.ddp_num_buckets else p.ddp_bucket_size
    return DistributedDataParallelConfig(
        # Megatron-LM: gradients of half-precision models are accumulated and reduced in fp32, unless
        # --grad-reduce-in-bf16 (bf16 only).
        # --main-grads-dtype bf16 (the precision-aware optimizer) keeps them in bf16 too, as in Megatron-LM.
        grad_reduce_in_fp32=half and not cfg.optim.grad_reduce_in_bf16 and cfg.optim.main_grads_dtype == "fp32",
        overlap_grad_reduce=p.overlap_grad_reduce,
        overlap_param_gather=p.overlap_param_gather,
        align_param_gather=aligned_param_gather(cfg),
        use_distributed_optimizer=cfg.layout.use_distributed_optimizer,
        fp8_param_gather=cfg.optim.fp8_param_gather,
        check_for_nan_in_grad=False,
        bucket_size=bucket_size,
        average_in_collective=p.ddp_average_in_collective,
        pad_buckets_for_high_nccl_busbw=p.ddp_pad_buckets_for_high_nccl_busbw,
        gradient_reduce_div_fusion=not p.no_gradient_reduce_div_fusion,
        # Zero bubble: the deferring linears' weights get DDP's hook through their module (split_backward).
        delay_wgrad_compute=p.enable_zero_bubble,
    )


def aligned_param_gather(cfg: TrainingConfig) -> bool:
    """Megatron-LM's ``align_param_gather``: the interleaved schedule starts every stage's parameter all-gathers
    (``param_sync_func``) unless ``--no-align-param-gather``; without interleaving it is off."""
    return cfg.layout.interleaved and cfg.parallel.overlap_param_gather and not cfg.parallel.no_align_param_gather


def overlapped_p2p(cfg: TrainingConfig) -> bool:
    """Megatron-LM's ``overlap_p2p_comm``: on for the interleaved schedule unless
    ``--no-overlap-p2p-communication``, off without interleaving (``batch_p2p_comm`` is its opposite)."""
    return cfg.layout.interleaved and not cfg.parallel.no_overlap_p2p_communication


def check_placement(chunk: torch.nn.Module, layout: ParallelLayout, vp_stage: int) -> None:
    """The chunk Megatron-Core built holds what ``layout.stages`` says: its layers, embedding and loss.

    The calculator, ``--dry-run`` and the per-stage report all read ``layout.stages``; a
    disagreement with the model that runs would make every one of them wrong.
    """
    from megatron.core import parallel_state

    model = unwrap(chunk)
    rank = parallel_state.get_pipeline_model_parallel_rank()
    expected = layout.stages[rank][vp_stage]
    built = [layer.layer_number - 1 for layer in model.decoder.layers]  # Megatron-Core counts from 1
    holds = (list(expected.layers), bool(model.pre_process), bool(model.post_process))
    if (built, bool(model.pre_process), bool(model.post_process)) != holds:
        raise RuntimeError(
            f"pipeline rank {rank}, virtual stage {vp_stage}: Megatron-Core built layers {built} "
            f"(embedding {model.pre_process}, loss {model.post_process}), the layout expects {expected.describe()}"
        )


def unwrap(chunk: torch.nn.Module) -> Any:
    """The GPTModel inside the DDP (and Float16Module) wrappers (typed Any: Megatron-Core's modules are untyped)."""
    from megatron.core.utils import unwrap_model

    return unwrap_model(chunk)


def count_parameters(chunks: list[torch.nn.Module]) -> int:
    """Parameters held by this rank (all of its chunks)."""
    return sum(p.numel() for chunk in chunks for p in chunk.parameters())


def parameter_norm(chunks: list[torch.nn.Module]) -> float:
    """The L2 norm of the whole model's weights, each counted once: ``--log-params-norm``.

    This rank's squares, without the copies on other TP ranks and without the
    last stage's copy of a tied embedding, summed over the model-parallel group
    (TP × PP): the value is the same under any layout. (Megatron-LM's
    ``calc_params_l2_norm`` counts a tied embedding twice when PP > 1.) A
    collective: every rank calls it at the same point.
    """
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import param_is_not_tensor_parallel_duplicate

    device = next(chunks[0].parameters()).device
    squares = torch.zeros((), dtype=torch.float64, device=device)
    for chunk in chunks:
        for param in chunk.parameters():
            if param_is_not_tensor_parallel_duplicate(param) and not getattr(param, "shared", False):
                squares += param.detach().double().square().sum()
    torch.distributed.all_reduce(squares, group=parallel_state.get_model_parallel_group())
    return float(squares.sqrt())

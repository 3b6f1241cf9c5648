"""Published Megatron training measurements: what the time model is calibrated on, and what validates it.

Fused attention's share of peak is never fitted here: it comes from kernel benchmarks (``estimate/kernels.py``).

Calibration (the constants of ``megatron_ext/estimate/hardware.py`` are the minimax fit to these rows):

* A100: Narayanan et al. 2021, Table 1 (``NARAYANAN_TABLE_1``): the GEMMs' best share of peak and the
  element-wise kernels' share of HBM bandwidth.
* H100: NVIDIA's dgxc-benchmarking BF16 sweeps of Llama 3.1 8B, Llama 3.1 405B (and its proxies) and
  Nemotron-4 340B (``DGXC_H100``, ``DGXC_CALIBRATION``): the GEMMs' best share of peak and the element-wise
  kernels' share of HBM bandwidth.

The GEMMs' shape losses are not fitted to these runs: a tile's fixed time comes from a published GEMM benchmark
by shape (``tests/estimate/test_gemm_shapes.py``, ``estimate.kernels.gemm_depth_half``).

Validation (never used to fit anything):

* A100: Korthikanti et al. 2022, Tables 3 and 5 and §6.3 (``KORTHIKANTI_2022``); the Megatron-LM README's
  GPT-3 175B on 1024 A100s (``MEGATRON_LM_A100_175B``); MegaScale's Megatron-LM baseline, 256 to 12,288 GPUs
  (``MEGASCALE_175B``).
* H100: the dgxc-benchmarking sweeps of Llama 3.1 70B, Nemotron-4 15B and GPT-3 175B; the FP8 / BF16 pairs of
  ``tests/estimate/test_fp8.py``; the later dgxc-benchmarking releases' BF16 and FP8 tables, v25.02.02,
  v25.04.02 and v25.05.05 (NeMo 24.12 to 25.04: ``DGXC_LATER_RELEASES``); MLPerf Training v3.1's GPT-3 175B,
  512 to 10,752 GPUs (``MLPERF_V31_GPT3``); MLPerf Training v5.0's Llama 3.1 405B, 512 to 8,192 GPUs
  (``MLPERF_V50_LLAMA_405B``).
* H200: MLPerf Training v5.1's Llama 3.1 405B, Nebius's 512 and 1,024 GPUs (``MLPERF_V51_LLAMA_405B_H200``).

Comparison (listed, neither fitted nor validated): the Megatron-LM README's H100 weak-scaling table
(``MEGATRON_LM_H100``): Megatron-Core r0.8.0, and the micro-batch, virtual stages and recomputation of its runs
are not published (the rows take the calculator's best); NeMo 24.07's FP8 performance summary on H100
(``NEMO_24_07_FP8``): its models' shapes and recipe settings are not published with it, and it misses the
validation goal; Megatron-Bridge's H100 FP8 runs with current scaling, NeMo 25.11 to 26.06
(``MEGATRON_BRIDGE_H100_FP8``): published whole, and the model misses the validation goal on them; MLPerf
Training v4.0's and v4.1's GPT-3 175B (``MLPERF_V40_GPT3``, ``MLPERF_V41_GPT3``): published whole, and missed too.

Every row's residual is the predicted throughput over the measured one, minus 1 (for iteration times: the
measured time over the predicted one, minus 1); ``docs/layout-model.md`` lists them all.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from megatron_ext.config.arguments import ModelArgs
from megatron_ext.config.layout_flags import model_layout_facts
from megatron_ext.estimate.hardware import GpuProfile, get_profile
from megatron_ext.estimate.search import Cluster, LayoutEstimate, evaluate
from megatron_ext.estimate.workload import Workload
from megatron_ext.parallel.layout import ParallelLayout


@dataclass(frozen=True, kw_only=True)
class PublishedRun:
    """One published training run: its configuration and what was measured."""

    table: str
    """Where it is published."""
    name: str
    """The row's name there."""
    gpu: str
    """The calculator's profile of the GPU it ran on."""
    layers: int
    hidden: int
    heads: int
    seq_length: int
    vocab_size: int
    tp: int
    pp: int
    vp: int = 1
    """Model chunks per pipeline rank (1: not interleaved)."""
    gpus: int
    global_batch: int
    micro_batch: int
    precision: str = "bf16"
    fp8_format: str | None = None
    """``--fp8-format`` (the layers' GEMMs in FP8 on top of ``precision``), or None."""
    fp8_recipe: str = "delayed"
    """``--fp8-recipe`` with ``fp8_format``: Transformer Engine's scaling (``delayed`` before NeMo 25.04's
    performance recipes; ``tensorwise``, current scaling, in Megatron-Bridge's)."""
    fp8_param_gather: bool = False
    """``--fp8-param-gather`` with ``fp8_format`` (NeMo's ``fp8_params``): the layers' weights gathered in FP8."""
    recompute: str = "none"
    sequence_parallel: bool = False
    distributed_optimizer: bool = False
    overlap: bool = False
    """Data-parallel gradient reduction (and, with the distributed optimizer, parameter gather) overlapped."""
    cp: int = 1
    """Context-parallel size."""
    grad_reduce_in_bf16: bool = False
    """``--grad-reduce-in-bf16``."""
    tp_comm_overlap: bool = False
    """``--tp-comm-overlap`` (Transformer Engine's userbuffers)."""
    embedding_and_loss_in_split: bool = False
    """``--account-for-embedding-in-pipeline-split`` and ``--account-for-loss-in-pipeline-split``: the embedding and
    the loss each count as a layer when the layers are split over the (virtual) pipeline stages."""
    model: ModelArgs | None = None
    """The whole model (GQA, SwiGLU, ...), when the row is not a GPT-3-style shape of the fields above."""
    scatter_gather: bool = False
    """Megatron-LM 2021's pipeline scatter/gather optimisation."""
    ce_fusion: bool = False
    """``--cross-entropy-loss-fusion`` (NeMo's ``cross_entropy_loss_fusion``): the fused vocabulary-parallel cross
    entropy."""
    p2p_overlap: bool = True
    """The interleaved schedule's p2p overlapped with compute (``--no-overlap-p2p-communication`` when False: Megatron-LM
    before its ``overlap_p2p_comm``)."""
    attention: str = "unfused"
    """``unfused`` (Megatron's fused softmax, scores in memory; before 2023), or a fused ``--attention-backend``."""
    step_s: float | None = None
    """Measured iteration time, seconds."""
    tokens_per_gpu_s: float | None = None
    """Measured tokens per second per GPU."""
    tflops: float | None = None
    """Measured teraFLOP/s per GPU (with ``hardware_flops``: counting recomputation, as Narayanan et al. 2021)."""
    hardware_flops: bool = False
    calibration: bool = False
    """Used to fit the profile's constants (else validation only)."""
    comparison: bool = False
    """Neither fitted nor validated: a table whose runs' settings are partly unpublished, or one the model misses the
    validation goal on; its residuals are listed and their sign and size checked (``docs/layout-model.md``)."""
    assumed: str = ""
    """What the source does not state and the row assumes."""

    def workload(self) -> Workload:
        model = self.model or ModelArgs(
            num_layers=self.layers,
            hidden_size=self.hidden,
            num_attention_heads=self.heads,
            seq_length=self.seq_length,
            max_position_embeddings=self.seq_length,
            vocab_size=self.vocab_size,
            attention_backend=self.attention,
        )
        return Workload(
            model=dataclasses.replace(model, cross_entropy_loss_fusion=self.ce_fusion),
            precision=self.precision,
            fp8_format=self.fp8_format,
            fp8_recipe=self.fp8_recipe,
            fp8_param_gather=self.fp8_param_gather,
            recompute_granularity=self.recompute,
            overlap_grad_reduce=self.overlap,
            overlap_param_gather=self.overlap and self.distributed_optimizer,
            p2p_scatter_gather=self.scatter_gather,
            overlap_p2p_comm=self.p2p_overlap,
            grad_reduce_in_bf16=self.grad_reduce_in_bf16,
            tp_comm_overlap=self.tp_comm_overlap and self.sequence_parallel,
        )

    def layout(self) -> ParallelLayout:
        facts: dict[str, Any] = model_layout_facts(self.workload().model)
        return ParallelLayout(
            world_size=self.gpus,
            tensor_model_parallel_size=self.tp,
            pipeline_model_parallel_size=self.pp,
            virtual_pipeline_model_parallel_size=self.vp if self.vp > 1 else None,
            context_parallel_size=self.cp,
            account_for_embedding_in_pipeline_split=self.embedding_and_loss_in_split,
            account_for_loss_in_pipeline_split=self.embedding_and_loss_in_split,
            sequence_parallel=self.sequence_parallel,
            use_distributed_optimizer=self.distributed_optimizer,
            micro_batch_size=self.micro_batch,
            global_batch_size=self.global_batch,
            gpus_per_node=8,
            **facts,
        )

    def cluster(self, gpu: GpuProfile | None = None) -> Cluster:
        return Cluster(gpus=self.gpus, gpus_per_node=8, gpu=gpu or get_profile(self.gpu))

    def estimate(self, gpu: GpuProfile | None = None) -> LayoutEstimate:
        """The calculator's estimate of this run (on ``gpu``, default the row's profile)."""
        return evaluate(self.workload(), self.layout(), self.cluster(gpu))

    def predicted_tokens_per_gpu_s(self, estimate: LayoutEstimate) -> float:
        """Tokens per second per GPU at ``estimate``'s step time."""
        return self.global_batch * self.seq_length / (estimate.time.step_s * self.gpus)

    def measured_step_s(self, estimate: LayoutEstimate | None = None) -> float:
        """The measured step time, from what the source published: a time, tokens per second per GPU, or TFLOP/s
        per GPU (over the FLOPs of a step by the formula of that source, Megatron-LM's, which ``estimate`` counts:
        the same on any GPU; by default this row's)."""
        if self.step_s is not None:
            return self.step_s
        if self.tokens_per_gpu_s is not None:
            return self.global_batch * self.seq_length / (self.tokens_per_gpu_s * self.gpus)
        assert self.tflops is not None
        step = (estimate or self.estimate()).time
        return (step.hardware_flops if self.hardware_flops else step.model_flops) / (self.tflops * 1e12 * self.gpus)

    def residual(self, gpu: GpuProfile | None = None) -> float:
        """Predicted throughput over measured, minus 1: the measured step time over the predicted one, minus 1
        (tokens and FLOPs per step are the same on both sides)."""
        estimate = self.estimate(gpu)
        return self.measured_step_s(estimate) / estimate.time.step_s - 1


def _row(**values: Any) -> PublishedRun:
    return PublishedRun(**values)


# Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM"
# (arXiv 2104.04473), Table 1: Selene (DGX A100 80GB), sequence 2048, vocabulary 51,200, fp16, full
# recomputation; teraFLOP/s count the recomputation (96·B·s·l·h²·(1 + s/6h + V/16lh)). Micro-batch, virtual
# stages and DDP of each row: Megatron-LM's examples/sc21/run_table_1.sh (commit 6985e589): DDP=torch
# (overlapped all-reduce) for PP = 1, Megatron's own (not overlapped) otherwise; p2p scatter/gather on.
_T1 = "Narayanan et al. 2021, Table 1"
NARAYANAN_TABLE_1 = [
    _row(
        table=_T1,
        name=f"{billions}B",
        gpu="a100-80g",
        heads=heads,
        hidden=hidden,
        layers=layers,
        tp=tp,
        pp=pp,
        gpus=gpus,
        global_batch=batch,
        tflops=tflops,
        micro_batch=mb,
        vp=vp,
        overlap=pp == 1,
        seq_length=2048,
        vocab_size=51200,
        precision="fp16",
        recompute="full",
        scatter_gather=True,
        hardware_flops=True,
        calibration=True,
    )
    for billions, heads, hidden, layers, tp, pp, gpus, batch, tflops, mb, vp in [
        (1.7, 24, 2304, 24, 1, 1, 32, 512, 137, 16, 1),
        (3.6, 32, 3072, 30, 2, 1, 64, 512, 138, 16, 1),
        (7.5, 32, 4096, 36, 4, 1, 128, 512, 142, 16, 1),
        (18.4, 48, 6144, 40, 8, 1, 256, 1024, 135, 8, 1),
        (39.1, 64, 8192, 48, 8, 2, 512, 1536, 138, 4, 1),
        (76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140, 2, 3),
        (145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148, 2, 2),
        (310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155, 1, 2),
        (529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163, 1, 3),
        (1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163, 1, 1),
    ]
]

# Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models" (arXiv 2205.05198):
# Table 3 (configurations: TP 8, sequence 2048, vocabulary 51,200, mixed precision, Selene A100 80GB, no data
# parallelism), Table 5 (iteration times: full recomputation without sequence parallelism, and sequence
# parallelism + selective recomputation), §5: "the interleaving schedule with three interleaving stages
# (m = 3) for the 175B and 530B models"; §6.3: the 530B model on 2240 GPUs (DP 8, batch 2240, no overlap of
# the gradient all-reduce) takes 39.15 s.
_K = "Korthikanti et al. 2022, Tables 3 and 5"
_K_ASSUMED = "1T: no interleaving (the paper names it for 175B and 530B only); p2p scatter/gather on (Megatron-LM 2022)"
KORTHIKANTI_2022 = [
    _row(
        table=_K,
        name=f"{name} {'SP + selective' if selective else 'full recompute'}",
        gpu="a100-80g",
        heads=heads,
        hidden=hidden,
        layers=layers,
        tp=8,
        pp=pp,
        vp=vp,
        gpus=gpus,
        global_batch=batch,
        micro_batch=mb,
        seq_length=2048,
        vocab_size=51200,
        recompute="selective" if selective else "full",
        sequence_parallel=selective,
        scatter_gather=True,
        step_s=sel if selective else full,
        assumed=_K_ASSUMED,
    )
    for name, heads, hidden, layers, pp, vp, gpus, batch, mb, full, sel in [
        ("22B", 64, 6144, 48, 1, 1, 8, 4, 4, 1.42, 1.10),
        ("175B", 96, 12288, 96, 8, 3, 64, 64, 1, 18.13, 13.75),
        ("530B", 128, 20480, 105, 35, 3, 280, 280, 1, 49.05, 37.83),
        ("1T", 160, 25600, 128, 64, 1, 512, 512, 1, 94.42, 71.49),
    ]
    for selective in (False, True)
] + [
    _row(
        table="Korthikanti et al. 2022, §6.3",
        name="530B DP 8, SP + selective",
        gpu="a100-80g",
        heads=128,
        hidden=20480,
        layers=105,
        tp=8,
        pp=35,
        vp=3,
        gpus=2240,
        global_batch=2240,
        micro_batch=1,
        seq_length=2048,
        vocab_size=51200,
        recompute="selective",
        sequence_parallel=True,
        scatter_gather=True,
        step_s=39.15,
        assumed="p2p scatter/gather on (Megatron-LM 2022)",
    )
]

# Megatron-LM README (commit 152aab30, January 2021): "With full global batch size of 1536 on 1024 A100 GPUs,
# each iteration takes around 32 seconds resulting in 138 teraFLOPs per GPU"; examples/pretrain_gpt3_175B.sh:
# TP 8, PP 16, micro-batch 1, fp16, --checkpoint-activations, no interleaving (which came later that year).
MEGATRON_LM_A100_175B = [
    _row(
        table="Megatron-LM README (152aab30), GPT-3 175B",
        name="175B on 1024 A100",
        gpu="a100-80g",
        heads=96,
        hidden=12288,
        layers=96,
        tp=8,
        pp=16,
        gpus=1024,
        global_batch=1536,
        micro_batch=1,
        seq_length=2048,
        vocab_size=51200,
        precision="fp16",
        recompute="full",
        step_s=32.0,
        assumed="vocabulary 51,200 (GPT-2's, padded); p2p not scattered (before Narayanan et al. 2021)",
    )
]

# Megatron-LM README, weak scaling on H100 (images/model_table.png, commit f2e5db40, July 2024, Megatron-Core
# r0.8.0): vocabulary 131,072, sequence 4096, --overlap-grad-reduce --overlap-param-gather --tp-comm-overlap,
# "measured for end-to-end training"; per-GPU model teraFLOP/s. Not published: precision, micro-batch, virtual
# stages, recomputation. Assumed: bf16 (the MFUs are against the bf16 peak), the distributed optimizer,
# sequence parallelism, Transformer Engine's own choice of attention kernel, and the micro-batch, virtual stages and recomputation (none or
# selective) the calculator finds fastest for the published TP, PP and DP (test_h100_rows_take_the_best_...
# keeps them current). The runs overlapped the TP communication (--tp-comm-overlap, which the rows give).
# Every other row calibrates.
_R = "Megatron-LM README (f2e5db40), H100 weak scaling"
_R_ASSUMED = (
    "bf16, distributed optimizer, SP, --attention-backend auto (Transformer Engine's choice: cuDNN on Hopper); "
    "micro-batch, VP, recompute: the calculator's best"
)
MEGATRON_LM_H100 = [
    _row(
        table=_R,
        name=name,
        gpu="h100-sxm",
        heads=heads,
        hidden=hidden,
        layers=layers,
        tp=tp,
        pp=pp,
        vp=vp,
        gpus=gpus,
        global_batch=batch,
        micro_batch=mb,
        recompute=recompute,
        tflops=tflops,
        seq_length=4096,
        vocab_size=131072,
        sequence_parallel=tp > 1,
        distributed_optimizer=True,
        overlap=True,
        tp_comm_overlap=True,
        attention="auto",
        comparison=True,
        assumed=_R_ASSUMED,
    )
    for index, (name, heads, hidden, layers, tp, pp, gpus, batch, tflops, vp, mb, recompute) in enumerate(
        [
            ("1.7B", 16, 2048, 24, 1, 1, 48, 192, 408.8, 1, 4, "none"),
            ("7.1B", 32, 4096, 30, 2, 1, 96, 192, 465.9, 1, 4, "none"),
            ("16B", 48, 6144, 32, 4, 1, 192, 192, 489.1, 1, 4, "none"),
            ("32B", 56, 7168, 48, 8, 1, 384, 192, 459.6, 1, 4, "none"),
            ("70B", 64, 8192, 84, 8, 2, 768, 384, 419.7, 21, 4, "none"),
            ("119B", 80, 10240, 92, 8, 4, 1536, 768, 420.5, 23, 2, "none"),
            ("177B", 96, 12288, 96, 8, 6, 2304, 1152, 432.8, 16, 2, "none"),
            ("314B", 128, 16384, 96, 8, 8, 3072, 1536, 474.4, 12, 1, "none"),
            ("462B", 144, 18432, 112, 8, 16, 6144, 3072, 459.9, 7, 1, "none"),
        ]
    )
]


def llama(layers: int, hidden: int, ffn: int, heads: int, groups: int) -> ModelArgs:
    """A Llama 3.1 shape (GQA, SwiGLU, RMSNorm, rope, untied, no biases, no dropout), sequence 8192."""
    return ModelArgs(
        num_layers=layers, hidden_size=hidden, ffn_hidden_size=ffn, num_attention_heads=heads,
        group_query_attention=True, num_query_groups=groups, swiglu=True, normalization="RMSNorm",
        position_embedding_type="rope", disable_bias_linear=True, untie_embeddings_and_output_weights=True,
        seq_length=8192, vocab_size=128256, hidden_dropout=0.0, attention_dropout=0.0, attention_backend="auto",
    )  # fmt: skip


def llama2(layers: int, hidden: int, ffn: int, heads: int, groups: int) -> ModelArgs:
    """A Llama 2 shape: Llama 3.1's (``groups`` = ``heads``: one key/value head per query head) with sequence 4096
    and a 32,000-token vocabulary."""
    return dataclasses.replace(llama(layers, hidden, ffn, heads, groups), seq_length=4096, vocab_size=32000)


def nemotron(layers: int, hidden: int, heads: int, groups: int = 8) -> ModelArgs:
    """A Nemotron shape (``groups`` query groups, squared ReLU, layernorm-1p, rope, untied, no biases), sequence
    4096 (Nemotron-4: 8 query groups; ``groups`` = ``heads``: Nemotron-3's one key/value head per query head)."""
    return ModelArgs(
        num_layers=layers, hidden_size=hidden, ffn_hidden_size=4 * hidden, num_attention_heads=heads,
        group_query_attention=True, num_query_groups=groups, squared_relu=True, apply_layernorm_1p=True,
        position_embedding_type="rope", disable_bias_linear=True, untie_embeddings_and_output_weights=True,
        seq_length=4096, vocab_size=256000, hidden_dropout=0.0, attention_dropout=0.0, attention_backend="auto",
    )  # fmt: skip


def gpt3(layers: int, hidden: int, heads: int) -> ModelArgs:
    """A GPT-3 shape (Megatron's GPT: LayerNorm, GeLU MLP of 4 × hidden, learned positions, tied, biases),
    sequence 2048, vocabulary 51,200, no dropout."""
    return ModelArgs(
        num_layers=layers, hidden_size=hidden, num_attention_heads=heads, seq_length=2048, vocab_size=51200,
        hidden_dropout=0.0, attention_dropout=0.0, attention_backend="auto",
    )  # fmt: skip


GPT3_175B = gpt3(96, 12288, 96)

DgxcSweep = tuple[str, ModelArgs, int, int, int, int, int, str, list[tuple[int, int, float]]]
"""One model's sweep in a dgxc-benchmarking table: name, model, TP, PP, VP, CP, micro-batch, recompute, and
(GPUs, global batch, step seconds) per column."""


def dgxc_rows(
    table: str,
    sweeps: list[DgxcSweep],
    *,
    assumed: str,
    calibration: tuple[str, ...] = (),
    embedding_and_loss_in_split: tuple[str, ...] = (),
    fp8_format: str | None = None,
) -> list[PublishedRun]:
    """The rows of a dgxc-benchmarking (NeMo) DGX H100 table: the recipes' bf16, distributed optimizer,
    overlapped gradient reduction and parameter all-gather, SP, fused attention and TP communication overlap;
    ``calibration``: the models (by the start of their name) whose rows fit the constants;
    ``embedding_and_loss_in_split``: the sweeps (by name) whose layers are split counting the embedding and the loss
    as layers (on PP > 1); ``fp8_format``: an FP8 table's (the layers' GEMMs in FP8 on top of bf16). The Llama and
    Nemotron recipes fuse the cross entropy (``cross_entropy_loss_fusion: true`` in v24.11.1's and v25.02's
    configuration files, NeMo 2's ``GPTConfig`` default in the later releases' recipes); the GPT-3 175B
    configuration (``nemo_megatron/gpt3_175b_hydra.yaml``) does not set it."""
    return [
        _row(
            table=table,
            name=f"{name} on {gpus}",
            gpu="h100-sxm",
            model=model,
            heads=model.num_attention_heads,
            hidden=model.hidden_size,
            layers=model.num_layers,
            seq_length=model.seq_length,
            vocab_size=int(model.vocab_size or 0),
            tp=tp,
            pp=pp,
            vp=vp,
            cp=cp,
            gpus=gpus,
            global_batch=batch,
            micro_batch=mb,
            recompute=recompute,
            sequence_parallel=tp > 1,
            distributed_optimizer=True,
            overlap=True,
            tp_comm_overlap=True,
            grad_reduce_in_bf16=True,
            fp8_format=fp8_format,
            fp8_param_gather=fp8_format is not None,
            embedding_and_loss_in_split=name in embedding_and_loss_in_split and pp > 1,
            ce_fusion=not name.startswith("GPT-3"),
            attention="auto",
            step_s=step,
            calibration=name.startswith(calibration),
            assumed=assumed,
        )
        for name, model, tp, pp, vp, cp, mb, recompute, sweep in sweeps
        for gpus, batch, step in sweep
    ]


# NVIDIA's DGX Cloud Benchmarking recipes (github NVIDIA/dgxc-benchmarking, release v24.11.1, commit 35a9aecc;
# NeMo 24.09, GPT-3 175B NeMo 24.05): the 'Expected Performance' BF16 tables of llama3.1/README_{8b,70b,405b}.md,
# nemotron/README_{15b,340b}.md and nemo_megatron/README_175b.md, on DGX H100; step time in seconds (the last
# step), weak scaling (the global batch grows with the GPUs). The 405B tables' 32-, 96- and 192-GPU columns are
# proxies with 7, 21 and 42 layers. Published: TP, PP, CP, VP, micro-batch, global batch, GPUs. From the recipes:
# bf16, distributed optimizer, overlapped gradient reduction and parameter all-gather, sequence parallelism,
# fused attention, TP communication overlap (--tp-comm-overlap), recompute none but selective for the 340B.
_D = "NVIDIA dgxc-benchmarking v24.11.1, DGX H100 BF16"
DGXC_CALIBRATION = ("Llama 3.1 8B", "Llama 3.1 405B", "Nemotron-4 340B")
"""The models whose sweeps fit the H100 constants; the Llama 3.1 70B, Nemotron-4 15B and GPT-3 175B sweeps
validate."""
_D_ASSUMED = (
    "--grad-reduce-in-bf16: with fp32 gradient buffers the 340B layout would not fit in 80 GB; squared ReLU and "
    "layernorm-1p as the calculator approximates them"
)
DGXC_H100 = dgxc_rows(
    _D,
    [
        ("Llama 3.1 8B", llama(32, 4096, 14336, 32, 8), 1, 1, 1, 2, 1, "none",
         [(8, 128, 12.91), (16, 256, 13.00), (32, 512, 13.05), (64, 1024, 13.08), (128, 2048, 13.10)]),
        ("Llama 3.1 70B", llama(80, 8192, 28672, 64, 8), 4, 4, 5, 2, 1, "none",
         [(64, 128, 14.72), (128, 256, 14.73), (256, 512, 14.8), (512, 1024, 14.89), (1024, 2048, 14.92),
          (2048, 4096, 14.98)]),
        ("Llama 3.1 405B, 7 layers", llama(7, 16384, 53248, 128, 16), 8, 1, 1, 2, 1, "none", [(32, 126, 8.85)]),
        ("Llama 3.1 405B, 21 layers", llama(21, 16384, 53248, 128, 16), 8, 3, 7, 2, 1, "none", [(96, 126, 8.75)]),
        ("Llama 3.1 405B, 42 layers", llama(42, 16384, 53248, 128, 16), 8, 3, 7, 2, 1, "none",
         [(192, 252, 16.93)]),
        ("Llama 3.1 405B", llama(126, 16384, 53248, 128, 16), 8, 9, 7, 2, 1, "none",
         [(576, 252, 17.20), (1152, 504, 17.52), (2304, 1008, 17.62)]),
        ("Nemotron-4 15B", nemotron(32, 6144, 48), 4, 1, 1, 1, 4, "none",
         [(16, 64, 2.83), (32, 128, 2.86), (64, 256, 2.86), (128, 512, 2.89), (256, 1024, 2.88),
          (512, 2048, 2.92), (1024, 4096, 2.92), (2048, 8192, 2.96)]),
        ("Nemotron-4 340B", nemotron(96, 18432, 96), 8, 8, 12, 1, 1, "selective",
         [(128, 32, 4.61), (256, 64, 4.67), (512, 128, 4.7), (1024, 256, 4.73), (2048, 512, 4.84)]),
        ("GPT-3 175B", GPT3_175B, 4, 8, 12, 1, 1, "none",
         [(128, 256, 8.91), (256, 512, 8.95), (512, 1024, 9.09), (1024, 2048, 9.01), (2048, 4096, 9.02)]),
    ],
    assumed=_D_ASSUMED,
    calibration=DGXC_CALIBRATION,
)  # fmt: skip


# Later releases of the same recipes (github NVIDIA/dgxc-benchmarking), DGX H100 BF16 'Expected Performance'
# tables, step time in seconds (the last step): validation only, none fitted. Each release's rows are its own
# measurement; where a release repeats an earlier one's figures unchanged (its run is not new), the rows are
# left out. What the releases publish and what they leave to their recipes is as for v24.11.1 (``_D`` above);
# from the recipes' configuration files: bf16 gradient reduction (``grad_sync_dtype: bf16`` in v25.02's NeMo
# launcher files; ``grad_reduce_in_fp32 = False`` in NeMo 2's performance recipes), overlapped gradient reduction
# and parameter all-gather, SP, --tp-comm-overlap, no recomputation (selective for the 340B, as in v24.11.1).
#
# v25.02 (tag v25.02.02, NeMo 24.12; llama3.1/README_{8b,70b,405b}.md, nemotron/README_15b.md,
# nemo_megatron/README_175b.md): the same layouts as v24.11.1, measured again, except GPT-3 175B, whose shipped
# configuration (nemo_megatron/gpt3_175b_hydra.yaml) has VP 6 where v24.11.1's had 12 (the README's heading still
# says 12; v25.04's README, with the same figures, says 6). Its Nemotron-4 340B table is v24.11.1's (NeMo 24.09,
# the same figures): left out.
_D2502 = "NVIDIA dgxc-benchmarking v25.02.02, DGX H100 BF16"
DGXC_H100_V25_02 = dgxc_rows(
    _D2502,
    [
        ("Llama 3.1 8B", llama(32, 4096, 14336, 32, 8), 1, 1, 1, 2, 1, "none",
         [(8, 128, 12.78), (16, 256, 12.99), (32, 512, 13.00), (64, 1024, 13.00), (128, 2048, 13.16)]),
        ("Llama 3.1 70B", llama(80, 8192, 28672, 64, 8), 4, 4, 5, 2, 1, "none",
         [(64, 128, 14.61), (128, 256, 14.70), (256, 512, 14.72), (512, 1024, 14.80), (1024, 2048, 14.86),
          (2048, 4096, 14.84)]),
        ("Llama 3.1 405B, 7 layers", llama(7, 16384, 53248, 128, 16), 8, 1, 1, 2, 1, "none", [(32, 126, 9.00)]),
        ("Llama 3.1 405B, 21 layers", llama(21, 16384, 53248, 128, 16), 8, 3, 7, 2, 1, "none", [(96, 126, 8.87)]),
        ("Llama 3.1 405B, 42 layers", llama(42, 16384, 53248, 128, 16), 8, 3, 7, 2, 1, "none",
         [(192, 252, 17.30)]),
        ("Llama 3.1 405B", llama(126, 16384, 53248, 128, 16), 8, 9, 7, 2, 1, "none",
         [(576, 252, 17.50), (1152, 504, 17.60), (2304, 1008, 17.70)]),
        ("Nemotron-4 15B", nemotron(32, 6144, 48), 4, 1, 1, 1, 4, "none",
         [(16, 64, 2.812), (32, 128, 2.824), (64, 256, 2.845), (128, 512, 2.859), (256, 1024, 2.852),
          (512, 2048, 2.875), (1024, 4096, 2.895), (2048, 8192, 2.887)]),
        ("GPT-3 175B", GPT3_175B, 4, 8, 6, 1, 1, "none",
         [(128, 256, 8.309), (256, 512, 8.408), (512, 1024, 8.42), (1024, 2048, 8.453), (2048, 4096, 8.49)]),
    ],
    assumed=_D_ASSUMED + "; GPT-3 175B: VP 6, the release's configuration file (its README heading says 12)",
)  # fmt: skip

# v25.04 (tag v25.04.02, NeMo 25.02.01; llama3.1/README.md, nemotron/README.md with their layout tables, and
# launch.sh / llama31_utils.py): new layouts for Llama 3.1 405B (TP 8, PP 8, VP 8, CP 2; proxies of 8 layers on
# 32 GPUs at PP 1, 30 layers on 64 and 62 on 128 at PP 4, VP 8) and Nemotron-4 15B (TP 2, micro-batch 2); the
# 340B's layout table says no VP, its launch.sh gives VP 12 (taken). 126, 30 and 62 layers split evenly over PP ×
# VP chunks only with the embedding and the loss each counted as a layer (NeMo's 405B performance recipe sets
# both); the rows take it. Its GPT-3 175B table repeats v25.02's figures (NeMo 24.12): left out.
_D2504 = "NVIDIA dgxc-benchmarking v25.04.02, DGX H100 BF16"
_D2504_ASSUMED = (
    _D_ASSUMED + "; 405B (PP > 1): --account-for-embedding-in-pipeline-split and --account-for-loss-in-pipeline-split"
)
DGXC_H100_V25_04 = dgxc_rows(
    _D2504,
    [
        ("Llama 3.1 8B", llama(32, 4096, 14336, 32, 8), 1, 1, 1, 2, 1, "none",
         [(8, 128, 12.27), (16, 256, 12.3), (32, 512, 12.32), (64, 1024, 12.33), (128, 2048, 12.33)]),
        ("Llama 3.1 70B", llama(80, 8192, 28672, 64, 8), 4, 4, 5, 2, 1, "none",
         [(64, 128, 14.66), (128, 256, 14.67), (256, 512, 14.68), (512, 1024, 14.67), (1024, 2048, 14.65),
          (2048, 4096, 14.66)]),
        ("Llama 3.1 405B, 8 layers", llama(8, 16384, 53248, 128, 16), 8, 1, 1, 2, 1, "none", [(32, 64, 5.4)]),
        ("Llama 3.1 405B, 30 layers", llama(30, 16384, 53248, 128, 16), 8, 4, 8, 2, 1, "none", [(64, 64, 10.1)]),
        ("Llama 3.1 405B, 62 layers", llama(62, 16384, 53248, 128, 16), 8, 4, 8, 2, 1, "none",
         [(128, 128, 19.62)]),
        ("Llama 3.1 405B", llama(126, 16384, 53248, 128, 16), 8, 8, 8, 2, 1, "none",
         [(512, 256, 19.78), (1024, 512, 19.84), (2048, 1024, 19.87)]),
        ("Nemotron-4 15B", nemotron(32, 6144, 48), 2, 1, 1, 1, 2, "none",
         [(16, 64, 2.66), (32, 128, 2.66), (64, 256, 2.67), (128, 512, 2.67), (256, 1024, 2.68),
          (512, 2048, 2.71), (1024, 4096, 2.74), (2048, 8192, 2.78)]),
        ("Nemotron-4 340B", nemotron(96, 18432, 96), 8, 8, 12, 1, 1, "selective",
         [(256, 64, 4.36), (512, 128, 4.39), (1024, 256, 4.41), (2048, 512, 4.43)]),
    ],
    assumed=_D2504_ASSUMED,
    embedding_and_loss_in_split=("Llama 3.1 405B, 30 layers", "Llama 3.1 405B, 62 layers", "Llama 3.1 405B"),
)  # fmt: skip

# v25.05 (tag v25.05.05, NeMo 25.04.01; llama3.1/README.md, nemotron/README.md): one H100 column per model, the
# v25.04 layouts (the 340B with VP 12 in its layout table).
_D2505 = "NVIDIA dgxc-benchmarking v25.05.05, DGX H100 BF16"
DGXC_H100_V25_05 = dgxc_rows(
    _D2505,
    [
        ("Llama 3.1 405B", llama(126, 16384, 53248, 128, 16), 8, 8, 8, 2, 1, "none", [(512, 256, 19.810)]),
        ("Nemotron-4 15B", nemotron(32, 6144, 48), 2, 1, 1, 1, 2, "none", [(16, 64, 2.746)]),
        ("Nemotron-4 340B", nemotron(96, 18432, 96), 8, 8, 12, 1, 1, "selective", [(256, 64, 4.606)]),
    ],
    assumed=_D2504_ASSUMED,
    embedding_and_loss_in_split=("Llama 3.1 405B",),
)  # fmt: skip


# The same releases' FP8 tables (the columns beside each BF16 table): the same recipes with the layers' GEMMs in
# FP8 (Transformer Engine's delayed scaling, hybrid format: E4M3 forward, E5M2 gradients), --fp8-format hybrid
# in the rows. The FP8 GEMMs' share of the FP8 peak was fitted on v24.11.1's BF16 / FP8 step-time ratios (of the
# calibration models, ``tests/estimate/test_fp8.py``); none of these rows is fitted. Layouts as the BF16 tables'
# but v25.04's Llama 3.1 70B FP8 (its layout table: TP 4, PP 8, CP 1, VP 5). v25.02's Nemotron-4 340B and v25.04's
# GPT-3 175B FP8 tables repeat earlier figures: left out. Every release's recipes gather the FP8 weights in FP8
# (--fp8-param-gather): v24.11.1's and v25.02's configure.sh pass +model.fp8_params (gpt3_175b_hydra.yaml sets
# fp8_params), and v25.04's and v25.05's scripts train with NeMo 2's bf16_with_fp8_mixed, which sets fp8_params (NeMo
# v2.2.0) or fp8_param_gather (v2.3.0).
_F2502 = "NVIDIA dgxc-benchmarking v25.02.02, DGX H100 FP8"
DGXC_H100_FP8_V25_02 = dgxc_rows(
    _F2502,
    [
        ("Llama 3.1 8B", llama(32, 4096, 14336, 32, 8), 1, 1, 1, 2, 1, "none",
         [(8, 128, 9.44), (16, 256, 9.47), (32, 512, 9.60), (64, 1024, 9.64), (128, 2048, 9.73)]),
        ("Llama 3.1 70B", llama(80, 8192, 28672, 64, 8), 4, 4, 5, 2, 1, "none",
         [(64, 128, 10.46), (128, 256, 10.52), (256, 512, 10.75), (512, 1024, 10.76), (1024, 2048, 10.83),
          (2048, 4096, 10.99)]),
        ("Llama 3.1 405B, 7 layers", llama(7, 16384, 53248, 128, 16), 8, 1, 1, 2, 1, "none", [(32, 126, 5.75)]),
        ("Llama 3.1 405B, 21 layers", llama(21, 16384, 53248, 128, 16), 8, 3, 7, 2, 1, "none", [(96, 126, 5.63)]),
        ("Llama 3.1 405B, 42 layers", llama(42, 16384, 53248, 128, 16), 8, 3, 7, 2, 1, "none",
         [(192, 252, 10.8)]),
        ("Llama 3.1 405B", llama(126, 16384, 53248, 128, 16), 8, 9, 7, 2, 1, "none",
         [(576, 252, 11.00), (1152, 504, 11.10), (2304, 1008, 11.20)]),
        ("Nemotron-4 15B", nemotron(32, 6144, 48), 4, 1, 1, 1, 4, "none",
         [(16, 64, 2.039), (32, 128, 2.046), (64, 256, 2.048), (128, 512, 2.059), (256, 1024, 2.075),
          (512, 2048, 2.12), (1024, 4096, 2.094), (2048, 8192, 2.12)]),
        ("GPT-3 175B", GPT3_175B, 4, 8, 6, 1, 1, "none",
         [(128, 256, 5.626), (256, 512, 5.725), (512, 1024, 5.774), (1024, 2048, 5.82), (2048, 4096, 5.96)]),
    ],
    assumed=_D_ASSUMED + "; GPT-3 175B: VP 6, the release's configuration file (its README heading says 12)",
    fp8_format="hybrid",
)  # fmt: skip
_F2504 = "NVIDIA dgxc-benchmarking v25.04.02, DGX H100 FP8"
DGXC_H100_FP8_V25_04 = dgxc_rows(
    _F2504,
    [
        ("Llama 3.1 8B", llama(32, 4096, 14336, 32, 8), 1, 1, 1, 2, 1, "none",
         [(8, 128, 9.33), (16, 256, 9.36), (32, 512, 9.43), (64, 1024, 9.48), (128, 2048, 9.54)]),
        ("Llama 3.1 70B", llama(80, 8192, 28672, 64, 8), 4, 8, 5, 1, 1, "none",
         [(64, 128, 9.86), (128, 256, 9.95), (256, 512, 10), (512, 1024, 10.07), (1024, 2048, 10.08),
          (2048, 4096, 10.15)]),
        ("Llama 3.1 405B, 8 layers", llama(8, 16384, 53248, 128, 16), 8, 1, 1, 2, 1, "none", [(32, 64, 3.53)]),
        ("Llama 3.1 405B, 30 layers", llama(30, 16384, 53248, 128, 16), 8, 4, 8, 2, 1, "none", [(64, 64, 6.32)]),
        ("Llama 3.1 405B, 62 layers", llama(62, 16384, 53248, 128, 16), 8, 4, 8, 2, 1, "none",
         [(128, 128, 12.18)]),
        ("Llama 3.1 405B", llama(126, 16384, 53248, 128, 16), 8, 8, 8, 2, 1, "none",
         [(512, 256, 12.37), (1024, 512, 12.42), (2048, 1024, 12.56)]),
        ("Nemotron-4 15B", nemotron(32, 6144, 48), 2, 1, 1, 1, 2, "none",
         [(16, 64, 1.98), (32, 128, 1.98), (64, 256, 1.98), (128, 512, 1.99), (256, 1024, 2),
          (512, 2048, 2.02), (1024, 4096, 2.03), (2048, 8192, 2.09)]),
        ("Nemotron-4 340B", nemotron(96, 18432, 96), 8, 8, 12, 1, 1, "selective",
         [(256, 64, 2.93), (512, 128, 2.97), (1024, 256, 3), (2048, 512, 3.05)]),
    ],
    assumed=_D2504_ASSUMED,
    embedding_and_loss_in_split=("Llama 3.1 405B, 30 layers", "Llama 3.1 405B, 62 layers", "Llama 3.1 405B"),
    fp8_format="hybrid",
)  # fmt: skip
_F2505 = "NVIDIA dgxc-benchmarking v25.05.05, DGX H100 FP8"
DGXC_H100_FP8_V25_05 = dgxc_rows(
    _F2505,
    [
        ("Llama 3.1 405B", llama(126, 16384, 53248, 128, 16), 8, 8, 8, 2, 1, "none", [(512, 256, 13.020)]),
        ("Nemotron-4 15B", nemotron(32, 6144, 48), 2, 1, 1, 1, 2, "none", [(16, 64, 1.988)]),
        ("Nemotron-4 340B", nemotron(96, 18432, 96), 8, 8, 12, 1, 1, "selective", [(256, 64, 3.107)]),
    ],
    assumed=_D2504_ASSUMED,
    embedding_and_loss_in_split=("Llama 3.1 405B",),
    fp8_format="hybrid",
)  # fmt: skip
DGXC_LATER_RELEASES = {
    _D2502: DGXC_H100_V25_02,
    _D2504: DGXC_H100_V25_04,
    _D2505: DGXC_H100_V25_05,
    _F2502: DGXC_H100_FP8_V25_02,
    _F2504: DGXC_H100_FP8_V25_04,
    _F2505: DGXC_H100_FP8_V25_05,
}
"""The later dgxc-benchmarking releases' tables (BF16 and FP8), by source: validation rows."""


# Megatron-Bridge's performance summaries (github NVIDIA-NeMo/Megatron-Bridge, docs/performance-summary-archive.md at
# commit 067f987d): the DGX-H100 pre-training rows of dense models, NeMo containers 25.11 to 26.06, tokens per second
# per GPU. Llama 3 70B at TP 4, PP 8, VP 5 on 64 GPUs (global batch 128 in 25.11, 256 after) and Llama 3.1 405B at
# TP 8, PP 8, CP 2, VP 8 on 1,024 (512, then 1,536); sequence 8192, micro-batch 1. FP8 with current scaling: "FP8-CS"
# in 25.11's table, and from v0.3.0 (26.02) the releases' only H100 FP8 recipes are LLAMA3_70B_ and
# LLAMA31_405B_PRETRAIN_CONFIG_H100_FP8_CS (scripts/performance at tags v0.3.0 to v0.5.0). 25.09's rows do not say
# their precision: left out. The recipes' settings (those files, src/megatron/bridge/recipes/llama/llama3.py and
# training/mixed_precision.py's bf16_with_fp8_current_scaling_mixed): bf16 with FP8 GEMMs in the hybrid format and
# --fp8-recipe tensorwise, FP8 parameter gather, the distributed optimizer with overlapped reduction and gather, bf16
# gradient reduction (grad_reduce_in_fp32 False), SP, --tp-comm-overlap with the tuned userbuffer settings, fused
# attention, no recomputation, the cross entropy fused (Transformer Engine's, cross_entropy_fusion_impl "te"); the
# 405B counts the embedding and the loss as layers in its pipeline split. An even split of the 70B: its explicit
# layout came in August 2026, after these releases. The settings are published whole, but the table misses the
# validation goal (docs/layout-model.md): listed as a comparison, each row's sign and size checked.
_B = "Megatron-Bridge performance summary (067f987d), NeMo 25.11-26.06, DGX H100 FP8 current scaling"
_B_ASSUMED = (
    "bf16, FP8 hybrid with --fp8-recipe tensorwise; Transformer Engine's "
    "cross entropy priced as Megatron-Core's fused one; no recompute"
)
MEGATRON_BRIDGE_H100_FP8 = [
    _row(
        table=_B, name=f"{name} ({release})", gpu="h100-sxm", model=model, heads=model.num_attention_heads,
        hidden=model.hidden_size, layers=model.num_layers, seq_length=model.seq_length,
        vocab_size=int(model.vocab_size or 0), tp=tp, pp=pp, vp=vp, cp=cp, gpus=gpus, global_batch=batch,
        micro_batch=1, sequence_parallel=True, distributed_optimizer=True, overlap=True, tp_comm_overlap=True,
        grad_reduce_in_bf16=True, fp8_format="hybrid", fp8_recipe="tensorwise", fp8_param_gather=True,
        attention="auto", ce_fusion=True,
        embedding_and_loss_in_split=name.startswith("Llama 3.1 405B"), tokens_per_gpu_s=tokens, comparison=True,
        assumed=_B_ASSUMED,
    )
    for release, name, model, gpus, batch, tp, pp, cp, vp, tokens in [
        ("25.11", "Llama 3 70B", llama(80, 8192, 28672, 64, 8), 64, 128, 4, 8, 1, 5, 1602),
        ("26.02", "Llama 3 70B", llama(80, 8192, 28672, 64, 8), 64, 256, 4, 8, 1, 5, 1621),
        ("26.02.01", "Llama 3 70B", llama(80, 8192, 28672, 64, 8), 64, 256, 4, 8, 1, 5, 1639),
        ("26.04", "Llama 3 70B", llama(80, 8192, 28672, 64, 8), 64, 256, 4, 8, 1, 5, 1633),
        ("26.04.01", "Llama 3 70B", llama(80, 8192, 28672, 64, 8), 64, 256, 4, 8, 1, 5, 1664),
        ("25.11", "Llama 3.1 405B", llama(126, 16384, 53248, 128, 16), 1024, 512, 8, 8, 2, 8, 292),
        ("26.02", "Llama 3.1 405B", llama(126, 16384, 53248, 128, 16), 1024, 1536, 8, 8, 2, 8, 311),
        ("26.04.01", "Llama 3.1 405B", llama(126, 16384, 53248, 128, 16), 1024, 1536, 8, 8, 2, 8, 328),
        ("26.06", "Llama 3.1 405B", llama(126, 16384, 53248, 128, 16), 1024, 1536, 8, 8, 2, 8, 326),
    ]
]  # fmt: skip


# NVIDIA NeMo's performance summary (github NVIDIA/NeMo, docs/source/performance/performance_summary.md at commit
# 8e3d65dc, "24.07 perf numbers", September 2024; later moved to docs.nvidia.com): pre-training on DGX H100 at FP8,
# NeMo 24.07; per row GPUs, global batch, micro-batch, sequence, TP, PP, CP, VP and tokens per second per GPU.
# Not published: the models' shapes (from NeMo's configurations at that commit: GPTConfig5B / 20B, Llama 2 and 3,
# Nemotron3Config8B and Nemotron4Config22B with one key/value head per query head, Nemotron4Config340B), the
# recipes' settings (taken as the dgxc-benchmarking recipes': bf16 with FP8 GEMMs in the hybrid format, the
# distributed optimizer, overlapped reduction and all-gather, bf16 gradient reduction, SP, --tp-comm-overlap,
# fused attention, recomputation none but selective for the 340B); the cross entropy fused where NeMo-Framework-
# Launcher 24.07's training configuration of the model sets cross_entropy_loss_fusion (Llama 3 8B and 70B, Nemotron
# 8B and 22B), not for the others (GPT-3, Llama 2, Nemotron 340B). The table misses the validation goal: a
# comparison, not a validation (docs/layout-model.md).
_N = "NVIDIA NeMo performance summary (8e3d65dc), NeMo 24.07, DGX H100 FP8"
_N_ASSUMED = (
    "shapes from NeMo's model configurations; the dgxc recipes' settings (bf16 gradient reduction, overlaps, SP, "
    "--tp-comm-overlap, fused attention), --fp8-format hybrid; recompute none but selective for the 340B; GPT-3 "
    "vocabulary 51,200; the parameters gathered in bf16 (NeMo-Framework-Launcher 24.07's training configurations "
    "of these models do not set fp8_params)"
)
NEMO_24_07_FP8 = [
    _row(
        table=_N, name=name, gpu="h100-sxm", model=model, heads=model.num_attention_heads, hidden=model.hidden_size,
        layers=model.num_layers, seq_length=model.seq_length, vocab_size=int(model.vocab_size or 0), tp=tp, pp=pp,
        vp=vp, cp=cp, gpus=gpus, global_batch=batch, micro_batch=mb, recompute=recompute, sequence_parallel=tp > 1,
        distributed_optimizer=True, overlap=True, tp_comm_overlap=True, grad_reduce_in_bf16=True,
        fp8_format="hybrid", attention="auto", tokens_per_gpu_s=tokens, comparison=True, assumed=_N_ASSUMED,
        ce_fusion=name.startswith(("LLAMA3", "Nemotron-8B", "Nemotron-22B")),
    )
    for name, model, gpus, batch, mb, tp, pp, cp, vp, recompute, tokens in [
        ("GPT3-5B", gpt3(24, 4096, 32), 64, 2048, 4, 1, 1, 1, 1, "none", 23406),
        ("GPT3-20B", gpt3(44, 6144, 48), 64, 256, 2, 2, 1, 1, 1, "none", 5851),
        ("GPT3-175B on 128", GPT3_175B, 128, 256, 1, 4, 8, 1, 6, "none", 716),
        ("GPT3-175B on 512", GPT3_175B, 512, 2048, 2, 4, 8, 1, 6, "none", 825),
        ("LLAMA2-7B", llama2(32, 4096, 11008, 32, 32), 8, 128, 1, 1, 1, 1, 1, "none", 16934),
        ("LLAMA2-13B", llama2(40, 5120, 13824, 40, 40), 16, 128, 1, 1, 4, 1, 10, "none", 8715),
        ("LLAMA2-70B", llama2(80, 8192, 28672, 64, 8), 64, 128, 1, 4, 4, 1, 20, "none", 1728),
        ("Nemotron-8B", nemotron(32, 4096, 32, groups=32), 64, 256, 4, 2, 1, 1, 1, "none", 12507),
        ("Nemotron-22B", nemotron(40, 6144, 48, groups=48), 64, 256, 2, 2, 4, 1, 10, "none", 4312),
        ("Nemotron-340B", nemotron(96, 18432, 96), 128, 32, 1, 8, 8, 1, 12, "selective", 326),
        ("LLAMA3-8B", llama(32, 4096, 14336, 32, 8), 8, 128, 1, 1, 1, 2, 1, "none", 12273),
        ("LLAMA3-70B", llama(80, 8192, 28672, 64, 8), 64, 128, 1, 4, 4, 2, 5, "none", 1524),
    ]
]  # fmt: skip


# MLPerf Training v3.1 (November 2023), GPT-3 175B closed division, NVIDIA's and Azure's submissions on DGX H100
# (Eos) and ND H100 v5: mlcommons/training_results_v3.1 at d06288b2. The layout from the submission's
# NVIDIA/benchmarks/gpt3/implementations/pytorch: config_DGXH100_<nodes>x8x<minibatch>x4x8_mbs1.sh (TP 4, PP 8,
# micro-batch 1, FP8 in the hybrid format, --tp-comm-overlap), config_common.sh and conf/custom.yaml (NeMo 23.09:
# bf16 with TE, SP, interleaving over 12 virtual stages, overlapped p2p, no recomputation, no dropout,
# layernorm-1p) and conf/optim/distributed_fused_adam.yaml (the distributed optimizer, gradients reduced in bf16,
# overlapped with the backward pass and the parameters' gather with the forward). The global batch is each
# run's log's (``global_batch_size``, with ``gradient_accumulation_steps`` the microbatches per pipeline: the 64-node
# config file says 192 sequences per replica, its logs 2048 in all); the step time is the median of the
# ``train_step_timing`` the logs record every step, over every result file of the system (3 each, 474 to 864 steps).
_M = "MLPerf Training v3.1 (d06288b2), GPT-3 175B, H100 FP8"
_M_ASSUMED = (
    "the tokenizer's size is not in the submission: GPT-3's 51,200 as the other GPT-3 rows (the logits are under "
    "1 % of the step); Transformer Engine's fused attention; the result directories' node counts times 8 GPUs"
)


def mlperf_gpt3(
    table: str, name: str, gpus: int, batch: int, step: float, *, pp: int = 8, vp: int = 12, micro: int = 1, **more: Any
) -> PublishedRun:
    """One run of NVIDIA's MLPerf Training GPT-3 175B recipe on H100 (v3.1 and later): TP 4, SP, the distributed
    optimizer with bf16 gradients and overlapped reduction and gather, --tp-comm-overlap, FP8 in the hybrid format,
    Transformer Engine's attention, GPT-3's shape and 51,200-token vocabulary; ``more``: what a round adds."""
    return _row(
        table=table, name=name, gpu="h100-sxm", model=GPT3_175B, layers=96, hidden=12288, heads=96, seq_length=2048,
        vocab_size=51200, tp=4, pp=pp, vp=vp, gpus=gpus, global_batch=batch, micro_batch=micro, sequence_parallel=True,
        distributed_optimizer=True, overlap=True, tp_comm_overlap=True, grad_reduce_in_bf16=True,
        fp8_format="hybrid", attention="auto", step_s=step, assumed=_M_ASSUMED, **more,
    )  # fmt: skip


MLPERF_V31_GPT3 = [
    mlperf_gpt3(_M, name, gpus, batch, step)
    for name, gpus, batch, step in [
        ("eos_n64 (512 GPUs)", 512, 2048, 11.052),
        ("eos_n96 (768 GPUs)", 768, 3072, 11.075),
        ("eos-dfw_n512 (4,096 GPUs)", 4096, 2048, 1.6088),
        ("eos-dfw_n768 (6,144 GPUs)", 6144, 3072, 1.6153),
        ("eos-dfw_n1024 (8,192 GPUs)", 8192, 4096, 1.6193),
        ("eos-dfw_n1280 (10,240 GPUs)", 10240, 2560, 0.9256),
        ("eos-dfw_n1344 (10,752 GPUs)", 10752, 2688, 0.9296),
        ("Azure ND_H100_v5_n1344 (10,752 GPUs)", 10752, 2688, 0.9473),
    ]
]  # fmt: skip


# MLPerf Training v4.0 (June 2024), GPT-3 175B closed division, NVIDIA's submissions on DGX H100 (Eos):
# mlcommons/training_results_v4.0 at 6fe95437, NVIDIA/benchmarks/gpt3/implementations/nemo (NeMo 24.04). The same recipe as v3.1's
# (conf/custom.yaml, conf/optim/distributed_fused_adam.yaml: bf16 gradient reduction, overlapped, SP, no
# recomputation, no dropout, layernorm-1p; config_fp8.sh: hybrid FP8, delayed scaling), with other layouts and, new,
# the FP8 weights gathered in FP8 (config_common.sh: FP8_PARAMS=True, the model's fp8_params): on 64 nodes
# config_DGXH100_64x8x128x4x8_mbs2.sh, TP 4, PP 8, 4 virtual stages, micro-batch 2 (and the GPUs' voltage boost,
# VBOOST_VALUE=1); on 1,344 and 1,452 nodes config_DGXH100_<nodes>x8x6x4x6_mbs1_cg.sh, TP 4, PP 6, 8 virtual stages,
# micro-batch 1, the layers captured in CUDA graphs (LAYER_CUDA_GRAPH=1). These logs record no per-step time: the
# step time is each training block's (between two evaluations: block_start to block_stop, its epoch_count tokens over
# the sequence and the global batch giving 9 to 11 steps), the first block left out (it includes warm-up), the median
# over the run's blocks, then over the system's three runs. Global batch and microbatches from the logs
# (global_batch_size, gradient_accumulation_steps). Every row is within 10 %, all slower in the estimate than they
# ran, and the table's median misses the 5 % goal: listed as a comparison (docs/layout-model.md).
_M4 = "MLPerf Training v4.0 (6fe95437), GPT-3 175B, H100 FP8"
MLPERF_V40_GPT3 = [
    mlperf_gpt3(_M4, name, gpus, batch, step, pp=pp, vp=vp, micro=micro, fp8_param_gather=True, comparison=True)
    for name, gpus, pp, vp, micro, batch, step in [
        ("eos_n64 (512 GPUs)", 512, 8, 4, 2, 2304, 10.9822),
        ("eos-dfw_n1344 (10,752 GPUs)", 10752, 6, 8, 1, 2688, 0.9207),
        ("eos-dfw_n1452 (11,616 GPUs)", 11616, 6, 8, 1, 2904, 0.9214),
    ]
]  # fmt: skip

# MLPerf Training v4.1 (November 2024), GPT-3 175B, the H100 submissions new in the round
# (mlcommons/training_results_v4.1 at b87b9e39): NVIDIA's on 32 and 64 DGX H100 nodes (NeMo 24.09,
# NVIDIA/benchmarks/gpt3/implementations/eos_n{32,64}_ngc24.09_nemo: TP 4, PP 8, 6 virtual stages, micro-batch 2, the
# voltage boost on 64 nodes) and Oracle's on 192 and 384 nodes of its BM.GPU.H100.8 cloud (RoCE,
# Oracle/benchmarks/gpt3/DGXH100_128x8x64x4x8_mbs2: the same recipe with 4 virtual stages); both with the FP8 weights
# gathered in FP8 (FP8_PARAMS=True) and v4.0's other settings. Step times from the logs' training blocks, as v4.0's;
# NVIDIA's 1,452-node run repeats v4.0's figures and is left out. The model misses the goal on both submitters
# (docs/layout-model.md, "A fourth comparison"): listed as a comparison.
_M41 = "MLPerf Training v4.1 (b87b9e39), GPT-3 175B, H100 FP8"
MLPERF_V41_GPT3 = [
    mlperf_gpt3(_M41, name, gpus, batch, step, vp=vp, micro=2, fp8_param_gather=True, comparison=True)
    for name, gpus, vp, batch, step in [
        ("NVIDIA eos_n32 (256 GPUs)", 256, 6, 2048, 18.4073),
        ("NVIDIA eos_n64 (512 GPUs)", 512, 6, 2048, 9.5403),
        ("Oracle 1536xBM.GPU.H100.8 (1,536 GPUs)", 1536, 4, 3072, 5.2367),
        ("Oracle 3072xBM.GPU.H100.8 (3,072 GPUs)", 3072, 4, 3072, 3.3261),
    ]
]  # fmt: skip


# MLPerf Training v5.0 (June 2025), Llama 3.1 405B pre-training, NVIDIA's DGX H100 submissions
# (mlcommons/training_results_v5.0 at 0fdc28f0, NVIDIA/benchmarks/llama31_405b/implementations/eos-dfw_n*_ngc25.01_nemo,
# NeMo 25.01): config_DGXH100_<nodes>x8x<minibatch>xtp8pp8cp2.sh and config_common.sh give TP 8, PP 8, 8 virtual
# stages, CP 2, micro-batch 1, --tp-comm-overlap, the distributed optimizer with overlapped reduction and gather, FP8
# (fp8 without fp8_hybrid: E4M3, delayed scaling) with the weights gathered in FP8 (FP8_PARAMS=True), the embedding
# and the loss counted in the pipeline split (ASYM_PP_EMBED, ASYM_PP_LOSS); conf/custom.yaml SP, the cross entropy
# fused, no recomputation, sequence 8192, 126 layers; pretrain.py Llama31Config405B with bf16 gradient reduction
# (grad_reduce_in_fp32=False); the benchmark's tokenizer is Mixtral 8x22B's, 32,768 tokens (the README). The step
# time is the median of the train_step_time the logs record every step (the first left out), then over the
# system's three runs; global batch from the logs.
_M5 = "MLPerf Training v5.0 (0fdc28f0), Llama 3.1 405B, H100 FP8"


def mlperf_llama_405b(
    table: str, name: str, gpus: int, batch: int, step: float, *, gpu: str = "h100-sxm", tp: int = 8
) -> PublishedRun:
    """One run of NVIDIA's MLPerf Training Llama 3.1 405B recipe (NeMo 25.01, v5.0 and later): PP 8, VP 8, CP 2,
    micro-batch 1, SP, --tp-comm-overlap, the distributed optimizer with bf16 gradients and overlapped reduction and
    gather, E4M3 FP8 with the weights gathered in FP8, the embedding and the loss counted in the pipeline split, the
    cross entropy fused, Mixtral 8x22B's 32,768-token vocabulary."""
    return _row(
        table=table, name=name, gpu=gpu, model=dataclasses.replace(llama(126, 16384, 53248, 128, 16),
        vocab_size=32768), layers=126, hidden=16384, heads=128, seq_length=8192, vocab_size=32768, tp=tp, pp=8, vp=8,
        cp=2, gpus=gpus, global_batch=batch, micro_batch=1, sequence_parallel=True, distributed_optimizer=True,
        overlap=True, tp_comm_overlap=True, grad_reduce_in_bf16=True, fp8_format="e4m3", fp8_param_gather=True,
        attention="auto", ce_fusion=True, embedding_and_loss_in_split=True, step_s=step,
    )  # fmt: skip


MLPERF_V50_LLAMA_405B = [
    mlperf_llama_405b(_M5, name, gpus, batch, step)
    for name, gpus, batch, step in [
        ("eos-dfw_n64 (512 GPUs)", 512, 1152, 55.1433),
        ("eos-dfw_n256 (2,048 GPUs)", 2048, 1152, 14.222),
        ("eos-dfw_n304 (2,432 GPUs)", 2432, 1216, 12.7117),
        ("eos-dfw_n320 (2,560 GPUs)", 2560, 1120, 11.1732),
        ("eos-dfw_n1024 (8,192 GPUs)", 8192, 1536, 5.1804),
    ]
]  # fmt: skip

# MLPerf Training v5.1 (November 2025), Llama 3.1 405B, Nebius's H200 submissions (mlcommons/training_results_v5.1 at
# 441d65f4, Nebius/benchmarks/llama31_405b/implementations/nebius_h200_n{64,128}; systems/nebius_h200_n*.json: H200 SXM
# 141 GB at 700 W, NVLink 4, 8× NDR 400 Gb/s InfiniBand a node, NeMo 25.01): NVIDIA's v5.0 recipe (config_common.sh the
# same but for NVLink SHARP left on) at TP 4 instead of 8 (config_DGXH200_<nodes>x8x<microbatches>xtp4pp8cp2.sh), on
# 512 and 1,024 GPUs, global batch 1,152 and 144 or 72 microbatches a pipeline (the logs' global_batch_size and
# gradient_accumulation_steps). Step time as v5.0's: the median of the logs' train_step_time (the first left out),
# then over the three runs. No H200 run fits a constant: the profile is the H100's but for its memory and bandwidth.
_M51 = "MLPerf Training v5.1 (441d65f4), Llama 3.1 405B, H200 FP8"
MLPERF_V51_LLAMA_405B_H200 = [
    mlperf_llama_405b(_M51, name, gpus, 1152, step, gpu="h200", tp=4)
    for name, gpus, step in [
        ("Nebius nebius_h200_n64 (512 GPUs)", 512, 50.0137),
        ("Nebius nebius_h200_n128 (1,024 GPUs)", 1024, 25.3561),
    ]
]


# MegaScale (Jiang et al., NSDI 2024, arXiv 2402.15627), Table 2: its baseline, Megatron-LM at commit 285068c8,
# training a 175B GPT (Table 1: 96 layers, hidden 12288, 128 heads, TP 8, PP 8; §6.1: six interleaved stages,
# sequence 2048, vocabulary 64,000) on NVIDIA Ampere GPUs at a batch of 768 (256 to 1,024 GPUs) and 6,144 (3,072 to
# 12,288 GPUs), one iteration time each. Megatron-LM at that commit (its mirror) reduces the gradients after the
# backward pass in fp32 (bf16 training forces fp32 accumulation and all-reduce), overlaps no pipeline transfer,
# and runs Megatron's fused softmax unless --use-flash-attn is given.
_S = "MegaScale (NSDI 2024), Table 2, Megatron-LM 285068c8, 175B"
_S_ASSUMED = (
    "A100 80 GB, bf16, micro-batch 1; the code's defaults for what is off unless set (no distributed optimizer, "
    "no flash attention); which fit in memory only with the memory savings Korthikanti et al. 2022 ran their 175B "
    "with on this code: sequence parallelism and selective recomputation"
)
MEGASCALE_175B = [
    _row(
        table=_S, name=f"175B on {gpus}", gpu="a100-80g", layers=96, hidden=12288, heads=128, seq_length=2048,
        vocab_size=64000, tp=8, pp=8, vp=6, gpus=gpus, global_batch=batch, micro_batch=1, precision="bf16",
        recompute="selective", sequence_parallel=True, p2p_overlap=False, step_s=step, assumed=_S_ASSUMED,
    )
    for gpus, batch, step in [
        (256, 768, 40.0), (512, 768, 21.2), (768, 768, 15.2), (1024, 768, 11.9),
        (3072, 6144, 29.02), (6144, 6144, 14.78), (8192, 6144, 12.24), (12288, 6144, 8.57),
    ]
]  # fmt: skip


ALL = (
    NARAYANAN_TABLE_1
    + KORTHIKANTI_2022
    + MEGATRON_LM_A100_175B
    + DGXC_H100
    + DGXC_H100_V25_02
    + DGXC_H100_V25_04
    + DGXC_H100_V25_05
    + DGXC_H100_FP8_V25_02
    + DGXC_H100_FP8_V25_04
    + DGXC_H100_FP8_V25_05
    + MEGATRON_LM_H100
    + NEMO_24_07_FP8
    + MEGATRON_BRIDGE_H100_FP8
    + MLPERF_V31_GPT3
    + MLPERF_V40_GPT3
    + MLPERF_V41_GPT3
    + MLPERF_V50_LLAMA_405B
    + MLPERF_V51_LLAMA_405B_H200
    + MEGASCALE_175B
)
CALIBRATION = [r for r in ALL if r.calibration]
VALIDATION = [r for r in ALL if not r.calibration and not r.comparison]
COMPARISON = [r for r in ALL if r.comparison]


def worst(rows: list[PublishedRun], gpu: GpuProfile) -> float:
    """The largest residual (in size) of ``rows`` on ``gpu``."""
    return max(abs(r.residual(gpu)) for r in rows)


def with_constants(gpu: GpuProfile, **constants: Any) -> GpuProfile:
    """``gpu`` with some efficiency constants replaced."""
    return dataclasses.replace(gpu, **constants)


def residual_table(rows: Sequence[PublishedRun]) -> list[str]:
    """Every row's measurement, estimate and residual as the markdown table of ``docs/layout-model.md``
    (``bench/calibrate_time_model.py --markdown`` prints it; ``test_layout_model_doc.py`` keeps the docs current)."""
    lines = [
        "| table | run | GPU | TP | PP | VP | DP | measured | predicted | residual | set |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        e = r.estimate()
        if r.step_s is not None:
            measured, predicted = f"{r.step_s:g} s", f"{e.time.step_s:.2f} s"
        elif r.tokens_per_gpu_s is not None:
            measured = f"{r.tokens_per_gpu_s:g} tokens/s/GPU"
            predicted = f"{r.predicted_tokens_per_gpu_s(e):.0f} tokens/s/GPU"
        else:
            value = e.hardware_tflops_per_gpu if r.hardware_flops else e.tflops_per_gpu
            measured, predicted = f"{r.tflops:g} TFLOP/s", f"{value:.1f} TFLOP/s"
        lines.append(
            f"| {r.table} | {r.name} | {r.gpu} | {r.tp} | {r.pp} | {r.vp} | {e.layout.dp} | {measured} | "
            f"{predicted} | {r.residual():+.1%} | "
            f"{'calibration' if r.calibration else 'comparison' if r.comparison else 'validation'} |"
        )
    return lines


def data_parallel_growth(rows: Sequence[PublishedRun]) -> list[tuple[str, int, int, float, float]]:
    """Each model's sweep at a fixed load per GPU: (model, first and last GPU count, the measured and the predicted
    growth of the step time between them). Proxies with fewer layers are not part of a sweep."""
    sweeps: dict[str, list[PublishedRun]] = {}
    for r in rows:
        model = r.name.rsplit(" on ", 1)[0]
        if "layers" not in model:
            sweeps.setdefault(model, []).append(r)
    growth = []
    for model, sweep in sweeps.items():
        first, last = sweep[0], sweep[-1]
        assert first.step_s is not None and last.step_s is not None, model
        predicted = last.estimate().time.step_s / first.estimate().time.step_s - 1
        growth.append((model, first.gpus, last.gpus, last.step_s / first.step_s - 1, predicted))
    return growth


def measured_again(rows: Sequence[PublishedRun]) -> list[list[PublishedRun]]:
    """Runs the calculator cannot tell apart (the same GPU, workload and layout, so one estimate) that more than
    one table published: each group in table order, the groups by the spread of their measured step times
    (``spread``), widest first."""
    groups: dict[str, list[PublishedRun]] = {}
    for r in rows:
        groups.setdefault(repr((r.gpu, r.workload(), r.layout())), []).append(r)
    repeated = [group for group in groups.values() if len({r.table for r in group}) > 1]
    return sorted(repeated, key=spread, reverse=True)


def spread(group: Sequence[PublishedRun]) -> float:
    """How much longer the slowest measurement of ``group`` took than the fastest, as a fraction."""
    steps = [r.measured_step_s() for r in group]
    return max(steps) / min(steps) - 1


def measured_again_table(groups: Sequence[Sequence[PublishedRun]]) -> list[str]:
    """``groups`` (``measured_again``) as the markdown table of ``docs/layout-model.md``: each run, where it was
    measured, its step times there and their spread."""
    lines = ["| run | measured in | step times | spread |", "|---|---|---|---|"]
    for group in groups:
        first = group[0]
        precision = f"FP8 {first.fp8_recipe}" if first.fp8_format else first.precision.upper()
        steps = ", ".join(f"{r.measured_step_s():.2f} s" for r in group)
        lines.append(
            f"| {first.name}, {precision} | {', '.join(_source(r.table) for r in group)} | {steps} | "
            f"{spread(group):.1%} |".replace("%", " %")
        )
    return lines


def _source(table: str) -> str:
    """A table's name up to its first comma, a dgxc-benchmarking release by its tag alone."""
    return table.removeprefix("NVIDIA dgxc-benchmarking ").split(",")[0]

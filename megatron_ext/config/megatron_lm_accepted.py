"""Megatron-LM flags accepted without a field of their own: deprecated aliases, flags that change nothing in GPT
pretraining, and flags Megatron-LM has since removed that old launch scripts still carry.

The rule (``docs/megatron-lm-flags.md``): what Megatron-LM's ``pretrain_gpt.py`` accepts is accepted here,
unless honouring it would change the result and this project cannot match it. So:

* an **alias** is parsed as the flags it stands for, as Megatron-LM's ``validate_args`` maps it;
* a flag that **changes nothing** here is accepted and said once, with Megatron-LM's own words where it prints
  some (``--use-dist-ckpt``), else with why it changes nothing (read only by legacy models, by the BERT, vision
  or serving entry points, ...);
* some are accepted **for some values only**: the value that changes nothing (``--data-impl mmap``);
* a setting of how Megatron-LM runs that leaves the result the same (a process priority of its background
  checkpoint writer) is accepted and said to be **ignored** here, with why;
* a flag **removed** from Megatron-LM is accepted where its value means what this project does, and otherwise
  refused with when it was removed and what replaced it.

Every accepted flag is named in ``TrainingConfig.adjustments`` (printed by the run and by ``--dry-run``): never
accepted silently. Evidence for each entry is Megatron-LM core_v0.19.0 (``megatron/training/arguments.py``
unless said otherwise).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Given = Mapping[str, Mapping[str, Any]]
"""The parsed values by argument group (``{"model": {...}, "run": {...}}``): what a condition reads."""


@dataclass(frozen=True)
class Accepted:
    """How one Megatron-LM flag without a field of its own is taken."""

    note: str
    """Said when the flag is given: Megatron-LM's own text where it prints one, else why it changes nothing."""
    stands_for: tuple[str, ...] = ()
    """Our flags it is parsed as (an alias); the flag's own values follow them."""
    values: tuple[str, ...] | None = None
    """The values accepted (None: any); another value is refused with ``otherwise``."""
    otherwise: str = ""
    """Why another value is refused."""
    unless_given: str | None = None
    """An alias that applies only when this flag of ours is not given (otherwise it is ignored)."""
    condition: Callable[[Given], str | None] | None = None
    """A check against the other flags: None when it changes nothing, else why it is refused."""
    check_value: Callable[[Given, str], str | None] | None = None
    """A check of the flag's value against the other flags: None when accepted, else why it is refused."""
    refused: str = ""
    """Why the flag is refused whatever its value (a feature this project does not build); '' when accepted."""


def _rope_only(given: Given) -> str | None:
    # arguments.py:999-1000: Megatron-LM raises unless the rotary embedding replaces the learned one.
    if given.get("model", {}).get("position_embedding_type") == "rope":
        return None
    return (
        "--no-position-embedding is deprecated, use --position-embedding-type (Megatron-LM accepts it only with "
        "--position-embedding-type rope; give --position-embedding-type none for no position embedding)"
    )


def _ignored(flags: str, why: str) -> dict[str, Accepted]:
    return dict.fromkeys(flags.split(), Accepted(f"ignored: {why}"))


BERT_T5 = "read only by Megatron-LM's BERT and T5 models, not by GPT pretraining (Megatron-LM ignores it there too)"
ICT = "read only by Megatron-LM's ICT and biencoder retrieval training, not by GPT pretraining"
VISION = "read only by Megatron-LM's vision models (ViT, Swin, DINO), not by GPT pretraining"
SERVING = "an option of Megatron-LM's text-generation server, not read by GPT pretraining"
LEGACY = "read only by Megatron-LM's legacy (non-Megatron-Core) models; Megatron-Core's GPTModel ignores it"
CKPT_WRITER = (
    "a setting of Megatron-LM's background checkpoint writer (its process's CPU and I/O priority, shared-memory "
    "copies, worker threads, nvidia-resiliency-ext's or Megatron-Core's strategy), which Megatron-LM runs only with "
    "--use-persistent-ckpt-worker; --async-save here writes through Megatron-Core's own async queue, and the "
    "checkpoint written is the same"
)

ACCEPTED: dict[str, Accepted] = {
    # ---- deprecated aliases (validate_args maps them)
    "--recompute-activations": Accepted(
        "--recompute-activations: Megatron-LM's shorthand for --recompute-granularity selective",
        stands_for=("--recompute-granularity", "selective"),
    ),
    "--use-rotary-position-embeddings": Accepted(
        "--use-rotary-position-embeddings: Megatron-LM's legacy spelling of --position-embedding-type rope",
        stands_for=("--position-embedding-type", "rope"),
    ),
    "--moe-layer-recompute": Accepted(
        "--moe-layer-recompute is deprecated. Use --recompute-granularity selective --recompute-modules moe_layer "
        "instead. (A dense GPT has no MoE layer: this is --recompute-granularity selective.)",
        stands_for=("--recompute-granularity", "selective"),
    ),
    "--persistent-save-interval": Accepted(
        "--persistent-save-interval: Megatron-LM's alias of --save-interval", stands_for=("--save-interval",)
    ),
    "--encoder-num-layers": Accepted(
        "--encoder-num-layers: taken as --num-layers, which it stands for when --num-layers is not given "
        "(as Megatron-LM does)",
        stands_for=("--num-layers",),
        unless_given="--num-layers",
    ),
    "--encoder-seq-length": Accepted(
        "--encoder-seq-length: taken as --seq-length, which it stands for when --seq-length is not given "
        "(as Megatron-LM does)",
        stands_for=("--seq-length",),
        unless_given="--seq-length",
    ),
    "--disable-align-grad-reduce": Accepted(
        "--disable-align-grad-reduce: Megatron-LM's other spelling of --no-align-grad-reduce",
        stands_for=("--no-align-grad-reduce",),
    ),
    "--no-weight-decay-cond-type": Accepted(
        "WARNING: --no-weight-decay-cond-type is deprecated. Please use --apply-wd-to-qk-layernorm instead.",
        stands_for=("--apply-wd-to-qk-layernorm",),
        values=("apply_wd_to_qk_layernorm",),
        otherwise="Megatron-LM's only choice is apply_wd_to_qk_layernorm",
    ),
    "--no-position-embedding": Accepted(
        "--no-position-embedding: no learned position embedding, as --position-embedding-type rope already gives",
        condition=_rope_only,
    ),
    # ---- deprecated switches that Megatron-LM parses and ignores, with its own message where it prints one
    "--use-dist-ckpt": Accepted(
        "--use-dist-ckpt is deprecated and has no effect. Use --ckpt-format to select the checkpoint format."
    ),
    "--dist-ckpt-format": Accepted(
        "--dist-ckpt-format is deprecated and has no effect. Use --ckpt-format to select the checkpoint format."
    ),
    "--ckpt-fully-parallel-save-process-group": Accepted(
        "checkpoints are saved fully parallel over the data-parallel group (with context parallelism): Megatron-LM's "
        "default, dp",
        values=("dp",),
        otherwise="checkpoints are saved fully parallel over the data-parallel group (dp, Megatron-LM's default); "
        "the expert data-parallel group is a mixture-of-experts layout, which this project does not build",
    ),
    "--disable-msc": Accepted(
        "--disable-msc is deprecated and will be removed in a future release. MSC is now disabled by default; pass "
        "--enable-msc to opt in. (This project reads files only: --enable-msc is refused.)"
    ),
    **_ignored(
        "--use-flash-attn",
        "Megatron-LM reads it only in its legacy models; with Megatron-Core the attention kernel follows "
        "--attention-backend (and Transformer Engine picks flash attention where it applies)",
    ),
    **_ignored(
        "--dist-ckpt-save-pre-mcore-014 --exit-signal-handler-for-dataloader", "nothing in Megatron-LM reads it"
    ),
    **_ignored("--onnx-safe --apply-residual-connection-post-layernorm", LEGACY),
    **_ignored(
        "--no-one-logger",
        "NVIDIA's one-logger telemetry (an internal tool, Megatron-LM's help says) is never started here, so there is "
        "nothing to switch off; --metrics-file, --tensorboard-dir and --wandb-project record the run",
    ),
    **_ignored(
        "--chat-template",
        "read only by the tokenizer's apply_chat_template (supervised fine-tuning, chat inference); GPT "
        "pretraining never formats a conversation",
    ),
    **_ignored(
        "--async-ckpt-cpu-priority --async-ckpt-io-priority --async-ckpt-use-cpu-shm --async-strategy "
        "--dist-ckpt-workers",
        CKPT_WRITER,
    ),
    **_ignored(
        "--local-rank",
        "the local rank is read from LOCAL_RANK, which torchrun, srun (through the recipes) and "
        "torch.distributed.launch --use-env set",
    ),
    # ---- options of other Megatron-LM entry points, which its pretrain_gpt.py parses and never reads
    **_ignored(
        "--bert-no-binary-head --decoder-num-layers --mask-prob --short-seq-prob --relative-attention-num-buckets "
        "--relative-attention-max-distance --bert-embedder-type --output-bert-embeddings",
        BERT_T5,
    ),
    **_ignored(
        "--ict-head-size --biencoder-projection-dim --biencoder-shared-query-context-model --ict-load --bert-load "
        "--titles-data-path --query-in-block-prob --use-one-sent-docs --evidence-data-path "
        "--retriever-report-topk-accuracies --retriever-score-scaling --block-data-path --embedding-path "
        "--indexer-batch-size --indexer-log-interval",
        ICT,
    ),
    **_ignored(
        "--num-classes --img-h --img-w --num-channels --patch-dim --classes-fraction --data-per-class-fraction "
        "--head-lr-mult --vision-backbone-type --swin-backbone-type --mask-type --mask-factor "
        "--iter-per-epoch --dino-local-img-size --dino-local-crops-number --dino-head-hidden-size "
        "--dino-bottleneck-size --dino-freeze-last-layer --dino-norm-last-layer --dino-warmup-teacher-temp "
        "--dino-teacher-temp --dino-warmup-teacher-temp-epochs",
        VISION,
    ),
    **_ignored(
        "--inference-max-requests --inference-max-seq-length --inference-dynamic-batching "
        "--inference-dynamic-batching-buffer-size-gb --inference-dynamic-batching-block-size "
        "--inference-dynamic-batching-max-requests --inference-dynamic-batching-max-tokens "
        "--inference-dynamic-batching-num-cuda-graphs --inference-dynamic-batching-paused-buffer-size-gb "
        "--inference-dynamic-batching-cuda-graph-mixed-prefill-count "
        "--inference-dynamic-batching-track-paused-request-events --inference-dynamic-batching-unified-memory-level "
        "--inference-coordinator-port --inference-logging-step-interval --inference-wandb-logging "
        "--no-inference-wandb-logging --enable-chunked-prefill --use-legacy-static-engine "
        "--max-tokens-to-oom --flash-decode --mlp-chunks-for-prefill --nccl-all-reduce-for-prefill "
        "--decode-only-cuda-graphs",
        SERVING,
    ),
    **_ignored("--sample-rate", "read only by Megatron-LM's non-GPT datasets"),
}
"""Every Megatron-LM (core_v0.19.0) flag accepted without a field of its own, and how."""


@dataclass(frozen=True)
class Removed:
    """A flag Megatron-LM has removed: when, and what an old launch script should say now."""

    removed_in: str
    """The first Megatron-LM release without it."""
    fix: str
    """What replaced it, or what to do."""
    values: tuple[str, ...] | None = ()
    """Values that ask for what this project does (accepted with the note); None: the switch itself does; ()
    none: always refused."""
    taken: Accepted | None = None
    """How it is still taken where its meaning carries over (an alias, or a flag that changed nothing), whatever
    its values: the rule it had in ``ACCEPTED`` before Megatron-LM removed it (``values`` is then unused)."""


REMOVED: dict[str, Removed] = {
    "--data-impl": Removed(
        "core_v0.4.0",
        "datasets are always memory-mapped .bin/.idx files; lazy and cached data must be preprocessed again "
        "with tools/preprocess_data.py",
        values=("mmap", "infer"),
    ),
    "--DDP-impl": Removed(
        "core_v0.4.0", "gradients are reduced by Megatron-Core's DistributedDataParallel", values=("local", "torch")
    ),
    "--no-query-key-layer-scaling": Removed(
        "core_v0.4.0", "query-key layer scaling is off unless --apply-query-key-layer-scaling", values=None
    ),
    "--log-batch-size-to-tensorboard": Removed(
        "core_v0.9.0", "the global batch size is always in the metrics file and TensorBoard", values=None
    ),
    "--no-log-learnig-rate-to-tensorboard": Removed(
        "core_v0.9.0", "the learning rate is always logged; remove the flag (sic: Megatron-LM's spelling)"
    ),
    "--local_rank": Removed(
        "core_v0.9.0",
        "the local rank is read from LOCAL_RANK (torchrun, srun through the recipes; Megatron-LM's later flag is "
        "--local-rank)",
        values=None,
    ),
    "--checkpoint-num-layers": Removed(
        "v2.6", "give --recompute-granularity full --recompute-method uniform --recompute-num-layers N"
    ),
    "--activations-checkpoint-method": Removed(
        "23.04", "give --recompute-granularity full --recompute-method uniform|block"
    ),
    "--activations-checkpoint-num-layers": Removed("23.04", "give --recompute-num-layers N"),
    "--distribute-checkpointed-activations": Removed(
        "23.04", "distributing saved activations over TP is not offered; remove it"
    ),
    "--use-contiguous-buffers-in-local-ddp": Removed(
        "v2.6", "gradient buffers are always contiguous in Megatron-Core's DDP", values=None
    ),
    "--no-contiguous-buffers-in-local-ddp": Removed(
        "core_v0.4.0", "gradient buffers are always contiguous in Megatron-Core's DDP; remove it"
    ),
    "--layernorm-epsilon": Removed("core_v0.4.0", "give --norm-epsilon"),
    "--override-lr-scheduler": Removed("23.04", "give --override-opt_param-scheduler"),
    "--use-checkpoint-lr-scheduler": Removed("23.04", "give --use-checkpoint-opt_param-scheduler"),
    "--overlap-p2p-communication": Removed(
        "core_v0.4.0",
        "the interleaved schedule overlaps its point-to-point communication (unless --no-overlap-p2p-communication)",
        values=None,
    ),
    "--mmap-warmup": Removed("core_v0.4.0", "datasets are memory-mapped without a warm-up pass", values=None),
    "--fp32-allreduce": Removed("v2.5", "gradients are reduced in fp32 unless --grad-reduce-in-bf16", values=None),
    "--fp8-e4m3": Removed("core_v0.4.0", "FP8 is --fp8-format e4m3 (with Transformer Engine)"),
    "--fp8-hybrid": Removed("core_v0.4.0", "FP8 is --fp8-format hybrid (with Transformer Engine)"),
    "--standalone-embedding-stage": Removed(
        "core_v0.11.0",
        "place the embedding alone with --pipeline-model-parallel-layout (e.g. 'E|t*8|...') or "
        "--account-for-embedding-in-pipeline-split",
    ),
    "--use-flash-attn-triton": Removed(
        "(never in NVIDIA's Megatron-LM: a Megatron-DeepSpeed flag)",
        "the attention kernel follows --attention-backend",
    ),
    # ---- removed after core_v0.16.1 (the first release without each: its parser, built at every core_v tag)
    "--tiktoken-special-tokens": Removed(
        "core_v0.18.0",
        "taken as --tokenizer-special-tokens, which replaced it (ignored when that is given, as Megatron-LM did)",
        taken=Accepted("", stands_for=("--tokenizer-special-tokens",), unless_given="--tokenizer-special-tokens"),
    ),
    **dict.fromkeys(
        ("--no-async-tensor-model-parallel-allreduce", "--disable-async-tensor-model-parallel-allreduce"),
        Removed(
            "core_v0.17.0",
            "it changed nothing before (Megatron-Core's ModelParallelConfig: 'This flag is ignored')",
            taken=Accepted(""),
        ),
    ),
    "--no-scatter-gather-tensors-in-pipeline": Removed(
        "core_v0.18.0", "nothing in Megatron-LM read it before", taken=Accepted("")
    ),
    "--legacy-tokenizer": Removed(
        "core_v0.17.0",
        "the tokenizers here are Megatron-LM's legacy classes, which this flag asked for",
        taken=Accepted(""),
    ),
    **dict.fromkeys(
        ("--inference-max-batch-size", "--disable-chunked-prefill"),
        Removed("core_v0.17.0", SERVING, taken=Accepted("")),
    ),
    "--inference-dynamic-batching-cuda-graph-max-tokens": Removed("core_v0.18.0", SERVING, taken=Accepted("")),
    "--use-legacy-models": Removed("core_v0.18.0", "deprecated and ignored by Megatron-LM itself before; remove it"),
    "--disable-ckpt-fully-parallel-save": Removed(
        "core_v0.17.0",
        "checkpoints are written in torch_dist with Megatron-Core's fully parallel save (Megatron-LM's default); "
        "not configurable",
    ),
    **dict.fromkeys(
        ("--tokenizer-hf-use-fast", "--tokenizer-hf-include-special-tokens"),
        Removed(
            "core_v0.18.0",
            "tokenizers here reproduce Megatron-LM's legacy classes (docs/data.md); this option of "
            "megatron.core.tokenizers is not implemented",
        ),
    ),
    **dict.fromkeys(
        ("--hybrid-attention-ratio", "--hybrid-mlp-ratio"),
        Removed(
            "core_v0.17.0",
            "Mamba, hybrid and linear or sparse attention models: not a GPT: this project pretrains decoder-only "
            "transformers",
        ),
    ),
    **dict.fromkeys(
        ("--moe-extended-tp", "--moe-use-legacy-grouped-gemm"),
        Removed("core_v0.17.0", "mixture-of-experts models are not supported by this project (dense GPT only)"),
    ),
    "--muon-use-nesterov": Removed(
        "core_v0.18.0", "taken as --muon-nesterov, its new name", taken=Accepted("", stands_for=("--muon-nesterov",))
    ),
    **dict.fromkeys(
        (
            "--langrl-external-server",
            "--no-langrl-external-server",
            "--langrl-inference-server-type",
            "--langrl-inference-server-conversation-template",
            "--rl-offload-kv-cache-during-training",
            "--no-rl-offload-kv-cache-during-training",
            "--rl-remove-kv-cache-during-training",
            "--no-rl-remove-kv-cache-during-training",
            "--rl-reset-cuda-graphs",
            "--no-rl-reset-cuda-graphs",
        ),
        Removed("core_v0.17.0", "reinforcement learning (GRPO) is post-training; this project pretrains"),
    ),
    "--rl-parallel-generation-tasks": Removed(
        "core_v0.19.0", "reinforcement learning (GRPO) is post-training; this project pretrains"
    ),
}
"""Flags removed from Megatron-LM that public launch scripts still carry (evidence: the commit that removed each,
found with ``git log -S`` on Megatron-LM's ``arguments.py``)."""


@dataclass(frozen=True)
class Translation:
    """A command line with the accepted Megatron-LM flags taken out or replaced."""

    argv: list[str]
    """What our parser reads: aliases replaced by their targets, ignored flags and their values removed."""
    notes: list[str]
    """One line per accepted flag (for ``TrainingConfig.adjustments``)."""
    refused: list[tuple[str, str]]
    """(the flag as given, why) for what this project cannot honour."""
    conditions: list[tuple[str, Callable[[Given], str | None]]]
    """(flag, check) to run on the parsed values."""


def _values(argv: Sequence[str], start: int) -> list[str]:
    """The values after the flag at ``start - 1``: every token up to the next ``--flag``."""
    end = start
    while end < len(argv) and not argv[end].startswith("--"):
        end += 1
    return list(argv[start:end])


def _check_value(check: Callable[[Given, str], str | None], given: Given, *, value: str) -> str | None:
    return check(given, value)


def translate(argv: Sequence[str], *, ours: frozenset[str], accepted: Mapping[str, Accepted] = ACCEPTED) -> Translation:
    """Take the accepted and removed Megatron-LM flags out of ``argv`` (``ours``: our parser's flags, which win;
    ``accepted``: the rules for flags without a field, Megatron-LM's and a fork's)."""
    out: list[str] = []
    notes: list[str] = []
    refused: list[tuple[str, str]] = []
    conditions: list[tuple[str, Callable[[Given], str | None]]] = []
    given = {token.split("=", 1)[0] for token in argv if token.startswith("--")}
    i = 0
    while i < len(argv):
        token = argv[i]
        flag, eq, inline = token.partition("=")
        rule, removed = accepted.get(flag), REMOVED.get(flag)
        if rule is None and removed is not None and removed.taken is not None:
            note = f"{flag}: removed from Megatron-LM in {removed.removed_in}; accepted: {removed.fix}"
            rule = dataclasses.replace(removed.taken, note=note)
        if not token.startswith("--") or flag in ours or (rule is None and removed is None):
            out.append(token)
            i += 1
            continue
        values = [inline] if eq else _values(argv, i + 1)
        i += 1 + (0 if eq else len(values))
        if rule is not None:
            if rule.refused:
                refused.append((" ".join([flag, *values]), rule.refused))
                continue
            if rule.check_value is not None:
                value = values[0] if values else ""
                conditions.append((f"{flag} {value}", functools.partial(_check_value, rule.check_value, value=value)))
            if rule.values is not None and values and values[0] not in rule.values:
                refused.append((f"{flag} {values[0]}", rule.otherwise))
                continue
            if rule.unless_given is not None and rule.unless_given in given:
                notes.append(f"{flag} ignored: {rule.unless_given} is given (as Megatron-LM does)")
                continue
            if rule.condition is not None:
                conditions.append((flag, rule.condition))
            # An alias keeps its values, unless the value only selected it (--no-weight-decay-cond-type's one choice).
            out += [*rule.stands_for, *(values if rule.values is None else [])] if rule.stands_for else []
            notes.append(rule.note if rule.note.startswith(flag) else f"{flag}: {rule.note}")
            continue
        assert removed is not None
        spelled = " ".join([flag, *values])
        if (removed.values is None and not values) or (removed.values and values and values[0] in removed.values):
            notes.append(f"{spelled}: removed from Megatron-LM in {removed.removed_in}; accepted: {removed.fix}")
        else:
            refused.append((spelled, f"removed from Megatron-LM in {removed.removed_in}; {removed.fix}"))
    return Translation(argv=out, notes=notes, refused=refused, conditions=conditions)

"""What Megatron-LM accepts is accepted: aliases as their targets, flags that change nothing with a note, removed
flags where their value asks for what this project does; and each one is named, never taken silently."""

from __future__ import annotations

import dataclasses
import shlex

import pytest

from megatron_ext.config.arguments import ConfigError
from megatron_ext.config.megatron_lm_accepted import ACCEPTED, REMOVED
from megatron_ext.config.run_args import backend_problem
from megatron_ext.config.training_config import TrainingConfig, parse_args

pytestmark = pytest.mark.unit

BASE = ["--mock-data", "--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "64"]


def _same_run(a: TrainingConfig, b: TrainingConfig) -> bool:
    return dataclasses.replace(a, adjustments=()) == dataclasses.replace(b, adjustments=())


def _refusal_lines(argv: list[str]) -> list[str]:
    with pytest.raises(ConfigError, match="Megatron-LM flags this project refuses") as caught:
        parse_args(argv)
    return str(caught.value).splitlines()[1:]


@pytest.mark.parametrize(
    ("alias", "target"),
    [
        ("--recompute-activations", "--recompute-granularity selective"),
        ("--moe-layer-recompute", "--recompute-granularity selective"),
        ("--use-rotary-position-embeddings", "--position-embedding-type rope"),
        ("--persistent-save-interval 7", "--save-interval 7"),
    ],
)
def test_an_alias_is_the_flags_it_stands_for_and_is_named(alias: str, target: str) -> None:
    aliased = parse_args([*BASE, *alias.split()])
    assert _same_run(aliased, parse_args([*BASE, *target.split()]))
    assert any(note.startswith(alias.split()[0]) for note in aliased.adjustments)


def test_encoder_sizes_stand_in_only_for_sizes_not_given() -> None:
    without = ["--mock-data", "--hidden-size", "64", "--num-attention-heads", "4"]
    cfg = parse_args([*without, "--encoder-num-layers", "6", "--encoder-seq-length", "96"])
    assert (cfg.model.num_layers, cfg.model.seq_length) == (6, 96)
    both = parse_args([*BASE, "--encoder-num-layers", "6"])
    assert both.model.num_layers == 4
    assert "--encoder-num-layers ignored: --num-layers is given (as Megatron-LM does)" in both.adjustments


NO_EFFECT = sorted(
    f for f, rule in ACCEPTED.items() if not rule.stands_for and rule.condition is None and rule.values is None
)


@pytest.mark.parametrize("flag", NO_EFFECT)
def test_a_flag_without_effect_changes_nothing_and_is_named(flag: str) -> None:
    """Whether it is a switch or takes values (Megatron-LM's parser decides), the run is the same and the note
    names the flag."""
    base = parse_args(BASE)
    for given in ([flag], [flag, "1"], [f"{flag}=x"]):
        cfg = parse_args([*BASE, *given, "--lr", "0.001"])
        assert _same_run(cfg, dataclasses.replace(base, optim=dataclasses.replace(base.optim, lr=0.001)))
        assert any(note.startswith(flag) for note in cfg.adjustments), cfg.adjustments


def test_megatron_lms_own_deprecation_messages_are_repeated() -> None:
    cfg = parse_args([*BASE, "--use-dist-ckpt", "--dist-ckpt-format", "torch_dist"])
    assert cfg.adjustments[:2] == (
        "--use-dist-ckpt is deprecated and has no effect. Use --ckpt-format to select the checkpoint format.",
        "--dist-ckpt-format is deprecated and has no effect. Use --ckpt-format to select the checkpoint format.",
    )


def test_no_position_embedding_only_with_rope_as_megatron_lm() -> None:
    rope = parse_args([*BASE, "--position-embedding-type", "rope", "--no-position-embedding"])
    assert rope.model.position_embedding_type == "rope"
    assert any(note.startswith("--no-position-embedding") for note in rope.adjustments)
    (line,) = _refusal_lines([*BASE, "--no-position-embedding"])
    assert line.startswith("  --no-position-embedding: --no-position-embedding is deprecated, use --position-")
    assert "--position-embedding-type none" in line


def test_rope_scaling_is_llama_3s_with_its_factor() -> None:
    """8 (Llama 3.1) by default; --rope-scaling-factor reaches Megatron-Core, as in Megatron-LM after 0.16.1."""
    rope = [*BASE, "--position-embedding-type", "rope", "--use-rope-scaling"]
    assert parse_args(rope).model.use_rope_scaling
    assert _same_run(parse_args([*rope, "--rope-scaling-factor", "8"]), parse_args(rope))
    assert parse_args([*rope, "--rope-scaling-factor", "32"]).model.rope_scaling_factor == 32.0
    with pytest.raises(ConfigError, match="--rope-scaling-factor must be greater than 0"):
        parse_args([*rope, "--rope-scaling-factor", "0"])
    with pytest.raises(ConfigError, match="--use-rope-scaling scales the rotary embedding"):
        parse_args([*BASE, "--use-rope-scaling"])
    with pytest.raises(ConfigError, match="--squared-relu and --swiglu each set the MLP's activation"):
        parse_args([*BASE, "--squared-relu", "--swiglu"])


def test_a_sliding_window_is_taken_where_it_covers_the_sequence_as_megatron_lm_writes_it() -> None:
    """--window-size LEFT,RIGHT (Megatron-LM's tuple_type: with or without parentheses): a window covering
    --seq-length is full causal attention; a shorter one is refused naming both and the fix."""
    for text in ("63,0", "(63, 0)", "-1,0", "4095,0"):
        cfg = parse_args([*BASE, f"--window-size={text}"])
        assert _same_run(dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, window_size=None)),
                         parse_args(BASE)), text  # fmt: skip
    assert parse_args([*BASE, "--window-size", "63,0"]).model.context_length == 64
    assert parse_args([*BASE, "--window-size", "127,0", "--max-position-embeddings", "512"]).model.context_length == 128
    with pytest.raises(ConfigError, match=r"--window-size 31,0: a sliding window of 32 tokens is shorter than "
                       r"--seq-length 64.*train at --seq-length 32 or less"):  # fmt: skip
        parse_args([*BASE, "--window-size", "31,0"])
    for bad in ("4096", "a,b", "-2,0"):
        with pytest.raises(ConfigError, match="--window-size"):
            parse_args([*BASE, f"--window-size={bad}"])


def test_qkv_biases_alone_are_a_model_of_their_own() -> None:
    """--add-qkv-bias with --disable-bias-linear (Qwen2): recorded, and taken from a checkpoint as Megatron-LM."""
    from megatron_ext.config.checkpoint_args import MODEL_ARGS

    cfg = parse_args([*BASE, "--disable-bias-linear", "--add-qkv-bias"])
    assert cfg.model.add_qkv_bias and cfg.model.disable_bias_linear
    assert ("model", "add_qkv_bias", True) in MODEL_ARGS


def test_a_removed_flag_is_accepted_where_its_value_is_what_happens_here() -> None:
    cfg = parse_args([*BASE, "--data-impl", "mmap", "--DDP-impl", "local", "--no-query-key-layer-scaling"])
    assert _same_run(cfg, parse_args(BASE))
    assert [note.split(":")[0] for note in cfg.adjustments] == [
        "--data-impl mmap",
        "--DDP-impl local",
        "--no-query-key-layer-scaling",
    ]
    assert "removed from Megatron-LM in core_v0.4.0; accepted" in cfg.adjustments[0]


def test_a_removed_flag_is_otherwise_refused_with_when_and_what_replaced_it() -> None:
    lines = _refusal_lines(
        [*BASE, "--data-impl", "lazy", "--checkpoint-num-layers", "2", "--layernorm-epsilon", "1e-5"]
    )
    assert lines == [
        f"  --data-impl lazy: removed from Megatron-LM in core_v0.4.0; {REMOVED['--data-impl'].fix}",
        f"  --checkpoint-num-layers 2: removed from Megatron-LM in v2.6; {REMOVED['--checkpoint-num-layers'].fix}",
        "  --layernorm-epsilon 1e-5: removed from Megatron-LM in core_v0.4.0; give --norm-epsilon",
    ]


TAKEN_AFTER_REMOVAL = sorted(f for f, r in REMOVED.items() if r.taken is not None and not r.taken.stands_for)


@pytest.mark.parametrize("flag", TAKEN_AFTER_REMOVAL)
def test_a_removed_flag_that_changed_nothing_still_changes_nothing_and_is_named(flag: str) -> None:
    """Accepted before Megatron-LM removed it (it changed nothing), so still accepted, with any value, and named with
    the release that removed it."""
    base = parse_args(BASE)
    for given in ([flag], [flag, "1"], [f"{flag}=x"]):
        cfg = parse_args([*BASE, *given])
        assert _same_run(cfg, base)
        assert any(note.startswith(f"{flag}: removed from Megatron-LM in core_v0.1") for note in cfg.adjustments)


def test_a_removed_alias_still_stands_for_its_replacement_unless_that_is_given() -> None:
    tokens = ["<unk>", "<s>", "</s>", "<pad>"]
    old = parse_args([*BASE, "--tiktoken-special-tokens", *tokens])
    assert old.data.tokenizer_special_tokens == tuple(tokens)
    assert _same_run(old, parse_args([*BASE, "--tokenizer-special-tokens", *tokens]))
    both = parse_args([*BASE, "--tokenizer-special-tokens", *tokens, "--tiktoken-special-tokens", "<x>"])
    assert both.data.tokenizer_special_tokens == tuple(tokens)
    assert "--tiktoken-special-tokens ignored: --tokenizer-special-tokens is given (as Megatron-LM does)" in (
        both.adjustments
    )


def test_a_removed_flag_refused_before_is_refused_with_its_release() -> None:
    lines = _refusal_lines([*BASE, "--use-legacy-models", "--moe-extended-tp"])
    assert lines == [
        f"  --use-legacy-models: removed from Megatron-LM in core_v0.18.0; {REMOVED['--use-legacy-models'].fix}",
        f"  --moe-extended-tp: removed from Megatron-LM in core_v0.17.0; {REMOVED['--moe-extended-tp'].fix}",
    ]


def test_the_distributed_backend_must_fit_the_device() -> None:
    assert parse_args([*BASE, "--device", "cpu", "--distributed-backend", "gloo"]).run.distributed_backend == "gloo"
    assert parse_args([*BASE, "--distributed-backend", "nccl"]).run.distributed_backend == "nccl"  # auto: at start
    with pytest.raises(ConfigError, match=r"--distributed-backend nccl does not fit the device \(cpu\), whose backend"):
        parse_args([*BASE, "--device", "cpu", "--distributed-backend", "nccl"])
    assert backend_problem("gloo", "cuda") is not None and backend_problem("nccl", "cuda") is None


def test_dataloader_types_single_and_cyclic_run_and_external_is_refused() -> None:
    single = parse_args([*BASE, "--dataloader-type", "single"])
    assert single.data == dataclasses.replace(parse_args(BASE).data, dataloader_type="single")
    cyclic = parse_args([*BASE, "--dataloader-type", "cyclic", "--no-data-sharding"])
    assert (cyclic.data.dataloader_type, cyclic.data.no_data_sharding) == ("cyclic", True)
    with pytest.raises(ConfigError, match=r"--dataloader-type external: .*cannot train"):
        parse_args([*BASE, "--dataloader-type", "external"])
    with pytest.raises(ConfigError, match="--no-data-sharding applies to --dataloader-type cyclic only"):
        parse_args([*BASE, "--no-data-sharding"])


# A launch script of the kind public Megatron-LM users keep (2023-era GPT pretraining on a cluster): deprecated
# aliases, switches that do nothing any more, removed flags with their no-op values, the backend by name.
OLD_STYLE = """--tensor-model-parallel-size 1 --pipeline-model-parallel-size 1 --distributed-backend nccl
    --num-layers 4 --hidden-size 64 --num-attention-heads 4 --seq-length 128 --max-position-embeddings 128
    --micro-batch-size 1 --global-batch-size 8 --train-iters 10 --lr 3e-4 --min-lr 3e-5 --lr-decay-style cosine
    --lr-warmup-fraction 0.01 --weight-decay 0.1 --clip-grad 1.0 --bf16 --use-flash-attn --recompute-activations
    --no-async-tensor-model-parallel-allreduce --use-rotary-position-embeddings --no-position-embedding
    --DDP-impl local --data-impl mmap --use-dist-ckpt --dataloader-type single --mock-data --log-interval 1"""


def test_an_old_style_launch_script_gets_through_and_every_accepted_flag_is_named() -> None:
    cfg = parse_args(shlex.split(OLD_STYLE))
    assert cfg.model.position_embedding_type == "rope" and cfg.optim.recompute_granularity == "selective"
    named = {note.split(":")[0].split(" is ")[0].split()[0] for note in cfg.adjustments}
    assert named == {
        "--use-flash-attn",
        "--recompute-activations",
        "--no-async-tensor-model-parallel-allreduce",
        "--use-rotary-position-embeddings",
        "--no-position-embedding",
        "--DDP-impl",
        "--data-impl",
        "--use-dist-ckpt",
    }


def test_with_device_auto_the_backend_is_checked_when_the_device_is_known() -> None:
    """``--device auto`` resolves at start-up; a backend that does not fit stops the run there, before any process
    group exists."""
    import torch.distributed as dist

    from megatron_ext.training import distributed

    layout = parse_args(BASE).layout
    with pytest.raises(ConfigError, match=r"--distributed-backend nccl does not fit the device \(cpu\)"):
        distributed.initialize(layout=layout, device_choice="cpu", seed=1, backend_choice="nccl")
    assert not dist.is_initialized()


def test_weights_and_biases_flags_need_what_megatron_lm_needs() -> None:
    cfg = parse_args([*BASE, "--wandb-project", "p", "--wandb-exp-name", "e", "--save", "ckpt"])
    assert (cfg.run.wandb_project, cfg.run.wandb_exp_name) == ("p", "e")
    with pytest.raises(ConfigError, match="--wandb-project needs --wandb-exp-name"):
        parse_args([*BASE, "--wandb-project", "p", "--save", "ckpt"])
    with pytest.raises(ConfigError, match="give --save or --wandb-save-dir"):
        parse_args([*BASE, "--wandb-project", "p", "--wandb-exp-name", "e"])
    alias = parse_args([*BASE, "--disable-log-loss-scale-to-tensorboard"])
    assert alias.run.no_log_loss_scale_to_tensorboard


def test_the_cross_entropy_kernel_choice_is_taken_as_megatron_lm_takes_it() -> None:
    """``--cross-entropy-fusion-impl``: native is the fused loss this project runs; te with the fusion is refused
    with Megatron-LM's reason (Transformer Engine's fused loss is unstable), and without it chooses nothing."""
    fused = [*BASE, "--cross-entropy-loss-fusion"]
    assert parse_args([*fused, "--cross-entropy-fusion-impl", "native"]).model.cross_entropy_fusion_impl == "native"
    with pytest.raises(ConfigError, match="stability issues and Megatron-LM refuses it"):
        parse_args([*fused, "--cross-entropy-fusion-impl", "te"])
    unfused = parse_args([*BASE, "--cross-entropy-fusion-impl", "te"])
    assert unfused.model.cross_entropy_fusion_impl == "te" and not unfused.model.cross_entropy_loss_fusion

"""Every Megatron-LM flag is honoured, already so, or refused with its reason; never "unrecognized"."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from megatron_ext.config import megatron_lm, megatron_lm_table
from megatron_ext.config.arguments import ConfigError
from megatron_ext.config.megatron_lm_accepted import ACCEPTED, REMOVED
from megatron_ext.config.training_config import parse_args
from tests.conftest import REPO
from tests.waits import QUICK_S

pytestmark = pytest.mark.unit


def test_every_megatron_lm_flag_is_classified_once() -> None:
    table = megatron_lm_table.classification()
    assert len(table) == len(megatron_lm.megatron_lm_flags()) > 600
    unclassified = sorted(flag for flag, (kind, _) in table.items() if not kind)
    assert not unclassified, f"classify these Megatron-LM flags in megatron_ext/config/megatron_lm.py: {unclassified}"
    honoured = megatron_lm_table.honoured_flags()
    # A refusal rule must not cover a flag the parser takes, nor an "already so" switch.
    assert not [f for f in megatron_lm.megatron_lm_flags() if f in honoured and any(
        r.covers(f, megatron_lm.megatron_lm_flags()[f]) for r in megatron_lm.REFUSALS)]  # fmt: skip
    assert not set(megatron_lm.ALREADY) & honoured
    accepted = set(ACCEPTED)
    assert not accepted & honoured and not accepted & set(megatron_lm.ALREADY)
    assert accepted <= set(megatron_lm.megatron_lm_flags()), "ACCEPTED names flags Megatron-LM 0.19 does not have"
    assert not set(REMOVED) & set(megatron_lm.megatron_lm_flags()), "REMOVED names flags Megatron-LM 0.19 has"
    others = set(table) - honoured - set(megatron_lm.ALREADY) - accepted
    assert all(table[f][0] == "refused" and table[f][1] for f in others)


def test_every_refusal_rule_decides_a_flag() -> None:
    """Each rule is the first to cover some flag that is neither honoured nor accepted: no dead reason."""
    flags = megatron_lm.megatron_lm_flags()
    decided = {megatron_lm.refusal(f) for f in flags}
    assert not [r.reason for r in megatron_lm.REFUSALS if r.reason not in decided]


def test_the_docs_table_is_current() -> None:
    doc = (REPO / "docs" / "megatron-lm-flags.md").read_text()
    assert doc == megatron_lm_table.markdown_table(), (
        "regenerate: python -m megatron_ext.config.megatron_lm_table > docs/megatron-lm-flags.md"
    )


def _refused(argv: list[str]) -> list[str]:
    """The flags named in the refusal (each on its own line), or [] when the command line is accepted."""
    try:
        parse_args(argv)
    except ConfigError as exc:
        lines = str(exc).splitlines()
        assert lines[0].startswith("Megatron-LM flags this project refuses"), str(exc)
        return [line.split(":")[0].strip() for line in lines[1:]]
    return []


# The flags of Megatron-LM's own examples at core_v0.16.1 (examples/gpt3/train_gpt3_175b_distributed.sh,
# examples/llama/train_llama3_8b_h100_fp8.sh with mock data), with small values so that the layout is valid on one
# process.
GPT3_175B = """--tensor-model-parallel-size 1 --pipeline-model-parallel-size 1 --num-layers 4 --hidden-size 64
    --num-attention-heads 4 --seq-length 128 --max-position-embeddings 128 --attention-backend auto
    --micro-batch-size 1 --global-batch-size 8 --rampup-batch-size 2 2 100 --train-iters 10 --weight-decay 0.1
    --adam-beta1 0.9 --adam-beta2 0.95 --init-method-std 0.006 --clip-grad 1.0 --fp16 --lr 6.0e-5
    --lr-decay-style cosine --min-lr 6.0e-6 --lr-warmup-fraction .001 --lr-decay-iters 10 --data-path d
    --vocab-file v.json --merge-file m.txt --split 949,50,1 --log-interval 100 --save-interval 10000
    --eval-interval 1000 --save ckpt --load ckpt --eval-iters 10 --tensorboard-dir tb"""
LLAMA3_8B = """--use-mcore-models --num-layers 4 --hidden-size 64 --ffn-hidden-size 224 --num-attention-heads 4
    --group-query-attention --num-query-groups 2 --kv-channels 16 --position-embedding-type rope --rotary-base 1000000
    --rotary-percent 1.0 --attention-dropout 0.0 --hidden-dropout 0.0 --swiglu --init-method-std 0.0134
    --attention-backend fused --apply-layernorm-1p --untie-embeddings-and-output-weights --disable-bias-linear
    --micro-batch-size 1 --global-batch-size 8 --train-samples 1000 --lr-decay-samples 900 --lr-warmup-samples 10
    --lr 0.00015 --min-lr 0.00001 --decoupled-lr 5.0e-4 --decoupled-min-lr 4.5e-5 --lr-decay-style cosine
    --clip-grad 1.0 --weight-decay 0.1 --adam-beta1 0.9 --adam-beta2 0.95 --bf16 --grad-reduce-in-bf16
    --cross-entropy-loss-fusion --calculate-per-token-loss --manual-gc --empty-unused-memory-level 1
    --exit-duration-in-mins 235 --fp8-format hybrid --fp8-amax-history-len 1024 --fp8-amax-compute-algo max
    --fp8-param-gather --tensor-model-parallel-size 1 --context-parallel-size 1 --sequence-parallel
    --pipeline-model-parallel-size 1 --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather
    --distributed-timeout-minutes 60 --mock-data --tokenizer-type NullTokenizer --vocab-size 128256
    --tiktoken-pattern v2 --data-cache-path cache --split 99,1,0 --no-create-attention-mask-in-dataloader
    --no-mmap-bin-files --num-workers 1 --seq-length 128 --max-position-embeddings 128 --log-interval 1
    --log-throughput --profile --profile-step-start 4 --profile-step-end 6 --save-interval 1000 --eval-interval 100
    --save ckpt --load ckpt --eval-iters 32 --tensorboard-dir tb --ckpt-format torch_dist"""


def test_the_gpt3_examples_ramp_up_with_iteration_counts_is_refused_as_megatron_lm_refuses_it() -> None:
    # Megatron-LM's validate_args: "expected no batch-size rampup for iteration-based training".
    argv = shlex.split(GPT3_175B)
    with pytest.raises(ConfigError, match="--rampup-batch-size needs samples-based training: give --train-samples"):
        parse_args([t for t in argv if not megatron_lm.refusal(t)])


@pytest.mark.parametrize(
    "script",
    [GPT3_175B.replace("--rampup-batch-size 2 2 100 ", ""), LLAMA3_8B],
    ids=["gpt3-175b-without-its-ramp-up", "llama3-8b"],
)
def test_megatron_lm_example_scripts_get_a_reason_for_every_flag_they_cannot_use(script: str) -> None:
    argv = shlex.split(script)
    expected = [t for t in argv if t.startswith("--") and megatron_lm.refusal(t) is not None]
    assert _refused(argv) == expected  # each refused flag named once, in order; nothing "unrecognized"
    # Without those flags (and their values) the same command line is a valid configuration.
    kept: list[str] = []
    dropping = False
    for token in argv:
        if token.startswith("--"):
            dropping = token in expected
        if not dropping:
            kept.append(token)
    config = parse_args(kept)
    assert config.layout.world_size == 1


def test_refusals_name_the_reason_and_what_to_do() -> None:
    named = dict(megatron_lm.split_unknown(["--moe-router-topk", "2", "--batch-size", "4", "--fp4-format=e2m1"])[0])
    assert named == {
        "--moe-router-topk": megatron_lm.MOE,
        "--batch-size": "deprecated in Megatron-LM; use --micro-batch-size",
        "--fp4-format": megatron_lm.REFUSALS[
            [r.covers("--fp4-format", "") for r in megatron_lm.REFUSALS].index(True)
        ].reason,
    }
    with pytest.raises(SystemExit):  # a flag Megatron-LM does not have either: the parser's own error
        parse_args(["--mock-data", "--no-such-flag"])


def test_already_so_switches_are_accepted() -> None:
    config = parse_args(["--mock-data", *megatron_lm.ALREADY])
    assert config == parse_args(["--mock-data"])


def test_sequence_parallel_with_tp1_is_turned_off_as_megatron_lm_does() -> None:
    config = parse_args(["--mock-data", "--sequence-parallel"])
    assert not config.layout.sequence_parallel and not config.parallel.sequence_parallel
    assert config.adjustments and "--sequence-parallel turned off" in config.adjustments[0]
    tp2 = parse_args(["--mock-data", "--sequence-parallel", "--tensor-model-parallel-size", "2", "--world-size", "2"])
    assert tp2.layout.sequence_parallel and not tp2.adjustments


@pytest.mark.parametrize(("value", "message"), [("torch", "legacy format"), ("fsdp_dtensor", "Megatron-FSDP")])
def test_ckpt_format_other_than_torch_dist_is_refused_with_why(value: str, message: str) -> None:
    assert parse_args(["--mock-data", "--ckpt-format", "torch_dist"]).run.ckpt_format == "torch_dist"
    with pytest.raises(ConfigError, match=message):
        parse_args(["--mock-data", "--ckpt-format", value])


def test_flags_file_is_names_only() -> None:
    lines = Path(megatron_lm.FLAGS_FILE).read_text().splitlines()
    assert lines[0].startswith("# Megatron-LM core_v0.19.0:")
    assert all(line.count("\t") == 1 and line.startswith("--") for line in lines[1:])


def test_data_flags_reach_megatron_cores_dataset_config() -> None:
    from megatron_ext.data.tokenizers import NullTokenizer
    from megatron_ext.training.datasets import dataset_config

    plain = dataset_config(parse_args(["--mock-data"]), NullTokenizer(100))
    assert plain.mmap_bin_files and not plain.eod_mask_loss and not plain.reset_position_ids
    assert not plain.create_attention_mask  # what --no-create-attention-mask-in-dataloader asks for
    flags = ["--mock-data", "--no-mmap-bin-files", "--eod-mask-loss", "--reset-position-ids"]
    asked = dataset_config(parse_args(flags), NullTokenizer(100))
    assert not asked.mmap_bin_files and asked.eod_mask_loss and asked.reset_position_ids


# Megatron-LM's --tokenizer-type choices at core_v0.19.0 (megatron/training/config/training_config.py; the same 12 as
# at core_v0.16.1).
MEGATRON_LM_TOKENIZER_TYPES = """BertWordPieceLowerCase BertWordPieceCase GPT2BPETokenizer SentencePieceTokenizer
    GPTSentencePieceTokenizer HuggingFaceTokenizer Llama2Tokenizer TikTokenizer MultimodalTokenizer NullTokenizer
    NullMultimodalTokenizer SFTTokenizer""".split()


@pytest.mark.parametrize("name", MEGATRON_LM_TOKENIZER_TYPES)
def test_every_megatron_lm_tokenizer_type_is_taken_or_refused_with_its_reason(name: str) -> None:
    from megatron_ext.config.tokenizer_types import TOKENIZER_TYPES, UNSUPPORTED_TOKENIZER_TYPES

    if name in TOKENIZER_TYPES:
        # TikTokenizer's own files and pattern are needed as well (tests/data/test_tiktokenizer.py).
        needs = ["--tokenizer-model", "v.json", "--tiktoken-pattern", "v2"] if name == "TikTokenizer" else []
        assert parse_args(["--mock-data", "--tokenizer-type", name, *needs]).data.tokenizer_type == name
    else:
        with pytest.raises(
            ConfigError, match=re.escape(f"--tokenizer-type {name}: {UNSUPPORTED_TOKENIZER_TYPES[name]}")
        ):
            parse_args(["--mock-data", "--tokenizer-type", name])


def test_vocab_and_merge_files_alone_mean_gpt2_bpe_and_are_never_ignored() -> None:
    files = ["--vocab-file", "vocab.json", "--merge-file", "merges.txt"]
    assert parse_args(["--mock-data", *files]).data.tokenizer_type == "GPT2BPETokenizer"
    with pytest.raises(ConfigError, match="read by GPT2BPETokenizer, not by --tokenizer-type NullTokenizer"):
        parse_args(["--mock-data", "--vocab-file", "vocab.json", "--vocab-size", "100"])
    with pytest.raises(ConfigError, match="not by --tokenizer-type SentencePieceTokenizer"):
        parse_args(["--mock-data", "--tokenizer-type", "SentencePieceTokenizer", *files])


def _launch_script(name: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """One of examples/megatron-lm/ with DRY_RUN=1: the whole job validated for its world size here."""
    return subprocess.run(
        ["bash", str(REPO / "examples" / "megatron-lm" / name), "/nonexistent/checkpoints", *args],
        capture_output=True,
        text=True,
        timeout=QUICK_S,
        env=os.environ | {"DRY_RUN": "1", "PYTHON": sys.executable, **env},
    )


def test_launch_scripts_in_megatron_lms_style_pass_their_dry_run() -> None:
    gpt3 = _launch_script("gpt3_175b.sh")
    assert gpt3.returncode == 0, gpt3.stderr
    assert "world size: 1024 = TP 8 × PP 16 × DP 8" in gpt3.stdout
    assert "batch ramp-up: global batch 16 → 32 → … → 1536 (96 sizes)" in gpt3.stdout
    llama = _launch_script("llama3_8b.sh", "", "MOCK", "MOCK", TP_SIZE="2", CP_SIZE="2")
    assert llama.returncode == 0, llama.stderr
    assert "world size: 8 = TP 2 × CP 2 × PP 1 × DP 2" in llama.stdout


def _interpreter(path: Path, name: str, *, runs: bool = True) -> None:
    """An interpreter at ``path`` that says it was chosen (``interpreter: NAME`` on stderr), then runs this one
    (``runs``) or ends there with 0."""
    path.parent.mkdir(parents=True, exist_ok=True)
    then = f'PYTHONPATH={REPO} exec {sys.executable} "$@"' if runs else "exit 0"
    path.write_text(f'#!/bin/sh\necho "interpreter: {name}" >&2\n{then}\n')
    path.chmod(0o755)


@pytest.mark.parametrize("script", ["gpt3_175b.sh", "llama3_8b.sh"])
def test_launch_scripts_take_the_projects_environment_unless_python_names_another(script: str, tmp_path: Path) -> None:
    """From a plain shell, whose PATH has no Python with Megatron-Core, a script in a clone runs the clone's
    .venv/bin/python (bash scripts/setup.sh makes it); PYTHON names another. Before: ``python`` from the PATH,
    and ``ModuleNotFoundError: No module named 'megatron'``."""
    clone = tmp_path / "clone"
    (clone / "examples" / "megatron-lm").mkdir(parents=True)
    (clone / "examples" / "megatron-lm" / script).write_text((REPO / "examples" / "megatron-lm" / script).read_text())
    (clone / "pretrain_gpt.py").symlink_to(REPO / "pretrain_gpt.py")
    _interpreter(clone / ".venv" / "bin" / "python", "the clone's .venv")
    _interpreter(tmp_path / "other" / "python", "PYTHON", runs=False)  # the dry run itself: once is enough
    plain = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "DRY_RUN": "1"}
    command = ["bash", str(clone / "examples" / "megatron-lm" / script), str(tmp_path / "ckpt")]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=QUICK_S, env=plain)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.startswith("interpreter: the clone's .venv\n"), proc.stderr
    assert "configuration is valid" in proc.stdout
    other = plain | {"PYTHON": str(tmp_path / "other" / "python")}
    proc = subprocess.run(command, capture_output=True, text=True, timeout=QUICK_S, env=other)
    assert (proc.returncode, proc.stderr) == (0, "interpreter: PYTHON\n")


def test_fp8_in_a_launch_script_is_taken_and_needs_transformer_engine() -> None:
    fp8 = _launch_script("llama3_8b.sh", DTYPE="fp8")
    assert fp8.returncode == 0, fp8.stderr  # a rehearsal of the cluster's job: the flags are Megatron-LM's
    assert "--fp8-format hybrid need Transformer Engine's layers (not installed here; the run checks)" in fp8.stdout
    # On CPU processes it is refused before launch (tests/config/test_transformer_engine_features.py).


def test_a_flag_no_megatron_lm_release_here_knows_is_named_as_a_later_releases_or_a_forks(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Megatron-LM's main branch adds --output-logit-dtype after core_v0.19.0; forks add their own."""
    with pytest.raises(SystemExit) as exc:
        parse_args(["--mock-data", "--output-logit-dtype", "fp32", "--use-mpi=1"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: unrecognized arguments: --output-logit-dtype fp32 --use-mpi=1; ")
    assert "--output-logit-dtype, --use-mpi are not in the parser of Megatron-LM core_v0.19.0" in err


def test_a_step_batch_size_schedule_is_refused_naming_the_ramp_this_project_runs() -> None:
    """NVIDIA's GPT-3 example at core_v0.19.0 passes --step-batch-size-schedule (Megatron-LM's replacement of the
    ramp-up): refused with its reason, which names --rampup-batch-size."""
    argv = ["--mock-data", "--step-batch-size-schedule", "0:16 2.4B:320 4.8B:624"]
    assert _refused(argv) == ["--step-batch-size-schedule"]
    assert "--rampup-batch-size START INCREMENT SAMPLES" in (megatron_lm.refusal("--step-batch-size-schedule") or "")

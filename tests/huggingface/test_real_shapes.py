"""The import's dry run at the real shapes of Llama 3.1 8B and 70B, Qwen2.5 0.5B, 7B and 72B and Mistral 7B (their
published config.json, no weights): the printed flags build exactly the model of the calculator's preset, in the
weights' precision, and pretrain_gpt.py takes them."""

from __future__ import annotations

import dataclasses
import json
import shlex
from pathlib import Path

import pytest

from megatron_ext.cli import convert_checkpoint
from megatron_ext.config.arguments import ModelArgs
from megatron_ext.config.presets import get_preset
from megatron_ext.config.training_config import parse_args
from tests.conftest import run_script
from tests.huggingface.hub_configs import HUB_CONFIGS

pytestmark = pytest.mark.unit


def dry_run(name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, str, str]:
    """``from-hf --dry-run`` of the model's config.json; (exit code, stdout, stderr)."""
    source = tmp_path / name
    source.mkdir(exist_ok=True)
    (source / "config.json").write_text(json.dumps(HUB_CONFIGS[name]))
    code = convert_checkpoint.main(
        ["from-hf", "--input", str(source), "--save", str(tmp_path / f"{name}-ckpt"), "--dry-run", *extra]
    )
    out = capsys.readouterr()
    return code, out.out, out.err


def printed_command(stdout: str) -> list[str]:
    line = next(line for line in stdout.splitlines() if line.startswith("continue pretraining with: "))
    return shlex.split(line.removeprefix("continue pretraining with: "))


@pytest.mark.parametrize("name", list(HUB_CONFIGS))
def test_the_printed_flags_are_the_preset_model_in_bf16(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    preset = get_preset(name)
    code, out, err = dry_run(name, tmp_path, capsys, "--seq-length", str(preset.seq_length))
    assert code == 0, err
    assert "nothing written" in out and not (tmp_path / f"{name}-ckpt").exists()
    command = printed_command(out)
    assert command[:3] == ["pretrain_gpt.py", "--load", str(tmp_path / f"{name}-ckpt")]
    assert "--bf16" in command  # the weights' dtype, which a run continues in
    cfg = parse_args([*command[3:], "--mock-data"], world_size=1)
    wanted = ModelArgs(**preset.model_flags())
    # The vocabulary: the null tokenizer's (no tokenizer files here) padded to the embedding's rows.
    differ = [
        (f.name, getattr(cfg.model, f.name), getattr(wanted, f.name))
        for f in dataclasses.fields(ModelArgs)
        if f.name != "vocab_size" and getattr(cfg.model, f.name) != getattr(wanted, f.name)
    ]
    assert differ == [], differ
    assert cfg.padded_vocab_size == preset.vocab_size
    assert cfg.optim.bf16


def test_mistral_at_its_full_context_is_refused_naming_window_and_length(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = dry_run("mistral-7b", tmp_path, capsys)
    assert code == 2 and out == ""
    assert (
        "sliding window 4096 is shorter than the sequence length 32768 (max_position_embeddings; import with "
        "--seq-length 4096 or less): Megatron-Core's local attention has no sliding window" in err
    ), err
    code, out, err = dry_run("mistral-7b", tmp_path, capsys, "--seq-length", "8192")
    assert code == 2 and "sliding window 4096 is shorter than the sequence length 8192 (--seq-length)" in err, err


def test_pretrain_gpt_takes_the_printed_flags_at_the_real_shape(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Llama 3.1 70B on 64 GPUs (TP8 × PP4 with interleaving × DP2) in pretrain_gpt.py's own dry run."""
    code, out, err = dry_run("llama3.1-70b", tmp_path, capsys, "--seq-length", "8192")
    assert code == 0, err
    command = printed_command(out)
    layout = ["--tensor-model-parallel-size", "8", "--pipeline-model-parallel-size", "4",
              "--num-layers-per-virtual-pipeline-stage", "5", "--world-size", "64", "--micro-batch-size", "1",
              "--global-batch-size", "128", "--mock-data", "--train-iters", "10", "--dry-run"]  # fmt: skip
    # --load names the checkpoint the import would write: its dry run checks the flags, not the files.
    proc = run_script([*command[1:], *layout])
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "configuration is valid" in proc.stdout, proc.stdout
    assert "world size: 64 = TP 8 × PP 4 × DP 2 × VP 4 (interleaved 1F1B)" in proc.stdout, proc.stdout

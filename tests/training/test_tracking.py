"""TensorBoard and W&B where Megatron-LM's users look: its tags, intervals and switches, read back from a run."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.conftest import TINY_MODEL, run_pretrain
from tests.wandb_history import history

pytestmark = pytest.mark.distributed

LOGGING = """--train-iters 4 --log-interval 2 --eval-interval 2 --eval-iters 1 --timing-log-level 1
    --log-timers-to-tensorboard --log-validation-ppl-to-tensorboard --log-world-size-to-tensorboard
    --log-num-zeros-in-grad --log-params-norm --wandb-project recipes --wandb-exp-name tiny""".split()


def _scalars(directory: Path) -> tuple[dict[str, list[tuple[int, float]]], set[str]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(directory), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    scalars = {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}
    return scalars, set(events.Tags()["tensors"])


def test_a_run_writes_megatron_lms_tags_to_tensorboard_and_wandb(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    tb, metrics, wandb_dir = tmp_path / "tb", tmp_path / "m.jsonl", tmp_path / "w"
    run_pretrain([*TINY_MODEL, *LOGGING, "--tensorboard-dir", str(tb), "--metrics-file", str(metrics),
                  "--wandb-save-dir", str(wandb_dir)])  # fmt: skip
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    logged = {r["iteration"]: r for r in records if "lm_loss" in r}
    valid = {r["iteration"]: r["valid_loss"] for r in records if "valid_loss" in r}
    scalars, texts = _scalars(tb)

    # Every iteration (--tensorboard-log-interval 1), and against consumed samples (8 per step).
    for tag in ("lm loss", "learning-rate", "batch-size", "loss-scale", "grad-norm", "world-size", "num-zeros",
                "params-norm"):  # fmt: skip
        assert [step for step, _ in scalars[tag]] == [1, 2, 3, 4], tag
        assert [step for step, _ in scalars[f"{tag} vs samples"]] == [8, 16, 24, 32], tag
    values = {tag: dict(points) for tag, points in scalars.items()}
    for it in (2, 4):  # the metrics file's window of two steps is their mean; the step's own values are its last
        assert math.isclose(
            logged[it]["lm_loss"], (values["lm loss"][it - 1] + values["lm loss"][it]) / 2, rel_tol=1e-6
        )
        assert math.isclose(values["learning-rate"][it], logged[it]["lr"], rel_tol=1e-6)
        assert math.isclose(values["grad-norm"][it], logged[it]["grad_norm"], rel_tol=1e-6)
        assert math.isclose(values["params-norm"][it], logged[it]["params_norm"], rel_tol=1e-6)
        assert values["num-zeros"][it] == logged[it]["num_zeros"]
    assert set(values["loss-scale"].values()) == {1.0} and set(values["world-size"].values()) == {1.0}
    assert set(values["batch-size"].values()) == {8.0}

    # Each --log-interval: the timers (seconds per iteration, the slowest rank), throughput, iteration time.
    assert [step for step, _ in scalars["throughput"]] == [2, 4]
    assert [step for step, _ in scalars["iteration-time"]] == [2, 4]
    timers = {tag for tag in scalars if tag.endswith("-time") and tag != "iteration-time"}
    assert {f"{name}-time" for name in logged[2]["time_ms"]} == timers and timers
    # Each evaluation: the validation loss and perplexity.
    assert sorted(values["lm loss validation"]) == sorted(valid) == [2, 4]
    assert [values["lm loss validation"][it] for it in (2, 4)] == pytest.approx([valid[2], valid[4]], rel=1e-6)
    assert values["lm loss validation ppl"][2] == pytest.approx(math.exp(valid[2]), rel=1e-5)
    # The metrics file's other numbers under their own names, never twice under two names.
    assert "tokens_per_sec" in scalars and "lm_loss" not in scalars and "lr" not in scalars
    assert any(tag.startswith("num_layers") for tag in texts)  # the arguments, as text

    (run_dir,) = (wandb_dir / "wandb").glob("offline-run-*")
    rows, run = history(run_dir)
    assert (run["name"], run["project"]) == ("tiny", "recipes") and "num_layers" in run["config"].split(",")
    by_step: dict[int, dict] = {}
    for row in rows:
        by_step.setdefault(row["_step"], {}).update(row)
    assert sorted(by_step) == [1, 2, 3, 4]
    for it in (1, 2, 3, 4):
        assert by_step[it]["samples vs steps"] == 8 * it
        assert by_step[it]["lm loss"] == pytest.approx(values["lm loss"][it], rel=1e-6)
        assert "lm loss vs samples" not in by_step[it]
    assert by_step[2]["lm loss validation"] == pytest.approx(valid[2], rel=1e-6)
    assert by_step[4]["iteration-time"] > 0


def test_the_interval_and_switches_decide_what_is_written(tmp_path: Path) -> None:
    from megatron_ext.config.training_config import parse_args
    from megatron_ext.training.tracking import StepScalars, Tracker

    flags = ["--mock-data", "--tensorboard-dir", str(tmp_path), "--tensorboard-log-interval", "2"]
    tracker = Tracker(parse_args([*flags, "--no-log-loss-scale-to-tensorboard"]), enabled=True, world_size=4)
    for it in range(1, 7):
        if tracker.wants_step(it):
            tracker.step(StepScalars(iteration=it, consumed_samples=8 * it, batch_size=8, loss=1.0 / it, lr=0.1,
                                     loss_scale=2.0))  # fmt: skip
    tracker.interval(2, seconds_per_iteration=0.5, tflops_per_gpu=1.0, timers_ms={"optimizer": 3.0})  # no switch
    tracker.close()
    scalars, _ = _scalars(tmp_path)
    assert [step for step, _ in scalars["lm loss"]] == [2, 4, 6]
    assert "loss-scale" not in scalars and "world-size" not in scalars and "grad-norm" not in scalars
    assert "optimizer-time" not in scalars and "throughput" not in scalars
    silent = Tracker(parse_args(flags), enabled=False, world_size=4)  # any rank but the last
    assert not silent.active and silent.wants_step(2)  # the interval is known on every rank (collectives)


def test_a_missing_writer_package_is_named_before_anything_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    from megatron_ext.config.training_config import parse_args
    from megatron_ext.training import entry

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    cfg = parse_args(["--mock-data", "--tensorboard-dir", "tb", "--wandb-project", "p", "--wandb-exp-name", "e",
                      "--save", "ckpt"])  # fmt: skip
    assert entry._missing_tracking(cfg) == [
        "--wandb-project needs the wandb package: pip install wandb (or pip install -e .[tracking])"
    ]

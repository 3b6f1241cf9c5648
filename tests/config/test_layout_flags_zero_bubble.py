"""--enable-zero-bubble's rules, checked before launch with the fix named (``layout_flags.zero_bubble_problems``)."""

from __future__ import annotations

import pytest

from megatron_ext.config.arguments import ConfigError
from megatron_ext.config.training_config import parse_args

pytestmark = pytest.mark.unit

BASE = (
    "--num-layers 8 --hidden-size 64 --num-attention-heads 4 --seq-length 32 --mock-data --global-batch-size 8".split()
)


def test_zb_h1_on_a_plain_pipeline_is_accepted() -> None:
    cfg = parse_args([*BASE, "--pipeline-model-parallel-size", "2", "--enable-zero-bubble", "--device", "cpu"],
                     world_size=2)  # fmt: skip
    assert cfg.parallel.enable_zero_bubble and cfg.layout.pp == 2


def test_zb_with_sequence_parallelism_is_accepted() -> None:
    cfg = parse_args([*BASE, "--pipeline-model-parallel-size", "2", "--tensor-model-parallel-size", "2",
                      "--sequence-parallel", "--enable-zero-bubble", "--device", "cpu"], world_size=4)  # fmt: skip
    assert cfg.parallel.enable_zero_bubble and cfg.layout.sequence_parallel


def test_zb_with_virtual_stages_is_zb_interleaved_and_accepted() -> None:
    cfg = parse_args([*BASE, "--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "2",
                      "--enable-zero-bubble", "--device", "cpu"], world_size=2)  # fmt: skip
    assert cfg.parallel.enable_zero_bubble and cfg.layout.vp == 2


@pytest.mark.parametrize(
    "flags, world_size, message",
    [
        ([], 1, "a pipeline to fill: give --pipeline-model-parallel-size 2 or more"),
    ],
)  # fmt: skip
def test_what_zb_h1_needs_is_named_with_the_fix(flags: list[str], world_size: int, message: str) -> None:
    with pytest.raises(ConfigError, match="--enable-zero-bubble needs") as caught:
        parse_args([*BASE, *flags, "--enable-zero-bubble", "--device", "cpu"], world_size=world_size)
    assert message in str(caught.value)


def test_transformer_engine_layers_are_accepted_without_the_bulk_weight_gradient_overlap() -> None:
    """Transformer Engine's layers defer their weight gradients (delay_wgrad_compute); Transformer Engine refuses
    that beside --tp-comm-overlap's bulk weight-gradient overlap, so the run names the switch that turns it off."""
    te = [*BASE, "--pipeline-model-parallel-size", "2", "--tensor-model-parallel-size", "2", "--sequence-parallel",
          "--enable-zero-bubble", "--device", "cuda", "--transformer-impl", "transformer_engine"]  # fmt: skip
    assert parse_args(te, world_size=4).parallel.enable_zero_bubble
    with pytest.raises(ConfigError, match=r"--enable-zero-bubble needs .* add --disable-tp-comm-bulk-wgrad"):
        parse_args([*te, "--tp-comm-overlap"], world_size=4)
    assert parse_args([*te, "--tp-comm-overlap", "--disable-tp-comm-bulk-wgrad"], world_size=4).parallel.tp_comm_overlap


def test_a_transformer_engine_without_delayed_weight_gradients_is_named_before_the_model_is_built(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Transformer Engine before 2.3 has no delay_wgrad_compute: the run says so before building a layer (Megatron-
    Core would raise inside the first layer's constructor)."""
    import torch
    from megatron.core import utils

    from megatron_ext.training import model

    cfg = parse_args([*BASE, "--pipeline-model-parallel-size", "2", "--enable-zero-bubble", "--device", "cuda",
                      "--transformer-impl", "transformer_engine"], world_size=2)  # fmt: skip
    monkeypatch.setattr(model, "use_transformer_engine", lambda cfg, device: True)
    monkeypatch.setattr(utils, "get_te_version", lambda: "2.2.0")
    monkeypatch.setattr(utils, "is_te_min_version", lambda version, check_equality=True: version <= "2.2.0")
    with pytest.raises(ConfigError, match=r"needs Transformer Engine 2\.3 or newer; 2\.2\.0 is installed"):
        model.check_transformer_engine(cfg, torch.device("cuda"))
    monkeypatch.setattr(utils, "is_te_min_version", lambda version, check_equality=True: True)
    model.check_transformer_engine(cfg, torch.device("cuda"))

"""The fused attention curve (``estimate.kernels``) against cuDNN benchmarks it was not read from.

The model's cuDNN curve on Hopper is the FlashAttention-3 paper's bars (H100 SXM5 at 1830 MHz; the causal
backward derived from the non-causal one, ``kernels.cudnn_causal_forward_and_backward``). NVIDIA's cuDNN
frontend repository publishes its own SDPA benchmarks as CSV files, with the causal backward measured directly
and sequences past 16k. Checked here, none of it fitted:

* ``CUDNN_9_1``: the same cuDNN generation (9.1, spring 2024) as the paper and as the calibration runs' NeMo
  24.09: the curve's level, pass by pass, its causal-backward rule, and its flat end above 16k tokens;
* ``CUDNN_9_19``: a 2026 cuDNN on H200: how much faster attention has become since (not applied to the
  model; ``docs/layout-model.md`` says what it would move).

Both runs count FLOPs as the model does (forward ``4·s²·d·n``, halved when causal; backward 2.5 forwards).
Their clocks differ from the paper's: the 9.1 run locks 1980 MHz (its README's instructions); the 9.19 run
states none, and is taken at the same maximum clock. A compute-bound kernel's rate scales with the clock, so
each is compared at the paper's 1830 MHz, the clock of the dense peak (989 TFLOP/s) the shares are taken of.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from types import MappingProxyType

import pytest

from megatron_ext.estimate import kernels
from megatron_ext.estimate.kernels import (
    BENCHMARK_PEAK_TFLOPS,
    CUDNN_H100_TFLOPS,
    FORWARD_AND_BACKWARD,
    SEQUENCE_LENGTHS,
    attention_kernel_efficiency,
    context_parallel_attention_efficiency,
)
from tests.estimate.published import DGXC_H100_V25_04, VALIDATION

pytestmark = pytest.mark.unit

PAPER_CLOCK_MHZ = 1830
"""The FlashAttention-3 paper's H100 clock, at which H100 SXM's dense bf16 peak is 989 TFLOP/s."""
BENCHMARK_CLOCK_MHZ = 1980
"""The cuDNN frontend benchmarks' clock: locked there for 9.1 (``nvidia-smi -ac 3201,1980``, its README)."""
TO_PAPER_CLOCK = PAPER_CLOCK_MHZ / BENCHMARK_CLOCK_MHZ

Table = Mapping[tuple[bool, int], tuple[float, float]]
"""(causal, sequence length) → (forward, backward) TFLOP/s, head dimension 128, bf16."""

CUDNN_9_1: Table = MappingProxyType(
    {
        (False, 4096): (654.153, 517.253),
        (False, 8192): (668.704, 530.366),
        (False, 16384): (641.909, 538.460),
        (False, 32768): (612.559, 536.234),
        (False, 65536): (602.152, 535.411),
        (True, 4096): (542.318, 443.603),
        (True, 8192): (572.863, 463.541),
        (True, 16384): (586.815, 497.680),
        (True, 32768): (577.348, 499.664),
        (True, 65536): (567.022, 503.807),
    }
)
"""NVIDIA/cudnn-frontend benchmark/benchmark_results.csv at commit b7405428 (May 2024; the README's run reports
cuDNN backend 90100): 16 heads of 128, batch × sequence = 16k to 64k tokens."""

CUDNN_9_19: Table = MappingProxyType(
    {
        (False, 2048): (633, 504),
        (False, 4096): (671, 560),
        (False, 8192): (691, 594),
        (False, 16384): (702, 612),
        (False, 32768): (693, 572),
        (True, 2048): (484, 370),
        (True, 4096): (591, 474),
        (True, 8192): (644, 541),
        (True, 16384): (673, 579),
        (True, 32768): (688, 581),
    }
)
"""NVIDIA/cudnn-frontend benchmark/sdpa_benchmark_training/results/h200_919_only_cudnn/llama3.1_20260227_034703.csv
at commit df73764a (cuDNN 9.19.1 on H200; ``top_left`` is the causal mask): Llama 3.1's 64 query heads and
8 key/value heads of 128, batch 1."""


def forward_and_backward(table: Table, seq_length: int, *, causal: bool = True) -> float:
    """A table's causal (or unmasked) forward + backward TFLOP/s at ``seq_length``, at the paper's clock."""
    forward, backward = table[(causal, seq_length)]
    return FORWARD_AND_BACKWARD / (1 / forward + 2.5 / backward) * TO_PAPER_CLOCK


def modelled(seq_length: float, *, causal: bool = True) -> float:
    """The model's causal (or unmasked) forward + backward TFLOP/s for Transformer Engine's fused attention on
    H100."""
    share = attention_kernel_efficiency("hopper", seq_length=seq_length, head_dim=128, backend="fused", causal=causal)
    return share * BENCHMARK_PEAK_TFLOPS["hopper"]


@pytest.mark.parametrize("seq_length", [4096, 8192, 16384])
def test_the_cudnn_curve_is_within_5_percent_of_cudnn_9_1_measured_with_its_causal_backward(seq_length: int) -> None:
    """What the step-time model uses, the causal forward + backward, against a run that measured it whole."""
    assert modelled(seq_length) / forward_and_backward(CUDNN_9_1, seq_length) - 1 == pytest.approx(0, abs=0.05)


@pytest.mark.parametrize("seq_length", [4096, 8192, 16384, 32768, 65536])
def test_the_unmasked_curve_is_within_5_percent_of_cudnn_9_1_measured(seq_length: int) -> None:
    """The blocks of context-parallel attention that no mask cuts (``kernels.context_parallel_attention_efficiency``)
    run at the paper's non-causal bars, held past 16k: cuDNN 9.1's measured unmasked forward + backward to 64k."""
    measured = forward_and_backward(CUDNN_9_1, seq_length, causal=False)
    assert modelled(seq_length, causal=False) / measured - 1 == pytest.approx(0, abs=0.05)


def test_a_context_parallel_rank_runs_one_causal_step_of_cp_and_unmasked_blocks_half_as_deep() -> None:
    """Transformer Engine's load-balanced ring: 1/CP of a rank's attention is the causal step on its own keys, the
    rest blocks without a mask of ``s/CP`` queries against ``s/2CP`` keys (or the reverse), as much work each."""
    s = 4096  # per CP rank
    causal, full = modelled(s), modelled(s / 2, causal=False)

    def rate(cp: int, backend: str = "fused", generation: str = "hopper") -> float:
        share = context_parallel_attention_efficiency(generation, seq_length=s, cp=cp, head_dim=128, backend=backend)
        return share * BENCHMARK_PEAK_TFLOPS[generation]

    assert rate(1) == pytest.approx(causal)
    # Between the causal kernel's rate and the unmasked blocks', nearer the latter with every doubling of CP.
    rates = [rate(cp) for cp in (2, 4, 8, 32)]
    assert causal < rates[0] < rates[1] < rates[2] < rates[3] < full
    # The unmasked blocks are the faster: at CP 2 and 8k tokens (4k a rank) the attention runs 5.6 % faster.
    assert rates[0] / causal - 1 == pytest.approx(0.056, abs=0.002)
    # FlashAttention-2's curve has no unmasked rate: its CP ranks keep the causal kernel's, never a slower one.
    for backend, generation in (("flash", "hopper"), ("auto", "ampere")):
        assert rate(8, backend, generation) == pytest.approx(rate(1, backend, generation))


@pytest.mark.parametrize("seq_length", [4096, 8192, 16384])
def test_each_pass_the_paper_publishes_is_within_6_percent_of_cudnn_9_1(seq_length: int) -> None:
    """The bars the curve is read from, pass by pass (the backward's is non-causal, as the paper publishes it)."""
    i = SEQUENCE_LENGTHS.index(seq_length)
    pairs = {
        "causal forward": (CUDNN_H100_TFLOPS[("forward", True, 128)][i], CUDNN_9_1[(True, seq_length)][0]),
        "forward": (CUDNN_H100_TFLOPS[("forward", False, 128)][i], CUDNN_9_1[(False, seq_length)][0]),
        "backward": (CUDNN_H100_TFLOPS[("backward", False, 128)][i], CUDNN_9_1[(False, seq_length)][1]),
    }
    for name, (paper, measured) in pairs.items():
        assert paper / (measured * TO_PAPER_CLOCK) - 1 == pytest.approx(0, abs=0.06), name


@pytest.mark.parametrize("table", [CUDNN_9_1, CUDNN_9_19], ids=["cudnn-9.1", "cudnn-9.19"])
def test_cudnns_measurements_bear_out_the_causal_backward_rule_within_5_percent(table: Table) -> None:
    """The assumption ``kernels.cudnn_causal_forward_and_backward`` is built on (the paper publishes the backward
    non-causal only), checked in measurements that have both: the causal backward over the non-causal one is the
    forward's same ratio, at every length (2k to 64k)."""
    for causal, seq_length in table:
        if causal:
            forward, backward = table[(True, seq_length)]
            full_forward, full_backward = table[(False, seq_length)]
            derived = full_backward * forward / full_forward
            assert derived / backward - 1 == pytest.approx(0, abs=0.05), seq_length


def test_above_16k_tokens_the_rate_stays_where_the_curve_ends() -> None:
    """The model holds the 16k rate for longer sequences (long-context training sees them per CP rank), and
    cuDNN's measurements bear that out: 9.1 measured the same rate to 64k, and 9.19 to 32k, within 1 %."""
    assert modelled(65536) == modelled(16384)
    for table, lengths in ((CUDNN_9_1, (32768, 65536)), (CUDNN_9_19, (32768,))):
        for seq_length in lengths:
            ratio = forward_and_backward(table, seq_length) / forward_and_backward(table, 16384)
            assert ratio == pytest.approx(1, abs=0.01), seq_length


def test_cudnn_9_19_runs_causal_attention_10_to_16_percent_faster_than_the_model_from_8k_tokens() -> None:
    """Not applied: the calibration runs ran 2024's cuDNN, whose curve the model keeps. A later cuDNN is this
    much faster at the sequences long-context and Llama-style training run (and slower at 2k); if the model's
    curve is moved to a newer cuDNN, this test and the docs' paragraph go with it."""
    gaps = {s: forward_and_backward(CUDNN_9_19, s) / modelled(s) - 1 for s in (8192, 16384, 32768)}
    assert all(0.10 <= gap <= 0.16 for gap in gaps.values()), gaps
    assert forward_and_backward(CUDNN_9_19, 4096) / modelled(4096) - 1 == pytest.approx(0.038, abs=0.005)
    assert forward_and_backward(CUDNN_9_19, 2048) / modelled(2048) - 1 == pytest.approx(-0.066, abs=0.005)


def cudnn_9_19_share(
    generation: str, *, seq_length: float, head_dim: int, backend: str = "auto", causal: bool = True
) -> float:
    """The model's share of peak times 9.19's rate over the model's at the same length and mask (head dimension
    128's, interpolated in log2 between 2k and 32k, held beyond): the curves moved to cuDNN 9.19."""
    share = attention_kernel_efficiency(
        generation, seq_length=seq_length, head_dim=head_dim, backend=backend, causal=causal
    )
    lengths = sorted(s for masked, s in CUDNN_9_19 if masked == causal)
    ratios = [forward_and_backward(CUDNN_9_19, s, causal=causal) / modelled(s, causal=causal) for s in lengths]
    x = math.log2(min(max(seq_length, lengths[0]), lengths[-1]))
    i = min(int(x - math.log2(lengths[0])), len(lengths) - 2)
    w = x - math.log2(lengths[i])
    return share * (ratios[i] + w * (ratios[i + 1] - ratios[i]))


def test_run_with_cudnn_9_19_the_validation_rows_move_little(monkeypatch: pytest.MonkeyPatch) -> None:
    """What moving the curves to cuDNN 9.19 would do (``docs/layout-model.md``): the validation median from 2.02 %
    to 2.00 %, and the Llama 3.1 8B on NeMo 25.02 (dgxc v25.04.02, 8 GPUs), the row furthest off in BF16, 0.2 points.
    Attention's kernel is not what made that software faster."""

    def validation() -> tuple[float, float]:
        eight_b = next(r for r in DGXC_H100_V25_04 if r.name == "Llama 3.1 8B on 8")
        return statistics.median(abs(r.residual()) for r in VALIDATION), eight_b.residual()

    median, row = validation()
    monkeypatch.setattr(kernels, "attention_kernel_efficiency", cudnn_9_19_share)
    median_9_19, row_9_19 = validation()
    assert (round(median * 100, 2), round(median_9_19 * 100, 2)) == (2.02, 2.0)
    assert round(row * 100, 1) == -7.5 and 0.001 < row_9_19 - row < 0.003

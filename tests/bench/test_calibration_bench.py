"""bench/calibration_bench.py end to end on CPU: two measured layouts calibrate a profile (``tools/layout.py
--calibrate``, reading the runs' metrics files), which predicts three other measured layouts.

The benchmark's figures (median over rounds, within 20%) are in docs/performance.md. One round on a machine
that may be busy says as much about the load as about the model, so this checks the mechanics only: every layout
measured and predicted, from a profile fitted on the two runs' metrics.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests import waits
from tests.conftest import REPO, bench_env
from tests.waits import RUN_S

pytestmark = pytest.mark.distributed


def test_a_profile_calibrated_on_two_layouts_predicts_three_others(tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    # Two measured iterations after one of warm-up: what is fitted is what the layouts' predicted times are
    # sensitive to (calibration.fit_profile), whatever the times measured; more iterations only steady those.
    cmd = [sys.executable, str(REPO / "bench" / "calibration_bench.py"), "--repeats", "1", "--iters", "2"]
    cmd += ["--warmup", "1", "--skip-beyond", "--keep", str(tmp_path / "runs"), "--json", str(out)]
    proc = waits.run(cmd, timeout=RUN_S, env=bench_env(), cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (predictions,) = json.loads(out.read_text())["rounds"]
    assert set(predictions) == {"pp2", "pp2-vp2", "dp2"}
    for name, p in predictions.items():
        assert 0 < p["measured_s"] < RUN_S and 0 < p["predicted_s"] < RUN_S, (name, p, proc.stdout)
    # The profile tells the layouts apart (the pipeline bubble and p2p of PP2, the gradient sync of DP2).
    assert len({round(p["predicted_s"], 6) for p in predictions.values()}) == 3, predictions
    # The calibration fitted what the two runs measure: the GEMMs' rate, the transport's latency (TP2's
    # collectives) and bandwidth (DP2's gradients), the optimizer's memory bandwidth.
    profile = json.loads((tmp_path / "runs" / "round1" / "calibrated.json").read_text())
    assert set(profile["calibration"]["fitted"]) >= {"compute_efficiency", "link_latency_s", "intra_node_bandwidth",
                                                     "memory_bandwidth"}  # fmt: skip
    assert {r["run"].rsplit("/", 1)[-1] for r in profile["calibration"]["runs"]} == {"tp2.jsonl", "dp2-distopt.jsonl"}

"""bench/train_throughput.py runs on CPU and reports what it promises (no speed assertion)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests import waits
from tests.conftest import REPO, bench_env
from tests.waits import RUN_S

pytestmark = pytest.mark.distributed


def test_two_variants_side_by_side_on_cpu(tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    cmd = [sys.executable, str(REPO / "bench" / "train_throughput.py")]
    cmd += "--model tiny --device cpu --nproc 2 --iters 2 --warmup 1".split()
    cmd += ["--variant", "sdpa=--attention-backend=auto", "--variant", "mcore=--attention-backend local"]
    cmd += ["--json", str(out), "--"]
    cmd += "--pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 1 --global-batch-size 8".split()
    # The ranks forked from the tests' rank server (bench_env): what is under test is the benchmark, not a launcher.
    proc = waits.run(cmd, timeout=RUN_S, env=bench_env(), cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads(out.read_text())["results"]
    assert [r["variant"] for r in results] == ["sdpa", "mcore"]
    assert results[1]["pretrain_args"][-2:] == ["--attention-backend", "local"]
    for r in results:
        assert r["iterations"] == 2  # the warm-up iteration is not measured
        assert r["tokens_per_sec"] > 0 and r["ms_per_iteration"] > 0
        assert r["mfu"] is None and r["peak_memory_gb"] is None  # CPU: no peak FLOP/s, no CUDA memory
        for key in ("forward-compute", "backward-compute", "optimizer", "p2p-wait", "other"):
            assert key in r["time_ms"], key
        # 8 sequences of micro-batch 1 = 8 microbatches, p = 2, v = 2.
        assert r["bubble_predicted"] == pytest.approx(1 / 16)
    assert "sdpa / mcore:" in proc.stdout

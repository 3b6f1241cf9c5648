#!/usr/bin/env python3
"""Train with pretrain_gpt.py's providers and record the pipeline order each rank runs.

    python -m megatron_ext.cli.launch --nproc-per-node 4 tools/record_schedule.py --schedule-trace runs/trace \
        --mock-data --device cpu --num-layers 8 --hidden-size 32 --num-attention-heads 2 --seq-length 16 \
        --pipeline-model-parallel-size 4 --num-layers-per-virtual-pipeline-stage 1 \
        --micro-batch-size 1 --global-batch-size 8 --train-iters 1

Every argument but ``--schedule-trace DIR`` goes to pretrain_gpt.py. Each rank writes
``DIR/rank<RANK>.json``; ``tools/plot_schedule.py --trace DIR`` draws it.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from typing import Any

from megatron_ext.training.entry import pretrain
from megatron_ext.training.schedule_trace import ScheduleRecorder


def _pretrain_gpt() -> object:
    """The providers of the repository's pretrain_gpt.py, loaded from its path (it is a script, not a module)."""
    path = Path(__file__).resolve().parent.parent / "pretrain_gpt.py"
    spec = importlib.util.spec_from_file_location("pretrain_gpt", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> int:
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--schedule-trace", type=Path, required=True, help="Directory for rank<RANK>.json.")
    args, rest = parser.parse_known_args()
    recorder = ScheduleRecorder()
    pretrain_gpt: Any = _pretrain_gpt()
    code = pretrain(
        model_provider=pretrain_gpt.model_provider,
        forward_step=recorder.wrap(pretrain_gpt.forward_step),
        datasets_provider=pretrain_gpt.datasets_provider,
        argv=rest,
    )
    recorder.write(args.schedule_trace)
    return code


if __name__ == "__main__":
    sys.exit(main())

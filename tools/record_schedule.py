#!/usr/bin/env python3
"""Train with pretrain_gpt.py's providers and record the pipeline order each rank runs.

    python -m megatron_ext.launch --nproc-per-node 4 tools/record_schedule.py --schedule-trace runs/trace \
        --mock-data --device cpu --num-layers 8 --hidden-size 32 --num-attention-heads 2 --seq-length 16 \
        --pipeline-model-parallel-size 4 --num-layers-per-virtual-pipeline-stage 1 \
        --micro-batch-size 1 --global-batch-size 8 --train-iters 1

Every argument but ``--schedule-trace DIR`` goes to pretrain_gpt.py. Each rank writes
``DIR/rank<RANK>.json``; ``tools/plot_schedule.py --trace DIR`` draws it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pretrain_gpt
from megatron_ext.schedule_trace import ScheduleRecorder
from megatron_ext.training import pretrain


def main() -> int:
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--schedule-trace", type=Path, required=True, help="Directory for rank<RANK>.json.")
    args, rest = parser.parse_known_args()
    recorder = ScheduleRecorder()
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

#!/usr/bin/env python3
"""Draw Megatron-Core's (interleaved) 1F1B pipeline timeline as PNG and SVG, and print its bubble.

    python tools/plot_schedule.py --pp 4 --vp 2 --num-microbatches 8 --output runs/schedule_p4_v2_m8
    python tools/plot_schedule.py --pp 4 --vp 2 --num-microbatches 8 --trace runs/trace   # a recorded run's order

One row per pipeline rank, every forward and backward pass of every microbatch and model chunk in the
order Megatron-Core runs them (megatron_ext/estimate/pipeline.py; checked against a recorded CPU run by
tests/estimate/test_pipeline_schedule.py), idle time in grey. Invalid p, v, m get pretrain_gpt.py's messages (exit 2).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from megatron_ext.cli.plot_schedule import main

if __name__ == "__main__":
    sys.exit(main())

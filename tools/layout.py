#!/usr/bin/env python3
"""3D-parallel layout calculator: which TP × PP × VP × DP × micro-batch to use, before anything is launched.

    python tools/layout.py --gpus 1024 --gpu h100-sxm --model gpt3-175b --bf16 \
        --sequence-parallel --use-distributed-optimizer --recompute-granularity selective --top 5

    python tools/layout.py --gpus 16 --gpu h100-sxm --num-layers 40 --hidden-size 5120 \
        --num-attention-heads 40 --seq-length 2048 --vocab-size 50257 \
        --tensor-model-parallel-size 8 --pipeline-model-parallel-size 2 --micro-batch-size 1 \
        --global-batch-size 512 --bf16 --use-distributed-optimizer --explain

Exit codes: 0 valid and fits, 2 invalid (pretrain_gpt.py's messages), 3 valid but estimated not to fit.
The models and their sources: docs/layout-model.md.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from megatron_ext.cli.layout import main

if __name__ == "__main__":
    sys.exit(main())

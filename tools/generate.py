#!/usr/bin/env python3
"""Generate text from a checkpoint saved under any layout, in one process (CPU or GPU).

    python tools/generate.py --load CKPT_DIR --prompt "def main(" --max-new-tokens 40
    python tools/generate.py --load CKPT_DIR --prompt TEXT --max-new-tokens N --temperature 0.8 --top-p 0.9 --seed 1

Details: docs/checkpoints.md.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from megatron_ext.cli.generate import main

if __name__ == "__main__":
    sys.exit(main())

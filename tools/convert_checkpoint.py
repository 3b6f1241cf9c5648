#!/usr/bin/env python3
"""Move a checkpoint to and from Hugging Face transformers (Llama and GPT-2 architectures).

    python tools/convert_checkpoint.py to-hf --load CKPT_DIR --output HF_DIR [--iteration N]
    python tools/convert_checkpoint.py from-hf --input HF_DIR --save CKPT_DIR

Details: docs/checkpoints.md.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from megatron_ext.cli.convert_checkpoint import main

if __name__ == "__main__":
    sys.exit(main())

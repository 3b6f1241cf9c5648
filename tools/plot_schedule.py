#!/usr/bin/env python3
"""``python tools/plot_schedule.py``, Megatron-LM's path for ``mcore-plot-schedule`` (``megatron_ext.cli.plot_schedule:main``): draws a pipeline timeline and prints its bubble."""

from megatron_ext.cli.plot_schedule import main

if __name__ == "__main__":
    raise SystemExit(main())

#!/usr/bin/env python3
"""``python tools/plot_metrics.py``, the tools/ path for ``mcore-plot-metrics`` (``megatron_ext.cli.plot_metrics:main``): draws the loss, throughput and stage times of metrics files to a PNG."""

from megatron_ext.cli.plot_metrics import main

if __name__ == "__main__":
    raise SystemExit(main())

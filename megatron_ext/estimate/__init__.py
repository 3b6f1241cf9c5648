"""Analytic models of a run, computed without building anything: shapes, FLOPs, memory, time, schedules; and the
metrics file runs write (``metrics_file``), which the calibration fits these models to."""

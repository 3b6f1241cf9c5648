"""Analytic models of a run, computed without building anything: shapes, FLOPs, memory, time, schedules."""

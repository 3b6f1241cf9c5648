"""The signals that ask a run for a planned stop (save, then exit 75: ``resilience``).

A module of its own, without torch: the rank's spawned helpers (``helper_processes``) import it in a new
interpreter, where importing torch would cost each one seconds of CPU and a few hundred MB.
"""

from __future__ import annotations

import signal

HANDLED_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)
"""SIGTERM (torchrun, ``scancel``), SIGUSR1 and SIGUSR2 (SLURM's ``--signal`` before a time limit)."""

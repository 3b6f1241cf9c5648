"""``torchrun`` that keeps the workers' exit code and leaves planned stops to them.

``torchrun`` reports any failing worker as exit status 1, so a recipe could
not tell "stopped early with a checkpoint, requeue me" (75) from a crash.
This wrapper runs torchrun's own launcher with the same arguments and exits
with the workers' code when every worker that exited with an error code chose
the same one.

SIGTERM, SIGUSR1 and SIGUSR2 are passed to the workers (the training ranks,
its direct children) and to nothing else: never to the helper processes the
ranks started, and without torchrun's own shutdown, which on SIGTERM would
kill the workers 30 s later whether or not their save was done. Workers
started with ``--exit-signal-handler`` finish their iteration, save and exit
75, and so does this launcher; workers without it die of the signal, and the
launcher exits 128 + its number (143 for SIGTERM). SLURM's
``--signal=USR1@SECONDS`` before the time limit, a preemption's SIGTERM and
``scancel`` all end in the same save::

    python -m megatron_ext.cli.launch --nproc-per-node 8 pretrain_gpt.py ...

torchrun's ``--signals-to-handle`` keeps its meaning for the other signals
(SIGINT, SIGHUP, SIGQUIT by default): torchrun shuts the workers down.
"""

from __future__ import annotations

import contextlib
import signal
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import FrameType

import psutil

from megatron_ext import notices
from megatron_ext.config.exit_codes import SIGNAL_BASE, ExitCode
from megatron_ext.training.ports import free_port

PLANNED_STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)
"""The signals that ask the ranks to save and stop (``--exit-signal-handler``): passed on to the workers only."""


def _forward_to_workers(signum: int, _frame: FrameType | None) -> None:
    # psutil is imported with the module, not here: a second signal during the first one's import would find
    # a partially initialised module. torchrun's workers are this process's own children; their helpers are theirs.
    for child in psutil.Process().children(recursive=False):
        with contextlib.suppress(psutil.NoSuchProcess):
            child.send_signal(signum)


def _others(signals_to_handle: str) -> str:
    """torchrun's ``--signals-to-handle`` without the planned-stop signals, which this launcher passes on."""
    names = {signal.Signals(s).name for s in PLANNED_STOP_SIGNALS}
    return ",".join(name for name in (n.strip() for n in signals_to_handle.split(",")) if name and name not in names)


def local_command(script: str | Path, args: Sequence[str], *, nproc: int) -> list[str]:
    """``script`` on ``nproc`` processes of this machine under this launcher, on a free port."""
    return [
        sys.executable,
        "-m",
        "megatron_ext.cli.launch",
        "--nproc-per-node",
        str(nproc),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(free_port()),
        str(script),
        *args,
    ]


def chosen_exit_code(failed: Iterable[int]) -> int:
    """The exit code of workers of which some failed: the one positive code they chose; else, when every one
    was killed by the same signal, ``SIGNAL_BASE`` + its number; else 1.

    Workers killed by a signal (negative codes) next to one that exited by itself were only ended because it
    failed.
    """
    failed = list(failed)
    codes = {code for code in failed if code > 0}
    if codes:
        return codes.pop() if len(codes) == 1 else ExitCode.ERROR
    signals = {code for code in failed if code < 0}
    return SIGNAL_BASE - signals.pop() if len(signals) == 1 else ExitCode.ERROR


def main(argv: Sequence[str] | None = None) -> int:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    notices.install()  # torchrun's banner on OMP_NUM_THREADS in one line of ours
    args = get_args_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    if hasattr(args, "signals_to_handle"):  # torch >= 2.6; before it torchrun shuts down on SIGTERM itself
        args.signals_to_handle = _others(args.signals_to_handle)
    for sig in PLANNED_STOP_SIGNALS:
        signal.signal(sig, _forward_to_workers)
    try:
        run(args)
    except ChildFailedError as exc:
        # Workers that exited by themselves have positive codes; once one has,
        # torchrun terminates the rest (negative: killed by a signal) even if they
        # were only tearing down. The code the workers chose is the answer.
        return chosen_exit_code(failure.exitcode for failure in exc.failures.values())
    except SignalException as exc:
        # torchrun has forwarded another signal (SIGINT, SIGHUP, ...) and waited for (or killed) the workers.
        return SIGNAL_BASE + int(exc.sigval)
    return ExitCode.OK


if __name__ == "__main__":
    sys.exit(main())

"""``torchrun`` that keeps the workers' exit code.

``torchrun`` reports any failing worker as exit status 1, so a recipe could
not tell "stopped early with a checkpoint, requeue me" (75) from a crash.
This wrapper runs torchrun's own launcher with the same arguments and exits
with the workers' code when every worker that exited with an error code chose
the same one.

It also forwards SIGUSR1 and SIGUSR2 to the workers (torchrun itself would
die of them): SLURM's ``--signal=USR1@SECONDS`` before the time limit then
reaches the training processes, which save and stop (``--exit-signal-handler``).
SIGTERM is torchrun's own business: it forwards it, kills the workers that have
not exited 30 s later, and this wrapper then exits 143 (128 + SIGTERM); workers
started with ``--exit-signal-handler`` save within that grace if they can.
Prefer USR1 for a planned stop: it waits for the save and exits 75::

    python -m megatron_ext.cli.launch --nproc-per-node 8 pretrain_gpt.py ...
"""

from __future__ import annotations

import contextlib
import signal
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import FrameType

from megatron_ext.config.exit_codes import SIGNAL_BASE, ExitCode
from megatron_ext.training.ports import free_port


def _forward_to_workers(signum: int, _frame: FrameType | None) -> None:
    import psutil

    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            child.send_signal(signum)


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
    """The exit code of workers of which some failed: the one positive code they chose, else 1.

    Workers killed by a signal (negative codes) were only ended because another failed.
    """
    codes = {code for code in failed if code > 0}
    return codes.pop() if len(codes) == 1 else 1


def main(argv: Sequence[str] | None = None) -> int:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    for sig in (signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, _forward_to_workers)
    args = get_args_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        run(args)
    except ChildFailedError as exc:
        # Workers that exited by themselves have positive codes; once one has,
        # torchrun terminates the rest (negative: killed by a signal) even if they
        # were only tearing down. The code the workers chose is the answer.
        return chosen_exit_code(failure.exitcode for failure in exc.failures.values())
    except SignalException as exc:
        # torchrun has forwarded the signal and waited for (or killed) the workers.
        return SIGNAL_BASE + int(exc.sigval)
    return ExitCode.OK


if __name__ == "__main__":
    sys.exit(main())

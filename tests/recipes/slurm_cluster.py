"""A real, throw-away SLURM cluster on this one machine, for the ``slurm`` tests.

One ``munged``, one ``slurmctld`` and two ``slurmd`` (``node1`` and
``node2``, both on ``127.0.0.1`` with a port each) run in the foreground as
children of the test process, every file they use (munge key and socket,
``slurm.conf``, state, spool, logs) in one private temporary directory. Clients
(``sbatch``, ``squeue``, ``scontrol`` and the recipes' own ``srun``) find the
cluster through ``SLURM_CONF``, which :meth:`SlurmCluster.env` sets; nothing
under ``/etc`` is read or written.

The daemons need SLURM's and munge's Debian packages (``scripts/setup_system.sh``
installs them) and root, since ``slurmd`` starts jobs as the submitting user.
``SlurmCluster.start`` raises :class:`ClusterUnavailable` only for those two
reasons; a daemon that is installed but fails to start is a test failure.

Configuration choices (each the simplest plugin that needs no system service):
``proctrack/linuxproc`` (process tree from ``/proc``, no cgroups),
``task/none``, ``select/cons_tres`` with ``CR_CPU``, no accounting, and both
nodes described with this machine's CPUs, which they share.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from datetime import datetime
from pathlib import Path

from megatron_ext.training.ports import free_port
from tests.waits import QUICK_S, READY_S, STOP_S

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "squeue", "scontrol", "srun", "sinfo", "scancel")
NODES = ("node1", "node2")
PARTITION = "test"
JOB_FIELDS = ("JobState", "Reason", "Restarts", "RunTime", "NodeList", "ExitCode")
"""What a failed wait shows of a job's ``scontrol`` record."""
FINAL_STATES = frozenset(
    {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "PREEMPTED"}
)


class ClusterUnavailable(RuntimeError):
    """This machine cannot run the daemons at all (not installed, not root)."""


def _free_ports(count: int) -> list[int]:
    """Distinct free TCP ports on the loopback, below the ephemeral range (``training.ports.free_port``: a port
    bind(0) gives may be taken meanwhile as the local end of a training run's connection)."""
    ports: list[int] = []
    while len(ports) < count:
        if (port := free_port()) not in ports:
            ports.append(port)
    return ports


def _die_with_parent() -> None:
    """In the daemon's child process: SIGTERM it when the test process dies, however it dies."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _which(name: str) -> str | None:
    # The daemons live in /usr/sbin, which a non-login PATH may lack.
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")


def check_available() -> None:
    """Raise ClusterUnavailable with the reason if the daemons cannot run here."""
    missing = [name for name in (*DAEMONS, *CLIENTS) if _which(name) is None]
    if missing:
        raise ClusterUnavailable(
            f"SLURM/munge not installed (missing {', '.join(missing)}); "
            "run `bash scripts/setup_system.sh` (Debian packages slurm-wlm and munge)"
        )
    if os.geteuid() != 0:
        raise ClusterUnavailable("slurmd must run as root to start jobs; run the slurm tests as root")


def node_cpus() -> int:
    """CPUs of this machine as ``slurmd -C`` reports them (each node gets them all)."""
    out = subprocess.run(
        [_which("slurmd") or "slurmd", "-C"], capture_output=True, text=True, check=True, timeout=QUICK_S
    ).stdout
    return int(re.search(r"\bCPUs=(\d+)", out).group(1))  # type: ignore[union-attr]


class SlurmCluster:
    """Controller + two node daemons + munge, started and stopped by the caller."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.conf = root / "slurm.conf"
        self.munge_socket = root / "munge" / "munge.socket"
        self.logs = root / "log"
        self._procs: dict[str, subprocess.Popen[bytes]] = {}

    # ---------------------------------------------------------------- clients
    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """Environment for client commands: SLURM_CONF points at this cluster."""
        env = dict(os.environ if base is None else base)
        for key in list(env):
            # A test run inside a real allocation must not leak its job into ours.
            if key.startswith(("SLURM_", "SBATCH_", "SALLOC_", "SRUN_")):
                del env[key]
        env["SLURM_CONF"] = str(self.conf)
        env["PATH"] = f"{env.get('PATH', '')}:/usr/sbin:/sbin"
        return env

    def run(self, *cmd: str, check: bool = True, timeout: float = QUICK_S) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(list(cmd), capture_output=True, text=True, env=self.env(), timeout=timeout)
        if check and proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}: {proc.stderr.strip()}\n{self.diagnostics()}")
        return proc

    def job(self, job_id: int) -> dict[str, str]:
        """``scontrol show job`` as a dict (one line with -o: Key=Value pairs)."""
        out = self.run("scontrol", "-o", "show", "job", str(job_id)).stdout
        return dict(m.groups() for m in re.finditer(r"(\w+(?::\w+)?)=(\S*)", out))

    def wait_for_job(
        self,
        job_id: int,
        *,
        timeout: float,
        until: Callable[[dict[str, str]], bool] | None = None,
        what: str = "its end",
    ) -> dict[str, str]:
        """Wait until the job ends (or ``until(record)`` holds, ``what`` saying what that is); its ``scontrol``
        record. Past ``timeout`` it raises with the last record, the tail of the job's output and the daemons' logs."""
        deadline = time.monotonic() + timeout
        while True:
            record = self.job(job_id)
            if record.get("JobState") in FINAL_STATES or (until is not None and until(record)):
                return record
            if time.monotonic() > deadline:
                shown = " ".join(f"{key}={record.get(key)}" for key in JOB_FIELDS)
                raise TimeoutError(
                    f"job {job_id}: waited {timeout:.0f} s for {what}, in vain; last seen {shown}\n"
                    f"{self._job_output(record)}{self.diagnostics()}"
                )
            self.assert_daemons_alive()
            time.sleep(0.5)

    @staticmethod
    def _job_output(record: dict[str, str], lines: int = 25) -> str:
        """The tail of the job's batch output (its ``StdOut``), for a failure message."""
        path = Path(record.get("StdOut") or "/nonexistent")
        if not path.is_file():
            return f"--- batch output {path}: none ---\n"
        tail = path.read_text(errors="replace").splitlines()[-lines:]
        return f"--- batch output {path} ---\n" + "\n".join(tail) + "\n"

    # -------------------------------------------------------------- lifecycle
    def start(self, *, timeout: float = READY_S) -> None:
        check_available()
        cpus = node_cpus()
        for sub in ("munge", "state", "spool", "log"):
            (self.root / sub).mkdir(mode=0o700, parents=True, exist_ok=True)
        self._start_munge()
        ctld_port, *node_ports = _free_ports(1 + len(NODES))
        self.conf.write_text(self._config(ctld_port, node_ports, cpus))
        self._spawn("slurmctld", [_which("slurmctld"), "-D", "-c", "-f", str(self.conf)])
        for node in NODES:
            self._spawn(f"slurmd-{node}", [_which("slurmd"), "-D", "-N", node, "-f", str(self.conf)])
        self._wait_until_idle(timeout)

    def stop(self) -> None:
        """Cancel every job, then stop the daemons (TERM, then KILL); never raises."""
        if "slurmctld" in self._procs and self._procs["slurmctld"].poll() is None:
            with contextlib.suppress(Exception):
                self.run("scancel", "--full", f"--partition={PARTITION}", check=False, timeout=STOP_S)
                deadline = time.monotonic() + STOP_S
                while (
                    time.monotonic() < deadline and self.run("squeue", "-h", check=False, timeout=STOP_S).stdout.strip()
                ):
                    time.sleep(0.5)
        # Node daemons first (they kill their job steps), then the controller, then munge.
        for name in sorted(self._procs, key=lambda n: (not n.startswith("slurmd"), n == "munged")):
            proc = self._procs[name]
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=STOP_S)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=STOP_S)
        self._kill_leftover_job_processes()
        self._procs.clear()

    def time_limit_checks(self) -> list[datetime]:
        """When slurmctld checked time limits and sent pre-time-limit signals (every 30 s)."""
        text = (self.logs / "slurmctld.file.log").read_text(errors="replace")
        return [
            datetime.fromisoformat(m)
            for m in re.findall(r"^\[([\d\-T:.]+)\] debug2: Testing job time limits", text, re.M)
        ]

    def assert_daemons_alive(self) -> None:
        dead = {name: proc.returncode for name, proc in self._procs.items() if proc.poll() is not None}
        if dead:
            raise RuntimeError(f"SLURM daemons exited: {dead}\n{self.diagnostics()}")

    def diagnostics(self, lines: int = 25) -> str:
        """The tail of every daemon's log file (without debug lines), for assertion messages."""
        parts = []
        for log in sorted(self.logs.glob("*.file.log")):
            text = log.read_text(errors="replace").splitlines()
            tail = [line for line in text if "] debug" not in line][-lines:]
            parts.append(f"--- {log.name} ---\n" + "\n".join(tail))
        return "\n".join(parts)

    # ---------------------------------------------------------------- helpers
    def _spawn(self, name: str, cmd: list[str | None]) -> None:
        log = open(self.logs / f"{name}.log", "ab")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(
            [str(c) for c in cmd],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=self.env(),
            cwd=self.root,
            start_new_session=True,  # a Ctrl-C in the terminal is pytest's, not theirs
            preexec_fn=_die_with_parent,
        )
        log.close()
        self._procs[name] = proc

    def _start_munge(self) -> None:
        key = self.root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self._spawn(
            "munged",
            [
                _which("munged"),
                "--foreground",
                "--force",  # root and a private key in /tmp: fine for a test cluster
                f"--socket={self.munge_socket}",
                f"--key-file={key}",
                f"--pid-file={self.root / 'munge' / 'munged.pid'}",
                f"--seed-file={self.root / 'munge' / 'munged.seed'}",
                f"--log-file={self.logs / 'munged.file.log'}",
            ],
        )
        deadline = time.monotonic() + READY_S
        while not self.munge_socket.exists():
            self.assert_daemons_alive()
            if time.monotonic() > deadline:
                raise RuntimeError(f"munged did not create {self.munge_socket} in {READY_S} s\n{self.diagnostics()}")
            time.sleep(0.1)

    def _config(self, ctld_port: int, node_ports: list[int], cpus: int) -> str:
        host = socket.gethostname().split(".")[0]
        nodes = "\n".join(
            f"NodeName={node} NodeHostname={host} NodeAddr=127.0.0.1 Port={port} CPUs={cpus} State=UNKNOWN"
            for node, port in zip(NODES, node_ports, strict=True)
        )
        return f"""\
# A two-node test cluster on one machine (tests/recipes/slurm_cluster.py).
ClusterName=recipes-test
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# cred_expire also delays a requeued job's next start (default 120 s).
AuthInfo=socket={self.munge_socket},cred_expire=5
CredType=cred/munge
StateSaveLocation={self.root / "state"}
SlurmdSpoolDir={self.root / "spool"}/%n
SlurmctldPidFile={self.root / "state"}/slurmctld.pid
SlurmdPidFile={self.root / "spool"}/slurmd-%n.pid
SlurmctldLogFile={self.logs}/slurmctld.file.log
SlurmdLogFile={self.logs}/slurmd-%n.file.log
# debug2 logs each time-limit check (every 30 s), which the signal test aligns to.
SlurmctldDebug=debug2
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SwitchType=switch/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
# Look at pending jobs every 2 s (default 60 s): a requeued job starts soon after its begin time.
SchedulerParameters=sched_interval=2
ReturnToService=2
JobRequeue=1
KillWait=30
MinJobAge=600
{nodes}
PartitionName={PARTITION} Nodes={",".join(NODES)} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
"""

    def _wait_until_idle(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        states = ""
        while time.monotonic() < deadline:
            self.assert_daemons_alive()
            proc = self.run("sinfo", "-h", "-N", "-o", "%N %t", check=False)
            states = proc.stdout.strip()
            found = dict(line.split() for line in states.splitlines() if len(line.split()) == 2)
            if proc.returncode == 0 and all(found.get(node) == "idle" for node in NODES):
                return
            time.sleep(0.5)
        raise RuntimeError(f"nodes not idle after {timeout:.0f} s: {states!r}\n{self.diagnostics()}")

    def _kill_leftover_job_processes(self) -> None:
        """Kill what a job left behind: every process started with this cluster's SLURM_CONF.

        ``slurmstepd`` and the job's processes are not children of ``slurmd``
        (it double-forks), so a stopped daemon does not take them along.
        """
        import psutil

        mine = str(self.conf)
        leftovers = []
        for proc in psutil.process_iter():
            with contextlib.suppress(psutil.Error):
                if proc.pid != os.getpid() and proc.environ().get("SLURM_CONF") == mine:
                    proc.kill()
                    leftovers.append(proc)
        psutil.wait_procs(leftovers, timeout=STOP_S)


@contextlib.contextmanager
def running_cluster(prefix: str = "slurm-") -> Iterator[SlurmCluster]:
    """A started cluster in a fresh directory; stopped and removed on exit, even on failure."""
    # Short path: the munge socket path must fit a sockaddr_un (108 bytes).
    root = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    cluster = SlurmCluster(root)

    def _terminated(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)  # unwind through the finally below

    previous = signal.signal(signal.SIGTERM, _terminated)
    try:
        cluster.start()
        yield cluster
    finally:
        try:
            cluster.stop()
        finally:
            signal.signal(signal.SIGTERM, previous)
            shutil.rmtree(root, ignore_errors=True)

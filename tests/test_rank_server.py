"""The rank server forks a script as ``python SCRIPT ARGS`` would run it: its arguments, environment, output and
exit status, and a kill that ends it (``tests/rank_server.py``); a benchmark's ranks through its client
(``tests/rank_client.py``)."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests import rank_client
from tests.rank_server import RankServer

pytestmark = pytest.mark.unit

SCRIPT = """
import os, sys, time
print("argv", sys.argv[1:], "cwd", os.getcwd() == os.environ["EXPECTED_CWD"], "path0", sys.path[0])
print("main", __name__, "torch imported", "torch" in sys.modules)
print("to stderr", file=sys.stderr)
if sys.argv[1] == "sleep":
    time.sleep(60)
sys.exit(int(sys.argv[1]))
"""


def test_a_forked_script_has_its_arguments_environment_output_and_exit_status(tmp_path: Path) -> None:
    repo = Path(__file__).resolve().parent.parent
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    env = dict(os.environ) | {"PYTHONPATH": str(repo)}
    server = RankServer(repo, env)
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        rank = server.start(script, ["3", "x y"], env=env | {"EXPECTED_CWD": str(repo)}, stdout=out, stderr=err)
        assert rank.wait(timeout=60) == 3
        out.seek(0)
        err.seek(0)
        assert out.read().splitlines() == [
            f"argv ['3', 'x y'] cwd True path0 {tmp_path}",
            "main __main__ torch imported True",  # imported by the server before the fork
        ]
        assert err.read() == "to stderr\n"
        sleeper = server.start(script, ["sleep"], env=env | {"EXPECTED_CWD": str(repo)}, stdout=out, stderr=err)
        assert sleeper.poll() is None
        sleeper.kill()
        assert sleeper.wait(timeout=30) == -signal.SIGKILL
    assert server.proc is not None and server.proc.poll() is None  # the server outlives its ranks


CLIENT_SCRIPT = """
import os, sys, time
# One write per line: with PYTHONUNBUFFERED, print() writes each piece apart and two ranks' pieces interleave.
sys.stdout.write(f"rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']}\\n")
sys.stdout.flush()
(Path := __import__("pathlib").Path)(sys.argv[2], os.environ["RANK"]).write_text(str(os.getpid()))
if sys.argv[1] == "sleep":
    time.sleep(120)
sys.exit(int(sys.argv[1]) if os.environ["RANK"] == "1" else 0)
"""


def test_a_benchmark_s_ranks_are_forked_through_the_client_and_end_with_it(tmp_path: Path) -> None:
    """``python -m tests.rank_client --nproc 2 SCRIPT ARGS`` (a benchmark's ``BENCH_PRETRAIN_LAUNCHER``, set by
    ``bench_env``): two ranks of the script with their rank variables, the exit code the launcher would report, and
    ranks that end when the client is killed."""
    import psutil

    from tests import waits
    from tests.conftest import REPO, bench_env

    env = bench_env()
    command = [*shlex.split(env[rank_client.LAUNCHER_VARIABLE]), "--nproc", "2", str(tmp_path / "script.py")]
    (tmp_path / "script.py").write_text(CLIENT_SCRIPT)
    (tmp_path / "ran").mkdir()
    proc = waits.run([*command, "7", tmp_path / "ran"], timeout=waits.QUICK_S, env=env, cwd=REPO)
    assert proc.returncode == 7, proc.stdout + proc.stderr
    assert sorted(proc.stdout.splitlines()) == ["rank 0 of 2", "rank 1 of 2"]
    pids = {int(p.read_text()) for p in (tmp_path / "ran").iterdir()}
    assert len(pids) == 2 and os.getpid() not in pids
    (tmp_path / "sleeping").mkdir()
    client = subprocess.Popen(
        [*command, "sleep", str(tmp_path / "sleeping")], env=env, cwd=REPO, stdout=subprocess.DEVNULL
    )
    try:
        started = waits.wait_for(
            "both ranks to start", lambda: len(list((tmp_path / "sleeping").iterdir())) == 2, timeout=waits.READY_S
        )
        assert started
        sleeping = [int(p.read_text()) for p in (tmp_path / "sleeping").iterdir()]
        assert all(psutil.pid_exists(pid) for pid in sleeping)
    finally:
        client.kill()
        client.wait(timeout=waits.STOP_S)
    waits.wait_for(
        "the ranks to end with their client", lambda: not any(psutil.pid_exists(p) for p in sleeping), timeout=60
    )


def test_a_benchmark_names_the_client_only_when_the_variable_is_set(monkeypatch: pytest.MonkeyPatch) -> None:
    """``bench/train_throughput.py``'s ``pretrain_command``: a plain interpreter for one process, the launcher
    for more (what the GPU machine runs, and tests/bench/test_train_throughput.py end to end), and with
    ``BENCH_PRETRAIN_LAUNCHER`` (``bench_env``) the client's command instead."""
    import importlib.util
    import sys

    from megatron_ext.cli.launch import local_command
    from tests.conftest import PRETRAIN, REPO

    spec = importlib.util.spec_from_file_location("train_throughput", REPO / "bench" / "train_throughput.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "train_throughput", bench)  # its dataclasses look their module up there
    spec.loader.exec_module(bench)
    assert bench.LAUNCHER_VARIABLE == rank_client.LAUNCHER_VARIABLE
    monkeypatch.delenv(rank_client.LAUNCHER_VARIABLE, raising=False)
    assert bench.pretrain_command(["--x", "1"], nproc=1) == [sys.executable, str(PRETRAIN), "--x", "1"]
    launched, expected = bench.pretrain_command(["--x", "1"], nproc=2), local_command(PRETRAIN, ["--x", "1"], nproc=2)
    port = expected.index("--master-port") + 1  # a free port, drawn anew by each
    assert launched[:port] + launched[port + 1 :] == expected[:port] + expected[port + 1 :]
    monkeypatch.setenv(rank_client.LAUNCHER_VARIABLE, "/some/python -m tests.rank_client")
    assert bench.pretrain_command(["--x", "1"], nproc=2) == [
        "/some/python", "-m", "tests.rank_client", "--nproc", "2", str(PRETRAIN), "--x", "1"
    ]  # fmt: skip

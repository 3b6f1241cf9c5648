"""The rank server forks a script as ``python SCRIPT ARGS`` would run it: its arguments, environment, output and
exit status, and a kill that ends it (``tests/rank_server.py``)."""

from __future__ import annotations

import os
import signal
import tempfile
from pathlib import Path

import pytest

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

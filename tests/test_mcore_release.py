"""The one supported Megatron-Core release (``megatron_ext/mcore_release.py``): pinned where it is installed, named
by ``--dry-run``, and any other refused by ``pretrain_gpt.py`` in one line before anything is built."""

from __future__ import annotations

from pathlib import Path

import pytest

from megatron_ext import mcore_release
from megatron_ext.config.exit_codes import ExitCode

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[1]


def test_requirements_pin_the_supported_release_and_it_is_the_one_installed() -> None:
    pins = [line for line in (REPO / "requirements.txt").read_text().splitlines() if line.startswith("megatron-core")]
    assert pins == [f"megatron-core=={mcore_release.SUPPORTED}"]
    assert mcore_release.installed() is not None
    assert mcore_release.problem(mcore_release.installed()) is None


@pytest.mark.parametrize(
    ("version", "release"),
    [("0.19.2", "0.19.2"), ("0.19.2+nv25.11", "0.19.2"), ("0.19.2.post1", "0.19.2"), ("0.19.2rc1", "0.19.2rc1"),
     ("0.19.2.dev0+abc", "0.19.2.dev0"), ("0.16.1", "0.16.1")],
)  # fmt: skip
def test_a_local_build_or_a_packaging_fix_is_the_release_a_pre_release_is_not(version: str, release: str) -> None:
    assert mcore_release.release_of(version) == release
    assert (mcore_release.problem(version) is None) == (release == mcore_release.SUPPORTED)


def _pretrain(argv: list[str]) -> int:
    from megatron_ext.training import entry

    def unused(*_args: object) -> None:
        raise AssertionError("nothing may be built on another Megatron-Core release")

    return entry.pretrain(model_provider=unused, forward_step=unused, datasets_provider=unused, argv=argv)  # type: ignore[arg-type]


@pytest.mark.parametrize("installed", ["0.16.1", None])
def test_pretrain_refuses_another_release_in_one_line_and_dry_run_names_it(
    installed: str | None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(mcore_release, "installed", lambda: installed)
    assert _pretrain(["--mock-data", "--train-iters", "2"]) == ExitCode.INVALID
    err = capsys.readouterr().err.strip().splitlines()
    found = "megatron-core 0.16.1 is installed" if installed else "megatron-core is not installed"
    assert err == [
        f"error: {found}; this project runs on megatron-core {mcore_release.SUPPORTED}"
        + (" only (the release its tests cover)" if installed else "")
        + f": run bash scripts/setup.sh, or pip install megatron-core=={mcore_release.SUPPORTED} (Python >= 3.12)"
    ]
    # A rehearsal elsewhere still validates, and says what the run would do.
    assert _pretrain(["--mock-data", "--train-iters", "2", "--dry-run"]) == ExitCode.OK
    assert f"  {err[0].removeprefix('error: ')} (the run refuses to start)" in capsys.readouterr().out.splitlines()


def test_dry_run_names_the_release_it_runs_on(capsys: pytest.CaptureFixture[str]) -> None:
    assert _pretrain(["--mock-data", "--train-iters", "2", "--dry-run"]) == ExitCode.OK
    assert f"  megatron-core {mcore_release.SUPPORTED} (the supported release)" in capsys.readouterr().out.splitlines()

"""The one Megatron-Core release this project supports, and the check that a run is on it.

The tests, the upgrade checkpoints and the calculator's rules that mirror Megatron-Core (bucket sizes, the
microbatch calculator) are all checked against this release: a run on another would half work (a changed
signature fails mid-run, a changed default changes the result silently). ``requirements.txt`` pins the same
version (``tests/test_mcore_release.py``). Read from the installed package's metadata: no import of
Megatron-Core or torch.
"""

from __future__ import annotations

import importlib.metadata

SUPPORTED = "0.19.2"
"""The Megatron-Core release (``pip install megatron-core==0.19.2``; it needs Python >= 3.12)."""

FIX = f"run bash scripts/setup.sh, or pip install megatron-core=={SUPPORTED} (Python >= 3.12)"


def installed() -> str | None:
    """The installed megatron-core's version (None when it is not installed)."""
    try:
        return importlib.metadata.version("megatron-core")
    except importlib.metadata.PackageNotFoundError:
        return None


def release_of(version: str) -> str:
    """The release a version string is: ``0.19.2`` of ``0.19.2``, ``0.19.2+abc123`` (a local build of it) and
    ``0.19.2.post1`` (a packaging fix); a pre-release (``0.19.2rc1``, ``0.19.2.dev0``) is itself."""
    return version.split("+", 1)[0].split(".post", 1)[0]


def problem(version: str | None) -> str | None:
    """One line when ``version`` (the installed one, None: none) is not the supported release, else None."""
    if version is None:
        return f"megatron-core is not installed; this project runs on megatron-core {SUPPORTED}: {FIX}"
    if release_of(version) != SUPPORTED:
        return (
            f"megatron-core {version} is installed; this project runs on megatron-core {SUPPORTED} only (the "
            f"release its tests cover): {FIX}"
        )
    return None


def note(version: str | None) -> str:
    """``--dry-run``'s line on the Megatron-Core here (a rehearsal may run where it is missing or another one)."""
    trouble = problem(version)
    if trouble is None:
        return f"megatron-core {version} (the supported release)"
    return f"{trouble} (the run refuses to start)"

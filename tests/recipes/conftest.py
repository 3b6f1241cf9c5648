"""The SLURM cluster of the ``slurm`` tests: one per test module (tests/recipes/slurm_cluster.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.recipes.slurm_cluster import ClusterUnavailable, SlurmCluster, check_available, running_cluster


@pytest.fixture(scope="module")
def cluster() -> Iterator[SlurmCluster]:
    try:
        check_available()
    except ClusterUnavailable as exc:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the SLURM tests: {exc}")
        pytest.skip(str(exc))
    with running_cluster() as started:
        yield started

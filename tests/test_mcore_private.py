"""The private names of Megatron-Core that the project uses (``megatron_ext/mcore_private.py``) exist with the
parameters we call them with: an upgrade that moves one fails here, in a second."""

from __future__ import annotations

import importlib
import inspect
from functools import reduce

import pytest

from megatron_ext.mcore_private import PRIVATE_NAMES, PrivateName

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("private", PRIVATE_NAMES, ids=lambda p: p.name)
def test_a_private_name_we_use_is_still_there(private: PrivateName) -> None:
    module = importlib.import_module(private.module)
    assert hasattr(module, private.name.split(".")[0]), f"{private.module} has no {private.name}: {private.use}"
    value = reduce(getattr, private.name.split("."), module)
    if private.parameters:
        accepted = inspect.signature(value).parameters
        missing = [p for p in private.parameters if p not in accepted]
        assert not missing, f"{private.module}.{private.name} lost {missing} ({list(accepted)}): {private.use}"


def test_the_cpu_backend_s_table_resolves() -> None:
    from megatron_ext.training import cpu_backend

    for owner, name, _ in cpu_backend._patches():
        assert hasattr(owner, name), f"{owner.__name__} has no {name} (training/cpu_backend.py)"

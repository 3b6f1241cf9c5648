"""``--split`` is checked when the arguments are parsed: every string Megatron-Core reads as the user wrote it is
taken with Megatron-Core's meaning; one it would misread or crash on is one ``error:`` line naming the flag."""

from __future__ import annotations

import pytest

from megatron_ext.config.arguments import ConfigError
from megatron_ext.config.data_args import parse_split
from megatron_ext.config.training_config import parse_args
from tests.conftest import run_script

pytestmark = pytest.mark.unit

ACCEPTED = [
    "969,30,1",
    "969, 30, 1",  # Megatron-LM's old default, with spaces
    "90/5/5",  # Megatron-LM's other separator
    "100",  # fewer than three: padded with zeros
    "99,1",
    "0.9,0.1,0",
    ".5,.5",
    "1.,2,3",
    "+1,2,3",
    "90 5 5",
    "0,1,0",  # no training share: Megatron takes it (the training data set is then refused at start-up)
    "'99,1,0'",  # quoted inside a launch script's flag array (NVIDIA's Llama 3 examples pass it so)
    '"969, 30, 1"',
]
REFUSED = [
    ("100,-5,5", "'-5', which is not a non-negative decimal number"),  # Megatron-Core would read 100,5,5
    ("0,0,0", "gives every split a share of 0"),  # NaN proportions there
    ("0", "gives every split a share of 0"),
    ("abc", "'abc', which is not a non-negative decimal number"),
    ("nan,1,1", "'nan', which is not"),
    ("inf", "'inf', which is not"),
    ("1e3,1", "'1e3', which is not"),  # Megatron-Core would read 1,3
    ("969,,1", "an empty part"),  # Megatron-Core would read 969,1,0
    ("90,5,", "an empty part"),
    ("1,2,3,4", "has 4 parts"),  # an assertion there
    ("1..2", "'1..2', which is not"),  # a ValueError there
    ("  ", "--split is empty"),
    ("9" * 400, "too large"),
    ("'99,1,0", '"\'99", which is not'),  # an unmatched quote is not read past
]


@pytest.mark.parametrize("text", ACCEPTED)
def test_accepted_splits_mean_what_megatron_core_reads(text: str) -> None:
    from megatron.core.datasets.blended_megatron_dataset_config import parse_and_normalize_split

    weights = parse_split(text)
    total = sum(weights)
    assert [w / total for w in weights] == pytest.approx(parse_and_normalize_split(text), rel=1e-12)
    assert parse_args(["--mock-data", "--split", text]).data.split == text


@pytest.mark.parametrize(("text", "message"), REFUSED)
def test_malformed_splits_are_one_named_error(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as exc:
        parse_args(["--mock-data", "--split", text])
    assert str(exc.value).startswith("--split") and message in str(exc.value)
    assert len(str(exc.value).splitlines()) == 1 and "e.g. 969,30,1" in str(exc.value)


def test_dry_run_refuses_a_negative_share_before_anything_starts() -> None:
    proc = run_script(["--mock-data", "--split", "100,-5,5", "--dry-run"])
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --split '100,-5,5' has '-5'"), proc.stderr
    assert "Traceback" not in proc.stderr

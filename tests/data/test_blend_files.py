"""Blends as files: Megatron-LM's --data-args-path and --per-split-data-args-path, and the blend that
tools/merge_datasets.py --write-blend writes from a directory of datasets (by tokens, or by a mix of sources)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from megatron_ext.cli import merge_datasets
from megatron_ext.config.arguments import ConfigError
from megatron_ext.config.training_config import parse_args
from megatron_ext.data.indexed import IndexedWriter
from megatron_ext.data.preflight import preflight
from tests import waits
from tests.conftest import MODEL, _env, run_script
from tests.waits import QUICK_S

pytestmark = pytest.mark.unit

NULL = ["--tokenizer-type", "NullTokenizer", "--vocab-size", "999"]


def dataset(prefix: Path, *, tokens_per_doc: int, docs: int = 40) -> Path:
    rng = np.random.default_rng(tokens_per_doc)
    writer = IndexedWriter(prefix, np.uint16)
    writer.add_documents(rng.integers(0, 999, size=tokens_per_doc * docs), np.full(docs, tokens_per_doc))
    writer.commit()
    return prefix


@pytest.fixture
def shards(tmp_path: Path) -> dict[str, Path]:
    root = tmp_path / "shards"
    root.mkdir()
    sizes = {"web-000": 30, "web-001": 10, "code-000": 20, "books-000": 40}
    return {name: dataset(root / f"{name}_text_document", tokens_per_doc=n) for name, n in sizes.items()}


def weights_of(path: Path) -> dict[str, float]:
    words = path.read_text().split()
    return {
        Path(p).name.removesuffix("_text_document"): float(w) for w, p in zip(words[0::2], words[1::2], strict=True)
    }


def test_a_written_blend_weighs_by_tokens_or_by_source_share(
    shards: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = shards["web-000"].parent
    assert merge_datasets.main(["--input", str(root), "--write-blend", str(tmp_path / "tokens.txt")]) == 0
    assert "4 datasets, 160 documents, 4,000 tokens" in capsys.readouterr().out
    assert weights_of(tmp_path / "tokens.txt") == {"books-000": 1600, "code-000": 800, "web-000": 1200, "web-001": 400}

    mix = ["--mix", "web:0.6", "code:0.3", "books-*:0.1"]
    assert merge_datasets.main(["--input", str(root), "--write-blend", str(tmp_path / "mix.txt"), *mix]) == 0
    out = capsys.readouterr().out
    assert "web: 2 datasets, 1,600 tokens, 60.0% of the blend" in out, out
    weights = weights_of(tmp_path / "mix.txt")
    # Within a source by tokens (web-000 has 3× web-001's), the sources at their shares.
    assert weights == pytest.approx({"web-000": 0.45, "web-001": 0.15, "code-000": 0.3, "books-000": 0.1})

    # An existing file is never replaced; a dataset matching no source, or two, is named.
    assert merge_datasets.main(["--input", str(root), "--write-blend", str(tmp_path / "mix.txt"), *mix]) == 1
    assert "exists" in capsys.readouterr().err
    assert merge_datasets.main(["--input", str(root), "--write-blend", str(tmp_path / "b.txt"), "--mix", "web:1"]) == 1
    err = capsys.readouterr().err
    assert "every dataset must match exactly one source of --mix: " in err
    assert "books-000_text_document matches no source; " in err and "code-000_text_document matches no source" in err
    both = ["--mix", "web:1", "*-000_*:1", "code:1", "books:1"]
    assert merge_datasets.main(["--input", str(root), "--write-blend", str(tmp_path / "b.txt"), *both]) == 1
    assert "web-000_text_document matches sources web, *-000_*" in capsys.readouterr().err
    assert not (tmp_path / "b.txt").exists()


def test_data_args_path_is_the_blend_it_holds(shards: dict[str, Path], tmp_path: Path) -> None:
    """Megatron-LM's reading: the file's words are --data-path's value; the run checks every prefix."""
    (tmp_path / "blend.txt").write_text(f"0.7 {shards['web-000']}\n0.3 {shards['code-000']}\n")
    cfg = preflight(parse_args([*MODEL, *NULL, "--data-args-path", str(tmp_path / "blend.txt")]), full=True).cfg
    assert cfg.data.data_path == ("0.7", str(shards["web-000"]), "0.3", str(shards["code-000"]))
    assert cfg.data.data_args_path is None
    direct = preflight(parse_args([*MODEL, *NULL, "--data-path", *cfg.data.data_path]), full=True).cfg
    assert cfg == direct  # the same run as the blend given on the command line

    (tmp_path / "bad.txt").write_text(f"0.7 {shards['web-000']}\n0.3 {tmp_path / 'missing'}\n")
    with pytest.raises(ConfigError, match=rf"dataset {tmp_path / 'missing'}: missing .*\(a dataset of {tmp_path}/bad"):
        preflight(parse_args([*MODEL, *NULL, "--data-args-path", str(tmp_path / "bad.txt")]), full=True)
    with pytest.raises(ConfigError, match=r"--data-args-path .*nowhere.txt: cannot read it \(No such file"):
        preflight(parse_args([*MODEL, *NULL, "--data-args-path", str(tmp_path / "nowhere.txt")]), full=True)
    with pytest.raises(ConfigError, match="--data-args-path holds the blend: give it alone"):
        parse_args([*MODEL, *NULL, "--data-args-path", "x", "--data-path", str(shards["web-000"])])


def test_per_split_data_args_path_is_the_three_blends(shards: dict[str, Path], tmp_path: Path) -> None:
    path = tmp_path / "splits.json"
    path.write_text(json.dumps({"train": [str(shards["web-000"]), str(shards["web-001"])],
                                "valid": f"1 {shards['code-000']}", "test": None}))  # fmt: skip
    cfg = preflight(parse_args([*MODEL, *NULL, "--per-split-data-args-path", str(path)]), full=True).cfg
    assert cfg.data.train_data_path == (str(shards["web-000"]), str(shards["web-001"]))
    assert cfg.data.valid_data_path == ("1", str(shards["code-000"])) and cfg.data.test_data_path == ()
    path.write_text(json.dumps({"train": [str(shards["web-000"])]}))
    with pytest.raises(ConfigError, match="lacks valid, test: give an object with keys train, valid and test"):
        preflight(parse_args([*MODEL, *NULL, "--per-split-data-args-path", str(path)]), full=True)
    path.write_text("{")
    with pytest.raises(ConfigError, match=r"splits\.json is not JSON"):
        preflight(parse_args([*MODEL, *NULL, "--per-split-data-args-path", str(path)]), full=True)


def test_pretrain_gpt_dry_run_reads_a_blend_file(shards: dict[str, Path], tmp_path: Path) -> None:
    """The written blend, as pretrain_gpt.py takes it (exit 2 and the prefix named when one is missing)."""
    root = shards["web-000"].parent
    assert merge_datasets.main(["--input", str(root), "--write-blend", str(tmp_path / "blend.txt")]) == 0
    proc = run_script([*MODEL, *NULL, "--data-args-path", str(tmp_path / "blend.txt"), "--dry-run"])
    assert proc.returncode == 0 and "configuration is valid" in proc.stdout, proc.stderr
    shards["code-000"].with_suffix(".idx").unlink()
    proc = run_script([*MODEL, *NULL, "--data-args-path", str(tmp_path / "blend.txt"), "--dry-run"])
    assert proc.returncode == 2 and "code-000_text_document: missing" in proc.stderr, proc.stderr


CHILD = """
import resource, sys
from megatron_ext.config.arguments import ConfigError
from megatron_ext.config.training_config import parse_args
from megatron_ext.data.preflight import preflight
# Each (soft, hard) limit in turn, in one process (one import of Megatron-Core): the hard limits only go down.
for limits in sys.argv[1].split(","):
    soft, hard = (int(n) for n in limits.split(":"))
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    try:
        preflight(parse_args(sys.argv[2:]), full=False)
    except ConfigError as exc:
        print("refused:", exc)
    print("soft limit:", resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    print("---")
"""


def test_a_blend_of_many_datasets_gets_the_open_files_megatron_core_keeps(tmp_path: Path) -> None:
    """60 datasets serving 3 splits: 60 × (3 + 3 splits × 3 index maps) + 512 = 1,232 open files. A soft limit
    below that is raised (up to the hard limit); a hard limit below it is refused before anything starts."""
    root = tmp_path / "many"
    root.mkdir()
    for i in range(60):
        dataset(root / f"s{i:02d}_text_document", tokens_per_doc=10 + i)
    assert merge_datasets.main(["--input", str(root), "--write-blend", str(tmp_path / "blend.txt")]) == 0
    argv = [*MODEL, *NULL, "--data-args-path", str(tmp_path / "blend.txt"), "--split", "90,5,5", "--eval-iters", "1"]
    env = _env()

    proc = waits.run([sys.executable, "-c", CHILD, "600:5000,800:800", *argv], timeout=QUICK_S, env=env)
    assert proc.returncode == 0, proc.stderr
    parts = proc.stdout.split("---\n")
    assert len(parts) == 3, proc.stdout
    raised, out, _ = parts
    assert "soft limit: 5000" in raised and "refused" not in raised, raised  # raised to the hard limit
    assert "refused: the data has 60 datasets" in out and "about 1,232, over" in out, out
    assert "hard limit of 800 (ulimit -Hn)" in out and "--no-mmap-bin-files (1,112)" in out, out

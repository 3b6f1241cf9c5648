"""Corpora in every format: the same documents give the same bytes; bad input is named, nothing written."""

from __future__ import annotations

import json
import lzma
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from megatron_ext.data import formats
from megatron_ext.data.tokenizers import GPTSentencePieceTokenizer
from tests import waits
from tests.conftest import REPO, _env
from tests.data.helpers import leftovers, preprocess, reference_dataset, same_files, shared_data, tool, write_as
from tests.waits import READY_S, RUN_S, STOP_S

pytestmark = pytest.mark.unit

FORMATS = ("jsonl.gz", "jsonl.zst", "parquet", "arrow", "hf")


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return shared_data(tmp_path_factory)


@pytest.fixture(scope="module")
def lines(data: dict[str, Path]) -> list[str]:
    """The corpus with a second key, so that two columns or keys are read."""
    out = []
    for n, line in enumerate(data["corpus"].read_text(encoding="utf-8").splitlines()):
        record = json.loads(line)
        out.append(json.dumps({"text": record["text"], "title": f"document {n}: {record['text'][:30]}"}))
    return out


def two_keys(inputs: Sequence[Path | str], prefix: Path, model: Path, *extra: str, check: bool = True):
    """Both keys, eod appended, two workers and small chunks (many chunks per file)."""
    flags = ("--json-keys", "text", "title", "--append-eod", "--workers", "2", "--chunk-mb", "0.05")
    return preprocess(inputs, prefix, model, *flags, *extra, check=check)


def test_every_format_gives_the_same_bytes(data: dict[str, Path], lines: list[str], tmp_path: Path) -> None:
    """One corpus as JSON Lines (plain, gzip, two zstd frames), Parquet (row groups of 64), Arrow and a saved
    Hugging Face dataset (several shards), each file alone and all mixed in one run: identical .bin/.idx,
    equal to Megatron-Core's own builder fed the documents."""
    tok = GPTSentencePieceTokenizer(data["model"])
    ref = reference_dataset(lines, tok, tmp_path / "ref", keys=("text", "title"), append_eod=True)
    for fmt in ("jsonl", *FORMATS):
        source = write_as(lines, tmp_path / f"corpus.{fmt}", fmt)
        two_keys([source], tmp_path / fmt.replace(".", "-"), data["model"])
        for key in ("text", "title"):
            assert same_files(ref[key], tmp_path / f"{fmt.replace('.', '-')}_{key}_document"), (fmt, key)
    # A quarter in each of four formats, in one run (the order of --input is kept) ...
    quarter = -(-len(lines) // 4)
    parts = [
        write_as(lines[i * quarter : (i + 1) * quarter], tmp_path / f"part{i}.{fmt}", fmt)
        for i, fmt in enumerate(("jsonl.zst", "parquet", "hf", "jsonl.gz"))
    ]
    two_keys(parts, tmp_path / "mixed", data["model"])
    # ... and a zstd file whose name says nothing, read with --input-format.
    (tmp_path / "corpus.jsonl.zst").rename(tmp_path / "corpus-part-000")
    two_keys([tmp_path / "corpus-part-000"], tmp_path / "named", data["model"], "--input-format", "jsonl.zst")
    for prefix in ("mixed", "named"):
        for key in ("text", "title"):
            assert same_files(ref[key], tmp_path / f"{prefix}_{key}_document"), (prefix, key)


def test_output_per_file(data: dict[str, Path], lines: list[str], tmp_path: Path) -> None:
    """One dataset per input, named by its path below the common directory; each equals that file alone."""
    tok = GPTSentencePieceTokenizer(data["model"])
    third = len(lines) // 3
    pieces = {"a/x": lines[:third], "b/x": lines[third : 2 * third], "b/y": lines[2 * third :]}
    for (name, part), fmt in zip(pieces.items(), ("jsonl.zst", "parquet", "jsonl"), strict=True):
        (tmp_path / "in" / name).parent.mkdir(parents=True, exist_ok=True)
        write_as(part, tmp_path / "in" / f"{name}.{fmt}", fmt)
    out = tmp_path / "out"
    out.mkdir()
    two_keys([tmp_path / "in/*/*"], out / "shard", data["model"], "--output-per-file")
    for name, part in pieces.items():
        ref = reference_dataset(part, tok, tmp_path / f"ref-{name.replace('/', '-')}", append_eod=True)
        assert same_files(ref["text"], out / f"shard_{name.replace('/', '_')}_text_document"), name
    assert len(list(out.glob("*.bin"))) == 6 and leftovers(out) == []
    report = json.loads((out / "shard_preprocess_report.json").read_text())
    assert report["outputs"]["b_y:title"] == str(out / "shard_b_y_title_document")
    assert report["documents"] == len(lines)

    # An input with no token is refused in this mode (its datasets would be empty), unless allowed.
    (tmp_path / "in/b/z.jsonl").write_text(json.dumps({"text": "", "title": ""}) + "\n")
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = two_keys([tmp_path / "in/*/*"], empty / "shard", data["model"], "--output-per-file", check=False)
    assert proc.returncode == 1 and f"{tmp_path / 'in/b/z.jsonl'} has no document with any token" in proc.stderr
    assert list(empty.iterdir()) == []
    two_keys([tmp_path / "in/*/*"], empty / "shard", data["model"], "--output-per-file", "--allow-empty-output")
    assert (empty / "shard_b_z_text_document.idx").is_file()

    # Two inputs that would write one name: refused before anything runs.
    (tmp_path / "in/a_x.jsonl").write_text(lines[0] + "\n")
    proc = two_keys(
        [tmp_path / "in/a/x.jsonl.zst", tmp_path / "in/a_x.jsonl"],
        empty / "clash",
        data["model"],
        "--output-per-file",
        check=False,
    )
    assert proc.returncode == 1 and "would both write the datasets named 'a_x'" in proc.stderr, proc.stderr


def _bad_inputs(lines: list[str], d: Path) -> dict[str, tuple[list[Path], str, tuple[str, ...]]]:
    """case → (inputs, expected message, extra flags), each written into ``d``."""
    import pyarrow as pa
    import pyarrow.feather
    import pyarrow.parquet as pq
    import zstandard

    good = lines[:40]
    bad_json = [*good[:25], '{"text": "unterminated', *good[25:]]
    nulls = pa.table({"text": [json.loads(x)["text"] for x in good[:25]] + [None] + ["after"], "title": ["t"] * 27})
    whole = zstandard.ZstdCompressor().compress("".join(x + "\n" for x in good).encode())
    cases: dict[str, tuple[list[Path], str, tuple[str, ...]]] = {}

    def case(name: str, path: Path, message: str, *extra: str) -> None:
        cases[name] = ([path], message.format(path=path), extra)

    (d / "truncated.jsonl.zst").write_bytes(whole[: len(whole) // 2])
    case("zst-truncated", d / "truncated.jsonl.zst", "{path}: the Zstandard stream is truncated")
    (d / "damaged.jsonl.zst").write_bytes(whole[:20] + bytes(64) + whole[84:])
    case("zst-damaged", d / "damaged.jsonl.zst", "{path}: the Zstandard stream is damaged")
    write_as(bad_json, d / "badline.jsonl.zst", "jsonl.zst")
    case("zst-bad-line", d / "badline.jsonl.zst", "{path}:26: not JSON")
    pq.write_table(pa.table({"body": ["x"], "id": ["1"]}), d / "nocolumn.parquet")
    case("parquet-no-column", d / "nocolumn.parquet", "{path}: no column 'text' (it has 'body', 'id'); see --json-keys")
    pq.write_table(pa.table({"text": [1, 2]}), d / "ints.parquet")
    case("parquet-not-strings", d / "ints.parquet", "{path}: column 'text' holds int64, not strings")
    pq.write_table(nulls, d / "null.parquet", row_group_size=10)
    case("parquet-null", d / "null.parquet", "{path}: row 25: column 'text' is null, not a string")
    pq.write_table(nulls, d / "cut.parquet")
    (d / "cut.parquet").write_bytes((d / "cut.parquet").read_bytes()[:-40])
    case("parquet-truncated", d / "cut.parquet", "{path}: not a readable Parquet file, damaged or truncated")
    pyarrow.feather.write_feather(nulls, d / "null.arrow")
    case("arrow-null", d / "null.arrow", "{path}: row 25: column 'text' is null")
    import datasets

    datasets.disable_progress_bars()
    split = datasets.Dataset.from_dict({"text": ["a"]})
    datasets.DatasetDict(train=split, test=split).save_to_disk(str(d / "dict"))
    case("hf-dataset-dict", d / "dict", "{path}: a DatasetDict with splits train, test; pass one split's directory")
    (d / "plain-dir").mkdir()
    case("directory", d / "plain-dir", "{path}: a directory, not a file or a saved dataset")
    (d / "misnamed.jsonl").write_bytes(whole)
    case(
        "zst-named-jsonl",
        d / "misnamed.jsonl",
        "{path}: its name says jsonl, but it holds Zstandard data; rename it, or pass --input-format jsonl.zst",
    )
    (d / "corpus.jsonl.xz").write_bytes(lzma.compress(b"{}\n"))
    case("xz", d / "corpus.jsonl.xz", "{path}: holds xz data, which is not read here")
    write_as(good, d / "plain.jsonl", "jsonl")
    case(
        "flag-contradicts-content",
        d / "plain.jsonl",
        "{path}: --input-format parquet, but it does not start like one",
        "--input-format",
        "parquet",
    )
    return cases


BAD_CASES = (
    "zst-truncated",
    "zst-damaged",
    "zst-bad-line",
    "parquet-no-column",
    "parquet-not-strings",
    "parquet-null",
    "parquet-truncated",
    "arrow-null",
    "hf-dataset-dict",
    "directory",
    "zst-named-jsonl",
    "xz",
    "flag-contradicts-content",
)


@pytest.fixture(scope="module")
def bad_inputs(
    lines: list[str], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, tuple[list[Path], str, tuple[str, ...]]]:
    return _bad_inputs(lines, tmp_path_factory.mktemp("bad-inputs"))


def test_the_bad_input_cases_are_all_tested(bad_inputs: dict[str, tuple[list[Path], str, tuple[str, ...]]]) -> None:
    assert sorted(bad_inputs) == sorted(BAD_CASES)


@pytest.mark.parametrize("case", BAD_CASES)
def test_bad_input_is_named_and_nothing_is_written(
    data: dict[str, Path], bad_inputs: dict[str, tuple[list[Path], str, tuple[str, ...]]], tmp_path: Path, case: str
) -> None:
    inputs, message, extra = bad_inputs[case]
    proc = preprocess(
        inputs, tmp_path / "ds", data["model"], "--workers", "2", "--chunk-mb", "0.01", *extra, check=False
    )
    assert proc.returncode == 1 and proc.stderr.startswith("error: "), proc.stderr
    assert message in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_bad_rows_skipped_and_counted(data: dict[str, Path], lines: list[str], tmp_path: Path) -> None:
    """--skip-bad-lines on a table: a null is skipped, counted as non_string, and its row is reported."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    texts: list[str | None] = [json.loads(x)["text"] for x in lines[:30]]
    texts[7] = texts[20] = None
    pq.write_table(pa.table({"text": texts}), tmp_path / "nulls.parquet", row_group_size=8)
    flags = ("--append-eod", "--skip-bad-lines", "--chunk-mb", "0.01")
    preprocess(tmp_path / "nulls.parquet", tmp_path / "ds", data["model"], *flags)
    report = json.loads((tmp_path / "ds_preprocess_report.json").read_text())
    assert report["skipped"]["non_string"] == 2 and report["documents"] == 28
    assert [(e["row"], e["reason"]) for e in report["skipped_examples"]] == [(7, "non_string"), (20, "non_string")]
    kept = [json.dumps({"text": t}) for t in texts if t is not None]
    ref = reference_dataset(kept, GPTSentencePieceTokenizer(data["model"]), tmp_path / "ref", append_eod=True)
    assert same_files(ref["text"], tmp_path / "ds_text_document")


def test_interrupted_per_file_run_leaves_nothing(data: dict[str, Path], tmp_path: Path) -> None:
    """SIGTERM after some inputs' datasets are complete (staged under hidden names): all of them go."""
    from tests.data.test_preprocess import _start_slow_run

    proc, out = _start_slow_run(data, tmp_path, fmt="jsonl.zst", files=6, extra=("--output-per-file",))
    waits.wait_for(
        "an input's datasets staged under a hidden name (or the run's end)",
        lambda: proc.poll() is not None or any(p.name.startswith(".") and ".bin" in p.name for p in out.iterdir()),
        timeout=READY_S,
        every=0.05,
        state=lambda: (
            f"{out} holds {sorted(p.name for p in out.iterdir())}; preprocess_data.py exit code {proc.poll()}"
        ),
    )
    assert proc.poll() is None, "the run finished before it could be interrupted"
    staged = leftovers(out)
    assert staged, "no input's datasets were staged before the deadline"
    proc.send_signal(signal.SIGTERM)
    waits.wait_exit(proc, "preprocess_data.py to stop on SIGTERM", timeout=STOP_S)
    assert proc.returncode == 143
    assert list(out.iterdir()) == [], f"left behind: {leftovers(out)} (staged before: {staged})"


def _peak_rss_mb(*args: str) -> tuple[float, float]:
    """Peak resident memory (MB) of preprocess_data.py's parent process and of its largest worker."""
    code = (
        "import resource, sys, runpy; sys.argv = ['preprocess_data.py', *sys.argv[1:]]\n"
        "from megatron_ext.cli.preprocess_data import main\n"
        "code = main()\n"
        "r = resource.getrusage\n"
        "print(r(resource.RUSAGE_SELF).ru_maxrss / 1024, r(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)\n"
        "sys.exit(code)\n"
    )
    env = _env()
    proc = waits.run([sys.executable, "-c", code, *args], timeout=RUN_S, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    parent, worker = proc.stdout.split()
    return float(parent), float(worker)


def test_memory_does_not_grow_with_files_or_row_groups(data: dict[str, Path], lines: list[str], tmp_path: Path) -> None:
    """The same 5 MB of text as one Parquet file of one row group, and as 300 files of 10 row groups each:
    peak memory (parent and workers) is no larger for the many files and row groups."""
    many = lines * 10
    write_as(many, tmp_path / "one.parquet", "parquet", rows_per_group=len(many))
    (tmp_path / "many").mkdir()
    per_file = -(-len(many) // 300)
    for i in range(300):
        part = many[i * per_file : (i + 1) * per_file]
        if part:
            write_as(part, tmp_path / "many" / f"{i:03d}.parquet", "parquet", rows_per_group=max(len(part) // 10, 1))
    common = ("--tokenizer-type", "GPTSentencePieceTokenizer", "--tokenizer-model", str(data["model"]), "--quiet")
    common = (*common, "--workers", "2", "--json-keys", "text", "title")
    one = _peak_rss_mb("--input", str(tmp_path / "one.parquet"), "--output-prefix", str(tmp_path / "one"), *common)
    files = _peak_rss_mb("--input", str(tmp_path / "many/*.parquet"), "--output-prefix", str(tmp_path / "m"), *common)
    assert same_files(tmp_path / "one_text_document", tmp_path / "m_text_document")
    assert files[0] <= one[0] + 10 and files[1] <= one[1] + 10, (one, files)


def test_train_tokenizer_reads_every_format_alike(data: dict[str, Path], lines: list[str], tmp_path: Path) -> None:
    """The same documents as JSON Lines, zstd or Parquet train the same SentencePiece vocabulary, byte for byte
    (the .model file also records the temporary path it was trained under, so it is not compared)."""
    models = []
    for fmt in ("jsonl", "jsonl.zst", "parquet"):
        source = write_as(lines[:150], tmp_path / f"c.{fmt}", fmt)
        prefix = tmp_path / fmt.replace(".", "-")
        tool("train_tokenizer", "--input", str(source), "--model-prefix", str(prefix), "--vocab-size", "300")
        models.append(Path(f"{prefix}.vocab").read_bytes())
    assert models[0] == models[1] == models[2]


@settings(max_examples=60, deadline=None)
@given(
    lines=st.lists(st.binary(max_size=300).map(lambda b: b.replace(b"\n", b"")), max_size=40),
    cuts=st.lists(st.integers(min_value=1, max_value=200), min_size=1, max_size=10),
    chunk_bytes=st.integers(min_value=1, max_value=500),
    last_newline=st.booleans(),
)
def test_decompressed_blocks_become_chunks_of_whole_lines(
    lines: list[bytes], cuts: list[int], chunk_bytes: int, last_newline: bool
) -> None:
    """However the decompressed text arrives, chunks hold whole lines, in order, nothing lost, each about
    ``chunk_bytes`` (at most that plus one line)."""
    text = b"\n".join(lines) + (b"\n" if last_newline and lines else b"")
    blocks, start, i = [], 0, 0
    while start < len(text):
        end = start + cuts[i % len(cuts)]
        blocks.append((text[start:end], min(end, len(text))))
        start, i = end, i + 1
    chunks = list(formats._line_chunks(iter(blocks), 0, chunk_bytes))
    assert b"".join(c.data or b"" for c in chunks) == text
    longest = max((len(line) + 1 for line in lines), default=0)
    for c in chunks[:-1]:
        assert c.data is not None and c.data.endswith(b"\n") and len(c.data) < chunk_bytes + longest
        assert c.end == len(c.data) and c.start == 0

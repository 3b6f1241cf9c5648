"""tools/preprocess_data.py, train_tokenizer.py, merge_datasets.py, inspect_dataset.py on real text."""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from megatron_ext.data.tokenizers import GPTSentencePieceTokenizer, NullTokenizer, SentencePieceTokenizer
from tests import waits
from tests.conftest import REPO, _env, script_module
from tests.data.helpers import leftovers, preprocess, reference_dataset, same_files, shared_data, tool, write_as
from tests.waits import READY_S, STOP_S

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return shared_data(tmp_path_factory)


def test_round_trip_and_megatron_reader(data: dict[str, Path], tmp_path: Path) -> None:
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    preprocess(data["corpus"], tmp_path / "rt", data["model"], "--append-eod", "--workers", "2")
    texts = [json.loads(line)["text"] for line in data["corpus"].read_text(encoding="utf-8").splitlines()]
    tok = GPTSentencePieceTokenizer(data["model"])
    ds = IndexedDataset(str(tmp_path / "rt_text_document"))
    assert len(ds) == len(texts) == ds.document_indices.size - 1
    for i in range(len(texts)):
        ids = ds[i].tolist()
        assert ids[-1] == tok.eod
        assert tok.detokenize(ids[:-1]) == texts[i]
    report = json.loads((tmp_path / "rt_preprocess_report.json").read_text())
    assert report["documents"] == len(texts) and not any(report["skipped"].values())


@pytest.mark.parametrize("tokenizer_type", ["GPTSentencePieceTokenizer", "SentencePieceTokenizer"])
def test_equals_megatron_reference_writer(data: dict[str, Path], tmp_path: Path, tokenizer_type: str) -> None:
    """Same bytes as one tokenize call per document into Megatron-Core's IndexedDatasetBuilder,
    with two JSON keys, empty documents and special-token strings in the text."""
    lines = []
    for n, line in enumerate(data["corpus"].read_text(encoding="utf-8").splitlines()[:200]):
        text = json.loads(line)["text"]
        title = "" if n % 7 == 0 else f"<EOD>title {n} </s>{text[:40]}"
        lines.append(json.dumps({"text": text if n % 11 else "", "title": title}))
    inp = tmp_path / "in.jsonl"
    inp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    tok = (SentencePieceTokenizer if tokenizer_type == "SentencePieceTokenizer" else GPTSentencePieceTokenizer)(
        data["model"]
    )
    ref = reference_dataset(lines, tok, tmp_path / "ref", keys=("text", "title"), append_eod=True)
    preprocess(
        inp,
        tmp_path / "ours",
        data["model"],
        "--append-eod",
        "--json-keys",
        "text",
        "title",
        "--workers",
        "2",
        "--chunk-mb",
        "0.05",
        tokenizer_type=tokenizer_type,
    )
    for key in ("text", "title"):
        assert same_files(ref[key], tmp_path / f"ours_{key}_document"), key
    report = json.loads((tmp_path / "ours_preprocess_report.json").read_text())
    assert report["empty_documents"] == {"text": 19, "title": 29}


def test_null_tokenizer_without_eod_equals_reference(tmp_path: Path) -> None:
    lines = [json.dumps({"text": " ".join(str((7 * i + j) % 500) for j in range(i % 13 + 1))}) for i in range(300)]
    inp = tmp_path / "ids.jsonl"
    inp.write_text("\n".join(lines) + "\n")
    ref = reference_dataset(lines, NullTokenizer(500), tmp_path / "ref", append_eod=False)
    tool(
        "preprocess_data",
        "--input",
        str(inp),
        "--output-prefix",
        str(tmp_path / "ours"),
        "--tokenizer-type",
        "NullTokenizer",
        "--vocab-size",
        "500",
        "--workers",
        "1",
        "--quiet",
    )
    assert same_files(ref["text"], tmp_path / "ours_text_document")


def test_workers_partitions_chunks_gzip_and_globs_give_the_same_bytes(data: dict[str, Path], tmp_path: Path) -> None:
    lines = data["corpus"].read_text(encoding="utf-8").splitlines(keepends=True)
    half = len(lines) // 2
    (tmp_path / "a.jsonl").write_text("".join(lines[:half]), encoding="utf-8")
    with gzip.open(tmp_path / "b.jsonl.gz", "wt", encoding="utf-8") as f:
        f.write("".join(lines[half:]))
    preprocess(data["corpus"], tmp_path / "one", data["model"], "--append-eod", "--workers", "1")
    preprocess(
        data["corpus"],
        tmp_path / "many",
        data["model"],
        "--append-eod",
        "--workers",
        "2",
        "--partitions",
        "2",
        "--chunk-mb",
        "0.01",
    )
    preprocess(
        str(tmp_path / "[ab].jsonl*"),
        tmp_path / "glob",
        data["model"],
        "--append-eod",
        "--workers",
        "2",
        "--chunk-mb",
        "0.03",
    )
    # Megatron-LM's rule that --workers be a multiple of --partitions does not apply: the value has no effect.
    preprocess(data["corpus"], tmp_path / "odd", data["model"], "--append-eod", "--workers", "3", "--partitions", "2")
    for other in ("many", "glob", "odd"):
        assert same_files(tmp_path / "one_text_document", tmp_path / f"{other}_text_document"), other


def test_input_glob_without_files_is_an_error(data: dict[str, Path], tmp_path: Path) -> None:
    (tmp_path / "shard0.jsonl").mkdir()  # a directory that looks like an input
    out = tmp_path / "out"
    out.mkdir()
    dirs = preprocess(str(tmp_path / "shard*.jsonl"), out / "ds", data["model"], check=False)
    assert dirs.returncode == 1 and "matches only directories" in dirs.stderr and "shard0.jsonl" in dirs.stderr
    none = preprocess(str(tmp_path / "nothing*.jsonl"), out / "ds", data["model"], check=False)
    assert none.returncode == 1 and "matches nothing" in none.stderr
    assert list(out.iterdir()) == []


@pytest.mark.parametrize(
    "flag",
    [
        ["--vocab-extra-ids", "0"],
        ["--legacy-tokenizer"],
        ["--trust-remote-code"],
        ["--tokenizer-metadata", "m.json"],
        ["--padded-vocab-size", "1024"],
        ["--find-optimal-num-workers"],
        ["--performance-dir", "perf"],
        ["--tokenizer-type", "BertWordPieceCase"],
        ["--split-sentences"],
    ],
    ids=lambda f: f[-1] if f[0] == "--tokenizer-type" else f[0],
)
def test_unsupported_megatron_lm_flags_are_refused(tmp_path: Path, flag: list[str]) -> None:
    """The Megatron-LM flags listed in docs/data.md as not supported stop the tool (exit code 2)."""
    module = script_module("tools/preprocess_data.py", "preprocess_data_tool")
    args = ["--input", "x.jsonl", "--output-prefix", str(tmp_path / "x"), "--tokenizer-type", "NullTokenizer"]
    try:
        code = module.main([*args, "--vocab-size", "10", *flag])
    except SystemExit as exc:  # argparse: unknown flag or choice
        code = exc.code
    assert code == 2
    assert not any(tmp_path.iterdir())


BAD_LINES = {
    "not_json": b'{"text": "unterminated\n',
    "missing_key": b'{"body": "no text key here"}\n',
    "non_string": b'{"text": ["pre", "split"]}\n',
    "invalid_utf8": b'{"text": "caf\xe9 au lait"}\n',
    "surrogate": b'{"text": "lone \\ud800 surrogate"}\n',
    "array": b'["a", "JSON", "array"]\n',
    "blank": b"   \n",
}
MESSAGES = {
    "not_json": "not JSON",
    "missing_key": "no key 'text'",
    "non_string": "holds a JSON list",
    "invalid_utf8": "invalid UTF-8 byte 0xe9",
    "surrogate": "lone surrogate",
    "array": "a JSON list, not an object",
    "blank": "blank line",
}


def _compressed(raw: bytes, fmt: str) -> bytes:
    if fmt == "jsonl.gz":
        return gzip.compress(raw)
    if fmt == "jsonl.zst":
        import zstandard

        return zstandard.ZstdCompressor().compress(raw)
    return raw


@pytest.mark.parametrize("fmt", ["jsonl", "jsonl.gz", "jsonl.zst"])
@pytest.mark.parametrize("case", sorted(BAD_LINES))
def test_bad_line_stops_with_file_line_and_reason(data: dict[str, Path], tmp_path: Path, case: str, fmt: str) -> None:
    good = data["corpus"].read_bytes().splitlines(keepends=True)[:40]
    inp = tmp_path / f"bad.{fmt}"
    inp.write_bytes(_compressed(b"".join(good[:25]) + BAD_LINES[case] + b"".join(good[25:]), fmt))
    out = tmp_path / "out"
    out.mkdir()
    proc = preprocess(inp, out / "ds", data["model"], "--workers", "2", "--chunk-mb", "0.01", check=False)
    assert proc.returncode == 1
    assert f"{inp}:26: " in proc.stderr and MESSAGES[case] in proc.stderr and "--skip-bad-lines" in proc.stderr
    assert list(out.iterdir()) == []  # nothing at the output paths, no temporaries


def test_skip_bad_lines_counts_and_keeps_the_rest(data: dict[str, Path], tmp_path: Path) -> None:
    good = data["corpus"].read_bytes().splitlines(keepends=True)[:60]
    mixed, kept = [], []
    for i, line in enumerate(good):
        mixed.append(line)
        kept.append(line.decode())
        if i % 8 == 3:
            mixed.append(list(BAD_LINES.values())[(i // 8) % len(BAD_LINES)])
    mixed.append(b'{"text": ""}\n')  # an empty document: skipped like Megatron does, not an error
    kept.append('{"text": ""}\n')
    inp = tmp_path / "mixed.jsonl"
    inp.write_bytes(b"".join(mixed))
    proc = preprocess(
        inp, tmp_path / "ds", data["model"], "--append-eod", "--skip-bad-lines", "--workers", "2", "--chunk-mb", "0.02"
    )
    assert proc.returncode == 0
    report = json.loads((tmp_path / "ds_preprocess_report.json").read_text())
    assert report["skipped"] == {
        "invalid_utf8": 2,
        "not_json": 4,
        "missing_key": 1,
        "non_string": 1,
        "tokenize_error": 0,
    }
    assert report["empty_documents"] == {"text": 1}
    assert report["skipped_examples"][0] == {
        "file": str(inp),
        "line": 5,
        "reason": "not_json",
        "detail": report["skipped_examples"][0]["detail"],
    }
    ref = reference_dataset(kept, GPTSentencePieceTokenizer(data["model"]), tmp_path / "ref", append_eod=True)
    assert same_files(ref["text"], tmp_path / "ds_text_document")


def _start_slow_run(
    data: dict[str, Path], tmp_path: Path, *, fmt: str = "jsonl", files: int = 1, extra: tuple[str, ...] = ()
) -> tuple[subprocess.Popen[str], Path]:
    """A run on 30 copies of the corpus (in ``files`` files of format ``fmt``), once it writes documents."""
    lines = data["corpus"].read_text(encoding="utf-8").splitlines()
    for i in range(files):
        write_as(lines * (30 // files), tmp_path / (f"big.{fmt}" if files == 1 else f"big-{i:02d}.{fmt}"), fmt)
    out = tmp_path / "out"
    out.mkdir()
    env = _env()
    proc = subprocess.Popen(
        [
            sys.executable,
            str(REPO / "tools" / "preprocess_data.py"),
            "--input",
            str(tmp_path / f"big*.{fmt}"),
            "--output-prefix",
            str(out / "ds"),
            "--tokenizer-type",
            "GPTSentencePieceTokenizer",
            "--tokenizer-model",
            str(data["model"]),
            "--workers",
            "2",
            "--log-interval",
            "1",
            "--chunk-mb",
            "0.1",
            *extra,
        ],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env=env,
        start_new_session=True,
    )
    assert proc.stderr is not None
    # A run that never prints progress would hold the loop below: past READY_S its session is killed, ending the pipe.
    silent = threading.Event()

    def _kill_silent_run() -> None:
        silent.set()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)

    watchdog = threading.Timer(READY_S, _kill_silent_run)
    watchdog.start()
    printed = []
    try:
        for line in proc.stderr:  # wait until documents are being written
            if "docs/s" in line:
                break
            printed.append(line)
    finally:
        watchdog.cancel()
    if silent.is_set():
        pytest.fail(
            f"preprocess_data.py wrote no documents ('docs/s') in {READY_S} s (killed):\n{waits.tail(''.join(printed))}"
        )
    time.sleep(0.3)
    assert proc.poll() is None, "the run finished before it could be interrupted; make the input bigger"
    return proc, out


@pytest.mark.parametrize(
    ("how", "code"),
    [("SIGINT", 130), ("SIGTERM", 143), ("SIGTERM-group", 143), ("SIGHUP-group", 129), ("SIGKILL", -9)],
)
def test_interrupted_run_leaves_nothing(data: dict[str, Path], tmp_path: Path, how: str, code: int) -> None:
    proc, out = _start_slow_run(data, tmp_path)
    sig = getattr(signal, how.split("-")[0])
    # Ctrl-C and a terminal hang-up reach the whole process group, as SLURM's scancel reaches every process
    if how == "SIGINT" or how.endswith("-group"):
        os.killpg(proc.pid, sig)
    else:
        proc.send_signal(sig)
    waits.wait_exit(proc, f"preprocess_data.py to stop on {how}", timeout=STOP_S)
    assert proc.stderr is not None
    assert proc.returncode == code, proc.stderr.read()[-3000:]  # 128 + the signal, as a shell reports it
    time.sleep(0.2)
    assert list(out.iterdir()) == [], f"left behind after {how}: {leftovers(out)}"
    # no orphaned workers keep running either
    deadline = time.time() + STOP_S
    while time.time() < deadline and _session_alive(proc.pid):
        time.sleep(0.1)
    assert not _session_alive(proc.pid), f"workers of the run still alive {STOP_S} s after it stopped on {how}"


def _workers(parent: int) -> list[int]:
    """The worker processes of a running tool: its children that run its own command line."""
    own = (Path("/proc") / str(parent) / "cmdline").read_bytes()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                if ppid == parent and (entry / "cmdline").read_bytes() == own:
                    found.append(int(entry.name))
            except (OSError, ValueError, IndexError):
                continue
    return sorted(found)


@pytest.mark.parametrize("fmt", ["jsonl", "jsonl.gz", "parquet"])
def test_worker_killed_by_the_system_is_a_prompt_error(data: dict[str, Path], tmp_path: Path, fmt: str) -> None:
    """A worker that dies on its own (the OOM killer's SIGKILL) stops the run at once with an error that
    names it, its signal and the file it was encoding (or that it was idle); the other workers are stopped and
    nothing is written."""
    proc, out = _start_slow_run(data, tmp_path, fmt=fmt)
    workers = _workers(proc.pid)
    assert len(workers) == 2, workers
    # A worker in the middle of a chunk: with gzip the parent decompresses, and a worker can be idle
    # waiting for it (the error then rightly says "while idle").
    victim = _running(workers)
    os.kill(victim, signal.SIGKILL)
    try:
        _, err = proc.communicate(timeout=STOP_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.communicate(timeout=STOP_S)
        pytest.fail(f"preprocess_data.py hung after one of its workers was killed (still running after {STOP_S} s)")
    assert proc.returncode == 1, err
    assert f"worker pid {victim} died with signal 9 (SIGKILL, likely out of memory" in err, err
    # The worker seen on a CPU may have handed its chunk back just before the kill (a busy machine is slow to give
    # it the next): the error then rightly says "while idle", as with gzip above.
    assert f"while encoding {tmp_path / f'big.{fmt}'}" in err or ") while idle." in err, err
    assert "Nothing was written" in err
    assert list(out.iterdir()) == [], f"left behind: {leftovers(out)}"
    deadline = time.time() + STOP_S
    while time.time() < deadline and _session_alive(proc.pid):
        time.sleep(0.1)
    assert not _session_alive(proc.pid), f"the other worker was left running ({STOP_S} s after the run stopped)"


def _running(pids: list[int], timeout: float = READY_S) -> int:
    """One of ``pids`` seen on a CPU (process state R), polled for up to ``timeout`` seconds."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        for pid in pids:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "R":
                return pid
        time.sleep(0.005)
    raise AssertionError(f"no worker of {pids} was seen running within {timeout} s")


def _session_alive(sid: int) -> bool:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == sid and fields[0] != "Z":  # session id, state
                return True
    return False


def test_train_tokenizer_writes_model_atomically(data: dict[str, Path], tmp_path: Path) -> None:
    proc = tool(
        "train_tokenizer",
        "--input",
        str(data["corpus"]),
        "--model-prefix",
        str(tmp_path / "uni"),
        "--model-type",
        "unigram",
        "--vocab-size",
        "500",
        "--user-defined-symbols",
        "<sep>",
        "<eos2>",
    )
    assert "wrote" in proc.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["uni.model", "uni.vocab"]
    tok = GPTSentencePieceTokenizer(tmp_path / "uni.model")
    assert tok.vocab_size == 500
    sep = tok.sp.piece_to_id("<sep>")
    assert sep > 2 and tok.tokenize("a<sep>b").count(sep) == 1
    bad = tool(
        "train_tokenizer",
        "--input",
        str(tmp_path / "missing.jsonl"),
        "--model-prefix",
        str(tmp_path / "x"),
        check=False,
    )
    assert bad.returncode == 1 and "no such file" in bad.stderr


def test_merge_and_inspect_tools(data: dict[str, Path], tmp_path: Path) -> None:
    lines = data["corpus"].read_text(encoding="utf-8").splitlines(keepends=True)
    (tmp_path / "a.jsonl").write_text("".join(lines[:100]), encoding="utf-8")
    (tmp_path / "b.jsonl").write_text("".join(lines[100:150]), encoding="utf-8")
    preprocess(tmp_path / "a.jsonl", tmp_path / "a", data["model"], "--append-eod")
    preprocess(tmp_path / "b.jsonl", tmp_path / "b", data["model"], "--append-eod")
    preprocess(tmp_path / "[ab].jsonl", tmp_path / "ab", data["model"], "--append-eod")
    tool(
        "merge_datasets",
        "--input",
        str(tmp_path / "a_text_document"),
        str(tmp_path / "b_text_document"),
        "--output-prefix",
        str(tmp_path / "merged"),
    )
    assert same_files(tmp_path / "merged", tmp_path / "ab_text_document")

    info = tool("inspect_dataset", str(tmp_path / "merged"), "--json")
    stats = json.loads(info.stdout)
    assert stats["documents"] == stats["sequences"] == 150 and stats["dtype"] == "uint16"
    assert sum(b["sequences"] for b in stats["histogram"]) == 150
    shown = tool(
        "inspect_dataset",
        str(tmp_path / "merged"),
        "--verify",
        "--show",
        "1",
        "--max-chars",
        "100000",
        "--tokenizer-type",
        "GPTSentencePieceTokenizer",
        "--tokenizer-model",
        str(data["model"]),
    )
    assert "verify: OK" in shown.stdout and json.loads(lines[0])["text"] in shown.stdout

    with open(tmp_path / "merged.bin", "r+b") as f:
        f.truncate(f.seek(0, 2) - 2)
    broken = tool("inspect_dataset", str(tmp_path / "merged"), "--verify", check=False)
    assert broken.returncode == 1 and "truncated" in broken.stderr
    wrong_tokenizer = tool(
        "inspect_dataset",
        str(tmp_path / "a_text_document"),
        "--verify",
        "--tokenizer-type",
        "NullTokenizer",
        "--vocab-size",
        "10",
        check=False,
    )
    assert wrong_tokenizer.returncode == 1 and "another tokenizer" in wrong_tokenizer.stderr


def _null(inp: Path | str, prefix: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """Preprocess with the null tokenizer (ids are the text's numbers): no model file needed."""
    return tool(
        "preprocess_data", "--input", str(inp), "--output-prefix", str(prefix), "--tokenizer-type", "NullTokenizer",
        "--vocab-size", "1000", "--quiet", *extra, check=False,
    )  # fmt: skip


def test_a_corpus_without_tokens_is_refused_unless_allowed(tmp_path: Path) -> None:
    empty, bad = tmp_path / "empty.jsonl", tmp_path / "bad.jsonl"
    empty.write_bytes(b"")
    bad.write_text('not json\n{"title": "no text key"}\n')
    for inp, extra, why in ((empty, (), "(0 lines)"), (bad, ("--skip-bad-lines",), "2 bad lines skipped")):
        proc = _null(inp, tmp_path / "out", *extra)
        assert proc.returncode == 1, proc.stderr
        assert proc.stderr.startswith("error: no document with any token") and why in proc.stderr
        assert "--allow-empty-output" in proc.stderr and leftovers(tmp_path) == []
    assert _null(empty, tmp_path / "out", "--allow-empty-output").returncode == 0
    assert (tmp_path / "out_text_document.idx").exists()


def test_a_truncated_gzip_file_stops_with_its_name(tmp_path: Path) -> None:
    whole = gzip.compress(b"".join(json.dumps({"text": "1 2 3 " * 50}).encode() + b"\n" for _ in range(2000)))
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(whole[: len(whole) // 2])
    proc = _null(cut, tmp_path / "out")
    assert proc.returncode == 1 and proc.stderr.startswith("error:") and "cut.jsonl.gz" in proc.stderr, proc.stderr
    assert leftovers(tmp_path) == []


def test_a_symlink_loop_in_the_input_glob_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "loop.jsonl").symlink_to(tmp_path / "loop.jsonl")
    (tmp_path / "ok.jsonl").write_text(json.dumps({"text": "1 2 3"}) + "\n")
    proc = _null(tmp_path / "*.jsonl", tmp_path / "out")
    assert proc.returncode == 1 and proc.stderr.startswith("error:") and "loop.jsonl" in proc.stderr, proc.stderr
    assert leftovers(tmp_path) == []


def test_a_document_many_sequences_long_is_kept_whole(tmp_path: Path) -> None:
    """Documents are not cut at any sequence length: the training sampler spans them."""
    inp = tmp_path / "long.jsonl"
    inp.write_text(json.dumps({"text": " ".join(str(i % 900) for i in range(200_000))}) + "\n")
    assert _null(inp, tmp_path / "out", "--append-eod").returncode == 0
    proc = tool("inspect_dataset", str(tmp_path / "out_text_document"), "--json")
    assert json.loads(proc.stdout)["tokens"] == 200_001


def test_llama2_tokenizer_writes_megatron_lms_bytes_with_a_bos_per_document(
    data: dict[str, Path], tmp_path: Path
) -> None:
    """One ``[bos] + encode(text)`` per document, then eod (Megatron-LM's ``_Llama2Tokenizer``), with two workers
    and a long document tokenized in pieces."""
    from megatron_ext.data.tokenizers import build_tokenizer

    lines = data["corpus"].read_text(encoding="utf-8").splitlines()[:200]
    long_text = " ".join(json.loads(line)["text"] for line in lines)
    lines.append(json.dumps({"text": long_text * 3}))
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    llama = build_tokenizer("Llama2Tokenizer", tokenizer_model=str(data["model"]))
    ref = reference_dataset(lines, llama, tmp_path / "ref", append_eod=True)
    preprocess(tmp_path / "in.jsonl", tmp_path / "ours", data["model"], "--append-eod", "--workers", "2",
               tokenizer_type="Llama2Tokenizer")  # fmt: skip
    assert same_files(ref["text"], tmp_path / "ours_text_document")

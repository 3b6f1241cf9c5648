"""Shared by the data-pipeline tests: a small real corpus, a tiny tokenizer, a reference writer."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from tests import waits
from tests.conftest import REPO, _env, run_forked
from tests.once import once_per_run
from tests.waits import RUN_S

TOOLS = REPO / "tools"


def tool(
    name: str, *args: str, timeout: float = RUN_S, check: bool = True, forked: bool = False
) -> subprocess.CompletedProcess[str]:
    """Run tools/NAME.py as a process; raise with its output when ``check`` and it fails. ``forked``: a process
    forked from the rank server (``run_forked``), for a tool that imports torch and Megatron-Core anyway."""
    if forked:
        proc = run_forked(TOOLS / f"{name}.py", list(args), timeout=timeout)
    else:
        proc = waits.run([sys.executable, str(TOOLS / f"{name}.py"), *args], timeout=timeout, env=_env(), cwd=REPO)
    if check and proc.returncode != 0:
        raise AssertionError(f"{name} {' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def preprocess(
    inputs: Path | str | Sequence[Path | str],
    prefix: Path,
    model: Path,
    *extra: str,
    check: bool = True,
    tokenizer_type: str = "GPTSentencePieceTokenizer",
) -> subprocess.CompletedProcess[str]:
    """Run tools/preprocess_data.py quietly on ``inputs`` with a SentencePiece model."""
    paths = [inputs] if isinstance(inputs, str | Path) else list(inputs)
    return tool(
        "preprocess_data",
        "--input",
        *map(str, paths),
        "--output-prefix",
        str(prefix),
        "--tokenizer-type",
        tokenizer_type,
        "--tokenizer-model",
        str(model),
        "--quiet",
        *extra,
        check=check,
    )


def shared_data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A ~1 MB stdlib-docstring corpus and a 1,000-piece BPE model, built once per session."""
    root = once_per_run(tmp_path_factory, "indexed-data", _build_corpus_and_tokenizer)
    return {"root": root, "corpus": root / "corpus.jsonl", "model": root / "sp1k.model"}


def _build_corpus_and_tokenizer(root: Path) -> None:
    from megatron_ext.data.local_corpus import build_corpus

    corpus = root / "corpus.jsonl"
    build_corpus(corpus, target_mb=1.0, sources=("stdlib",))
    tool(
        "train_tokenizer",
        "--input",
        str(corpus),
        "--model-prefix",
        str(root / "sp1k"),
        "--vocab-size",
        "1000",
        "--byte-fallback",
        "--user-defined-symbols",
        "<special>",
    )


TIKTOKEN_MERGES = 200


def tiktoken_vocab(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A TikTokenizer vocabulary (Megatron-LM's JSON list of ranks) of 256 bytes + ``TIKTOKEN_MERGES`` merges
    learned from the shared corpus by tiktoken's reference trainer (v2 pattern), built once per session."""
    corpus = shared_data(tmp_path_factory)["corpus"]
    return (
        once_per_run(tmp_path_factory, "tiktoken", lambda directory: _train_tiktoken(corpus, directory)) / "vocab.json"
    )


def _train_tiktoken(corpus: Path, directory: Path) -> None:
    import base64

    from tiktoken._educational import bpe_train

    from megatron_ext.data.tiktokenizer import PATTERNS

    lines = corpus.read_text(encoding="utf-8").splitlines()
    text = "\n".join(json.loads(line)["text"] for line in lines)[:40_000]
    ranks = bpe_train(text, 256 + TIKTOKEN_MERGES, PATTERNS["v2"])
    entries = [
        {"rank": rank, "token_bytes": base64.b64encode(token).decode(), "token_str": token.decode("utf-8", "replace")}
        for token, rank in sorted(ranks.items(), key=lambda item: item[1])
    ]
    (directory / "vocab.json").write_text(json.dumps(entries), encoding="utf-8")


def reference_dataset(
    lines: Sequence[str], tokenizer: object, prefix: Path, *, keys: Sequence[str] = ("text",), append_eod: bool
) -> dict[str, Path]:
    """What Megatron-LM's tool writes: one ``tokenize`` call per document into Megatron-Core's
    ``IndexedDatasetBuilder``, empty documents added as ``add_document([], [])``."""
    from megatron.core.datasets.indexed_dataset import DType, IndexedDatasetBuilder

    dtype = DType.optimal_dtype(tokenizer.vocab_size)  # type: ignore[attr-defined]
    builders = {k: IndexedDatasetBuilder(f"{prefix}_{k}_document.bin", dtype=dtype) for k in keys}
    for line in lines:
        data = json.loads(line)
        for key in keys:
            ids = list(tokenizer.tokenize(data[key]))  # type: ignore[attr-defined]
            lengths = [len(ids)] if ids else []
            if ids and append_eod:
                ids.append(tokenizer.eod)  # type: ignore[attr-defined]
                lengths[-1] += 1
            builders[key].add_document(ids, lengths)
    for key, builder in builders.items():
        builder.finalize(f"{prefix}_{key}_document.idx")
    return {k: Path(f"{prefix}_{k}_document") for k in keys}


def same_files(a: Path | str, b: Path | str) -> bool:
    """``.bin`` and ``.idx`` of two prefixes are byte-identical."""
    return all(Path(f"{a}.{ext}").read_bytes() == Path(f"{b}.{ext}").read_bytes() for ext in ("bin", "idx"))


def leftovers(directory: Path) -> list[str]:
    """Temporary or partial files a tool may have left in ``directory``."""
    return sorted(p.name for p in directory.iterdir() if p.name.startswith(".") or ".tmp" in p.name)


def write_as(lines: Sequence[str], path: Path, fmt: str, *, rows_per_group: int = 64) -> Path:
    """JSON Lines ``lines`` written as ``fmt``: ``jsonl``, ``jsonl.gz``, ``jsonl.zst`` (two frames),
    ``parquet`` (row groups of ``rows_per_group``), ``arrow`` (an IPC file) or ``hf`` (a directory
    written by ``datasets.Dataset.save_to_disk``, several shards). Table columns are the keys of
    the first record, every one a string column."""
    import gzip

    text = "".join(f"{line}\n" for line in lines).encode("utf-8")
    if fmt == "jsonl":
        path.write_bytes(text)
    elif fmt == "jsonl.gz":
        path.write_bytes(gzip.compress(text, compresslevel=1))
    elif fmt == "jsonl.zst":
        import zstandard

        half = text.rfind(b"\n", 0, len(text) // 2) + 1  # concatenated frames, as pzstd and zstd -T write
        path.write_bytes(b"".join(zstandard.ZstdCompressor(level=3).compress(t) for t in (text[:half], text[half:])))
    else:
        records = [json.loads(line) for line in lines]
        columns = {k: [r.get(k) for r in records] for k in (records[0] if records else {"text": ""})}
        if fmt == "hf":
            import datasets

            datasets.disable_progress_bars()
            datasets.Dataset.from_dict(columns).save_to_disk(str(path), max_shard_size=max(len(text) // 3, 1024))
            return path
        import pyarrow as pa
        import pyarrow.feather
        import pyarrow.parquet

        table = pa.table({k: pa.array(v, type=pa.string()) for k, v in columns.items()})
        if fmt == "parquet":
            pyarrow.parquet.write_table(table, path, row_group_size=rows_per_group)
        elif fmt == "arrow":
            pyarrow.feather.write_feather(table, path, chunksize=rows_per_group)
        else:
            raise ValueError(fmt)
    return path

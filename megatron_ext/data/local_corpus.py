"""A real-text English corpus built at run time from what every machine with Python has (the demo's, the benchmarks' and the tests').

Sources, in order, until the target size is reached:

``stdlib``
    docstrings of the Python standard library (parsed with ``ast``; nothing is
    imported or executed), one document per module;
``site-packages``
    docstrings of the installed packages (numpy, torch, ... when present);
``docs``
    plain-text files under ``/usr/share/doc`` (READMEs, change logs, ``.gz`` too).

Documents are de-duplicated and written as JSON Lines ``{"text": ..., "source": ...}``
in a deterministic order. Nothing of this text is stored in the repository.
"""

from __future__ import annotations

import ast
import gzip
import hashlib
import json
import os
import site
import sysconfig
from collections.abc import Iterator
from pathlib import Path

from megatron_ext.data.start_method import worker_context

SOURCES = ("stdlib", "site-packages", "docs")
_MIN_DOCSTRING = 40
_MAX_DOC_CHARS = 32_000
_DOC_SUFFIXES = {".txt", ".md", ".rst", ".text", ""}
_DOC_NAMES = ("readme", "changelog", "news", "changes", "history", "authors", "todo", "faq", "copyright")


def _stdlib_files() -> Iterator[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).parts
        if rel and rel[0] in ("site-packages", "dist-packages"):
            continue
        yield path


def _site_files() -> Iterator[Path]:
    roots = {Path(p) for p in site.getsitepackages()}
    roots |= {Path(sysconfig.get_paths()[k]) for k in ("purelib", "platlib")}
    seen: set[Path] = set()
    for root in sorted(roots):
        if not root.is_dir():
            continue
        for path in sorted(root.rglob("*.py")):
            real = path.resolve()
            if real not in seen:
                seen.add(real)
                yield path


def _doc_files() -> Iterator[Path]:
    root = Path("/usr/share/doc")
    if not root.is_dir():
        return
    for path in sorted(root.rglob("*")):
        if not path.is_file() or path.is_symlink():
            continue
        name = path.name.lower()
        stem = name[:-3] if name.endswith(".gz") else name
        suffix = Path(stem).suffix
        if suffix in _DOC_SUFFIXES and (suffix or stem.startswith(_DOC_NAMES)):
            yield path


def _split(text: str) -> list[str]:
    """Long texts in pieces of at most ~_MAX_DOC_CHARS, cut at blank lines."""
    if len(text) <= _MAX_DOC_CHARS:
        return [text]
    pieces: list[str] = []
    current: list[str] = []
    size = 0
    for para in text.split("\n\n"):
        if size + len(para) > _MAX_DOC_CHARS and current:
            pieces.append("\n\n".join(current))
            current, size = [], 0
        current.append(para[:_MAX_DOC_CHARS])
        size += len(para) + 2
    if current:
        pieces.append("\n\n".join(current))
    return pieces


def docstrings_of(path: Path) -> str:
    """The module's, classes' and functions' docstrings of one Python file, blank-line separated."""
    try:
        tree = ast.parse(path.read_bytes())
    except (SyntaxError, ValueError, OSError, RecursionError, MemoryError):
        return ""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node)
            if doc and len(doc) >= _MIN_DOCSTRING:
                found.append(doc)
    return "\n\n".join(found)


def text_of_doc_file(path: Path) -> str:
    try:
        raw = gzip.decompress(path.read_bytes()) if path.name.endswith(".gz") else path.read_bytes()
        text = raw.decode("utf-8")
    except (OSError, UnicodeDecodeError, EOFError, gzip.BadGzipFile):
        return ""
    # Keep prose-like files only: mostly printable, not a binary or a table of numbers.
    letters = sum(c.isalpha() for c in text[:4000])
    return text.strip() if letters > 0.5 * min(len(text), 4000) else ""


def _extract(job: tuple[str, str]) -> tuple[str, str]:
    source, path = job
    text = text_of_doc_file(Path(path)) if source == "docs" else docstrings_of(Path(path))
    return source, text


def _jobs(sources: tuple[str, ...]) -> Iterator[tuple[str, str]]:
    listing = {"stdlib": _stdlib_files, "site-packages": _site_files, "docs": _doc_files}
    for source in sources:
        for path in listing[source]():
            yield source, str(path)


def build_corpus(
    output: str | os.PathLike[str],
    *,
    target_mb: float,
    sources: tuple[str, ...] = SOURCES,
    workers: int = 2,
) -> dict[str, int]:
    """Write about ``target_mb`` MB of JSON Lines to ``output`` (atomically); return counts per source."""
    for s in sources:
        if s not in SOURCES:
            raise ValueError(f"unknown corpus source {s!r}; choose from {', '.join(SOURCES)}")
    out = Path(output)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    target = int(target_mb * 1e6)
    written = 0
    counts: dict[str, int] = dict.fromkeys(sources, 0)
    seen: set[bytes] = set()
    ctx = worker_context()
    try:
        with open(tmp, "w", encoding="utf-8") as f, ctx.Pool(max(1, workers)) as pool:
            for source, text in pool.imap(_extract, _jobs(sources), chunksize=16):
                for piece in _split(text):
                    digest = hashlib.blake2b(piece.encode("utf-8", "surrogatepass"), digest_size=16).digest()
                    if not piece or digest in seen:
                        continue
                    seen.add(digest)
                    line = json.dumps({"text": piece, "source": source}, ensure_ascii=False) + "\n"
                    try:
                        encoded = line.encode("utf-8")
                    except UnicodeEncodeError:
                        continue  # a lone surrogate in a docstring
                    f.write(line)
                    written += len(encoded)
                    counts[source] += 1
                if written >= target:
                    pool.terminate()
                    break
        os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    counts["bytes"] = written
    return counts

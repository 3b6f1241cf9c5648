"""Property-based: the data tools and the recipes' resolver, on generated option values, end cleanly.

Every run of ``tools/preprocess_data.py``, ``merge_datasets.py`` and
``inspect_dataset.py`` (their ``main``, in process) with drawn values of their
numeric options either succeeds with complete outputs, or exits 2 with one
``error:`` line and leaves no output file. The recipes' variables go through
``megatron_ext.cli.recipe`` into a command line that ``pretrain_gpt.py``
parses, or a RecipeError / ConfigError naming the problem.
"""

from __future__ import annotations

import contextlib
import io
import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from megatron_ext.cli import inspect_dataset, merge_datasets, preprocess_data
from megatron_ext.cli.recipe import RecipeError, resolve
from megatron_ext.config.arguments import ConfigError
from megatron_ext.config.exit_codes import ExitCode
from megatron_ext.config.training_config import parse_args
from megatron_ext.parallel.layout import LayoutError

pytestmark = pytest.mark.unit

NUMBERS = st.sampled_from(["-1", "0", "0.5", "1", "2", "3", "1e9", "x"])
SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _run(main: object, argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(argv)  # type: ignore[operator]
        except SystemExit as exc:
            code = int(exc.code or 0)
    return code, err.getvalue()


def _clean_error(code: int, err: str) -> None:
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == ExitCode.INVALID and lines and lines[0].startswith("error:") and len(lines) == 1, err


@SETTINGS
@given(
    workers=st.sampled_from(["1", "2", "0", "-1", "x"]),
    chunk=st.sampled_from(["0.001", "1", "0", "-1", "inf"]),
    interval=st.sampled_from(["1", "100", "0", "1.5"]),
    vocab=st.sampled_from(["100", "1000", "10", "0", "x"]),
)
@example(workers="2", chunk="0.001", interval="1", vocab="100")
@example(workers="1", chunk="1", interval="100", vocab="10")
def test_preprocess_options(tmp_path: Path, workers: str, chunk: str, interval: str, vocab: str) -> None:
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"text": f"{i} {i + 1} 7"}) + "\n" for i in range(50)))
    # A fresh directory per example: hypothesis may draw the same values twice (or an @example's).
    out = Path(tempfile.mkdtemp(dir=tmp_path, prefix=f"out-{workers}-{chunk}-{interval}-{vocab}-"))
    code, err = _run(preprocess_data.main, [
        "--input", str(corpus), "--output-prefix", str(out / "d"), "--tokenizer-type", "NullTokenizer",
        "--vocab-size", vocab, "--workers", workers, "--chunk-mb", chunk, "--log-interval", interval, "--quiet",
    ])  # fmt: skip
    if code == ExitCode.OK:
        assert (out / "d_text_document.idx").exists() and (out / "d_text_document.bin").stat().st_size > 0
        assert inspect_dataset.main([str(out / "d_text_document"), "--verify", "--json"]) == ExitCode.OK
    elif code == ExitCode.ERROR:  # a valid option the data cannot meet: ids beyond a small --vocab-size
        assert err.startswith("error:") and not any(out.iterdir()), err
    else:
        _clean_error(code, err)
        assert not any(out.iterdir())


@SETTINGS
@given(show=NUMBERS, chars=NUMBERS, vocab=NUMBERS)
@example(show="2", chars="10", vocab="100")
def test_inspect_and_merge_options(tmp_path: Path, show: str, chars: str, vocab: str) -> None:
    prefix = tmp_path / "d_text_document"
    if not prefix.with_suffix(".idx").exists():
        corpus = tmp_path / "c.jsonl"
        corpus.write_text("".join(json.dumps({"text": f"{i} 3"}) + "\n" for i in range(20)))
        args = ["--input", str(corpus), "--output-prefix", str(tmp_path / "d"), "--tokenizer-type", "NullTokenizer"]
        assert _run(preprocess_data.main, [*args, "--vocab-size", "100", "--quiet"])[0] == ExitCode.OK
    code, err = _run(inspect_dataset.main, [str(prefix), "--show", show, "--max-chars", chars,
                                            "--tokenizer-type", "NullTokenizer", "--vocab-size", vocab])  # fmt: skip
    if code not in (ExitCode.OK, ExitCode.ERROR):
        _clean_error(code, err)
    merged = tmp_path / f"m-{show}"
    if not merged.with_suffix(".idx").exists():
        assert _run(merge_datasets.main, ["--input", str(prefix), str(prefix), "--output-prefix", str(merged)])[0] == 0


VARIABLES = {
    "TP": st.sampled_from(["", "0", "1", "2", "two"]),
    "PP": st.sampled_from(["", "1", "2", "3"]),
    "VP_LAYERS": st.sampled_from(["", "0", "1", "2", "-1"]),
    "MICRO_BATCH": st.sampled_from(["", "0", "1", "2"]),
    "GLOBAL_BATCH": st.sampled_from(["", "3", "8", "16"]),
    "PRECISION": st.sampled_from(["", "bf16", "fp32", "bf32"]),
    "RECOMPUTE": st.sampled_from(["", "none", "full", "some"]),
    "SEQUENCE_PARALLEL": st.sampled_from(["", "0", "1", "yes"]),
    "TRAIN_ITERS": st.sampled_from(["", "0", "10", "-5"]),
}


@settings(max_examples=60, deadline=None)
@given(st.fixed_dictionaries({}, optional=VARIABLES))
def test_recipe_variables_resolve_or_are_named(env: dict[str, str]) -> None:
    try:
        pretrain, _ = resolve(["--model", "gpt-tiny"], {**env, "DEVICE": "cpu"})
    except RecipeError as exc:
        assert str(exc)
        return
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            cfg = parse_args([*pretrain, "--world-size", "8"])
    except (ConfigError, LayoutError) as exc:
        assert str(exc)
        return
    except SystemExit as exc:
        _clean_error(int(exc.code or 0), err.getvalue())
        return
    assert cfg.layout.world_size == 8 and cfg.layout.num_microbatches >= 1

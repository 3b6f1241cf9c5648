"""The checkpoint directory format and its invariant: what is complete, partial or unverified, what may be removed,
and the refusals that keep a user's checkpoints (``megatron_ext.checkpoint.on_disk``; no torch)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from megatron_ext.checkpoint import on_disk
from megatron_ext.checkpoint.on_disk import (
    CHECKSUMS_FILENAME,
    SAVING_FILENAME,
    TRACKER_FILENAME,
    CheckpointError,
    DirState,
)
from tests.filesystems import read_only_filesystem, small_filesystem

pytestmark = pytest.mark.unit


def _finished(root: Path, iteration: int, *, manifest: bool = True) -> Path:
    """A directory as a finished save leaves it (``manifest=False``: as an older version left it)."""
    path = on_disk.checkpoint_dir(root, iteration)
    path.mkdir(parents=True)
    for name in on_disk.MEGATRON_FILES:
        (path / name).write_text("{}")
    (path / "__0_0.distcp").write_bytes(b"weights")
    if manifest:
        (path / CHECKSUMS_FILENAME).write_text(json.dumps({"crc32": None}))
    return path


def _killed(root: Path, iteration: int) -> Path:
    """A save killed while writing: its marker and some files, no manifest."""
    path = on_disk.checkpoint_dir(root, iteration)
    path.mkdir(parents=True)
    (path / SAVING_FILENAME).write_text("{}")
    (path / "__0_0.distcp").write_bytes(b"half")
    return path


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """Checkpoints 2, 4 (complete) and 6 (unverified: an older version's), tracker at 6, a killed save at 8."""
    root = tmp_path / "ckpt"
    _finished(root, 2)
    _finished(root, 4)
    _finished(root, 6, manifest=False)
    _killed(root, 8)
    on_disk.write_tracker(root, 6)
    return root


def test_states(run_dir: Path) -> None:
    assert on_disk.states(run_dir) == {
        2: DirState.COMPLETE,
        4: DirState.COMPLETE,
        6: DirState.UNVERIFIED,
        8: DirState.PARTIAL,
    }
    empty = on_disk.checkpoint_dir(run_dir, 10)
    empty.mkdir()
    assert on_disk.state_of(empty) is DirState.PARTIAL  # killed between mkdir and its marker


def test_states_leave_out_a_directory_removed_while_they_are_read(
    run_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader beside a running job: a directory the job prunes after it was listed is simply gone."""
    listed = on_disk.iteration_dirs(run_dir)
    on_disk.remove_directory(listed[2])
    monkeypatch.setattr(on_disk, "iteration_dirs", lambda root: listed)
    assert on_disk.states(run_dir) == {4: DirState.COMPLETE, 6: DirState.UNVERIFIED, 8: DirState.PARTIAL}
    assert on_disk.complete_iterations(run_dir) == [4, 6]


def test_a_published_save_whose_marker_outlived_it_is_complete(tmp_path: Path) -> None:
    """Killed after the tracker named it, before its marker was removed: the tracker decides."""
    root = tmp_path / "ckpt"
    path = _finished(root, 3)
    (path / SAVING_FILENAME).write_text("{}")
    on_disk.write_tracker(root, 3)
    assert on_disk.states(root) == {3: DirState.COMPLETE}
    assert on_disk.remove_partial_saves(root) == []
    assert path.is_dir() and not (path / SAVING_FILENAME).exists()


def test_only_partial_saves_are_removed(run_dir: Path) -> None:
    removed = on_disk.remove_partial_saves(run_dir)
    assert removed == [on_disk.checkpoint_dir(run_dir, 8)]
    # The unverified one (no checksums.json) is loaded read-only and kept: the old version deleted it.
    assert sorted(on_disk.iteration_dirs(run_dir)) == [2, 4, 6]


def test_a_new_save_never_replaces_a_finished_one_unless_asked(run_dir: Path) -> None:
    with pytest.raises(CheckpointError, match=r"iter_0000004 already holds a complete checkpoint .* it is kept"):
        on_disk.start_save(run_dir, 4, overwrite=False)
    with pytest.raises(CheckpointError, match="unverified checkpoint"):
        on_disk.start_save(run_dir, 6, overwrite=False)
    assert (on_disk.checkpoint_dir(run_dir, 4) / "__0_0.distcp").read_bytes() == b"weights"
    target = on_disk.start_save(run_dir, 4, overwrite=True)
    assert sorted(p.name for p in target.iterdir()) == [SAVING_FILENAME]
    marker = json.loads((target / SAVING_FILENAME).read_text())
    assert marker["iteration"] == 4 and marker["pid"] == os.getpid()
    # A partial save in the way is replaced without asking.
    assert on_disk.start_save(run_dir, 8, overwrite=False).is_dir()


def test_publishing_order(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    target = on_disk.start_save(root, 5, overwrite=False)
    (target / "__0_0.distcp").write_bytes(b"x")
    assert on_disk.state_of(target) is DirState.PARTIAL
    (target / CHECKSUMS_FILENAME).write_text(json.dumps({"crc32": {}}))
    assert on_disk.state_of(target) is DirState.PARTIAL  # not yet tracked
    on_disk.write_tracker(root, 5)
    assert on_disk.states(root) == {5: DirState.COMPLETE}
    on_disk.finish_save(target)
    assert on_disk.state_of(target) is DirState.COMPLETE
    assert on_disk.files_to_hash(target) == ["__0_0.distcp"]


def test_a_save_killed_as_it_starts_leaves_no_checkpoint_lookalike(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: the directory was made empty and its marker written after, through a temporary file; a kill
    between the two left ``iter_*`` holding only ``.saving.json.tmp``, which read as a finished (unverified) save,
    and the next save of that iteration refused to replace it (a kill -9 test on a loaded machine found it)."""
    root = tmp_path / "ckpt"

    def killed(path: Path, text: str) -> None:
        path.with_name(f".{path.name}.tmp").write_text(text[:5])
        raise KeyboardInterrupt  # stands for the SIGKILL: nothing after this line runs

    monkeypatch.setattr(on_disk, "write_atomically", killed)
    with pytest.raises(KeyboardInterrupt):
        on_disk.start_save(root, 7, overwrite=False)
    monkeypatch.undo()
    assert on_disk.iteration_dirs(root) == {}  # no iter_* directory at all
    assert on_disk.remove_partial_saves(root) == [root / f".iter_0000007{on_disk.STARTING_SUFFIX}"]
    assert on_disk.state_of(on_disk.start_save(root, 7, overwrite=False)) is DirState.PARTIAL
    assert sorted(p.name for p in root.iterdir()) == ["iter_0000007"]


def test_prune_keeps_unverified_and_newer_than_tracked(run_dir: Path) -> None:
    on_disk.write_tracker(run_dir, 6)
    _finished(run_dir, 9)  # beyond the tracker: not this pruning's business
    removed = on_disk.prune(run_dir, keep=1)
    assert removed == [on_disk.checkpoint_dir(run_dir, 2)]
    assert sorted(on_disk.iteration_dirs(run_dir)) == [4, 6, 8, 9]


def test_missing_tracker_with_finished_checkpoints_is_refused(run_dir: Path) -> None:
    (run_dir / TRACKER_FILENAME).unlink()
    with pytest.raises(CheckpointError) as err:
        on_disk.check_load_directory(run_dir, overwrite=False)
    message = str(err.value)
    assert f"has no {TRACKER_FILENAME} but holds finished checkpoints of iterations 2, 4, 6 (unverified)" in message
    assert f"echo 6 > {run_dir / TRACKER_FILENAME}" in message and "--overwrite-checkpoints" in message
    on_disk.check_load_directory(run_dir, overwrite=True)
    on_disk.check_load_directory(run_dir.parent / "empty", overwrite=False)  # a first run's --load


def test_save_directory_with_checkpoints_beyond_the_start_is_refused(run_dir: Path) -> None:
    on_disk.check_save_directory(run_dir, start_iteration=6, overwrite=False)  # resuming: 8 is partial
    with pytest.raises(CheckpointError, match="already holds checkpoints up to iteration 6, beyond this run's start"):
        on_disk.check_save_directory(run_dir, start_iteration=4, overwrite=False)
    (run_dir / TRACKER_FILENAME).unlink()
    with pytest.raises(CheckpointError) as err:
        on_disk.check_save_directory(run_dir, start_iteration=0, overwrite=False)
    assert "that this run would replace: 2, 4, 6 (unverified) (it has no latest_checkpointed_iteration.txt)" in str(
        err.value
    )
    on_disk.check_save_directory(run_dir, start_iteration=0, overwrite=True)


@pytest.mark.parametrize(
    ("content", "shown"),
    [(b"\xff\xfe\x00", r"binary bytes b'\\xff\\xfe\\x00'"), (b"six\n", "'six'"), (b"", "''")],
)
def test_damaged_tracker_is_named_with_the_fix(run_dir: Path, content: bytes, shown: str) -> None:
    (run_dir / TRACKER_FILENAME).write_bytes(content)
    with pytest.raises(CheckpointError) as err:
        on_disk.read_tracker(run_dir)
    assert str(err.value) == (
        f"{run_dir / TRACKER_FILENAME}: expected an iteration number, found {shown.replace(chr(92) * 2, chr(92))}; "
        f"write the iteration to resume from into it (complete checkpoints: 2, 4, 6; "
        f"e.g. echo 6 > {run_dir / TRACKER_FILENAME})"
    )


@pytest.mark.parametrize("name", sorted(on_disk.MEGATRON_FILES))
def test_each_missing_megatron_file_is_named(tmp_path: Path, name: str) -> None:
    path = _finished(tmp_path, 1)
    on_disk.check_structure(path)
    (path / name).unlink()
    with pytest.raises(CheckpointError, match=rf"{path / name} is missing \(.+\): the checkpoint is damaged"):
        on_disk.check_structure(path)


def test_damaged_metadata_and_manifest_are_named(tmp_path: Path) -> None:
    path = _finished(tmp_path, 1)
    (path / "metadata.json").write_bytes(b"\x00garbage")
    with pytest.raises(CheckpointError, match=r"metadata.json is damaged"):
        on_disk.check_structure(path)
    (path / CHECKSUMS_FILENAME).write_text('{"crc32": 5}')
    with pytest.raises(CheckpointError, match=r"checksums.json is damaged"):
        on_disk.read_checksums(path)


def test_resolve_iteration(run_dir: Path) -> None:
    assert on_disk.resolve_iteration(run_dir, None) == on_disk.checkpoint_dir(run_dir, 6)
    assert on_disk.resolve_iteration(run_dir, 2) == on_disk.checkpoint_dir(run_dir, 2)
    with pytest.raises(CheckpointError, match=r"no finished checkpoint of iteration 8; finished ones: 2, 4, 6"):
        on_disk.resolve_iteration(run_dir, 8)
    (run_dir / TRACKER_FILENAME).unlink()
    with pytest.raises(CheckpointError, match=r"finished checkpoints there: 2, 4, 6 \(give --iteration\)"):
        on_disk.resolve_iteration(run_dir, None)


# ------------------------------------------------------------------ the --save path before training
def test_save_path_that_can_be_created(tmp_path: Path) -> None:
    problem, free = on_disk.save_path_problem(tmp_path / "a" / "b", needed_bytes=1000, probe=True)
    assert problem is None and free is not None and free > 1000
    assert not (tmp_path / "a").exists()  # checked, not created
    assert list(tmp_path.iterdir()) == []  # the probe file is gone


def test_save_path_under_a_file(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    problem, _ = on_disk.save_path_problem(tmp_path / "f" / "ckpt", needed_bytes=None, probe=False)
    assert (
        problem == f"--save {tmp_path / 'f' / 'ckpt'} cannot be created: {tmp_path / 'f'} is a file; give a directory"
    )


def test_save_path_on_a_read_only_filesystem(tmp_path: Path) -> None:
    with read_only_filesystem(tmp_path / "ro") as ro:
        problem, _ = on_disk.save_path_problem(ro / "ckpt", needed_bytes=None, probe=True)
    assert problem == f"--save {ro / 'ckpt'}: {ro} is on a read-only filesystem (EROFS); choose a writable directory"


def test_save_path_without_room_for_one_checkpoint(tmp_path: Path) -> None:
    with small_filesystem(tmp_path / "small", size_kib=512) as fs:
        problem, free = on_disk.save_path_problem(fs / "ckpt", needed_bytes=3 * 2**20, probe=True)
    assert free is not None and free <= 512 * 2**10
    assert problem is not None
    assert f"--save {fs / 'ckpt'}: {fs} has {on_disk.size_text(free)} free and one checkpoint" in problem
    assert "needs about 3.0 MiB; free space there or choose another --save directory" in problem


def test_write_atomically_leaves_nothing_on_a_full_disk(tmp_path: Path) -> None:
    with small_filesystem(tmp_path / "small", size_kib=64) as fs:
        with pytest.raises(OSError) as err:
            on_disk.write_atomically(fs / "big.json", "x" * 200_000)
        assert on_disk.os_error_text(err.value) == "no space left on device (ENOSPC)"
        assert list(fs.iterdir()) == []


def test_size_text() -> None:
    assert [on_disk.size_text(n) for n in (12, 5 * 2**10, 5.5 * 2**20, 1.234 * 2**30)] == [
        "12 bytes",
        "5.0 KiB",
        "5.5 MiB",
        "1.23 GiB",
    ]

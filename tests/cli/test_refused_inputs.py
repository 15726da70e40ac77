"""Folders that cannot be written and jobs no machine like this holds: refused before any
process starts or anything is written, with one line naming what to fix and exit 2."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest
from conftest import REPO, TARGET, chaos_processes

from torchchaos.explore.rows import Entry
from torchchaos.explore.shards import Shard, write_manifest
from torchchaos.scenario.spec import Spec

CLI = [sys.executable, "-m", "torchchaos.cli"]
AS_ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, cwd=cwd, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(REPO)})


@contextmanager
def tmpfs(where: Path, *options: str) -> Iterator[Path]:
    """A 64 KiB tmpfs at `where`, unmounted however the test ends."""
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join(["size=64k", *options]), "tmpfs",
                    str(where)], check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=True)


def fill(folder: Path) -> None:
    """Write into `folder` until its filesystem is full."""
    with open(folder / "filler", "wb") as handle:
        try:
            while True:
                handle.write(b"\0" * 4096)
                handle.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
        try:
            handle.close()
        except OSError:  # the last buffered block
            pass


def tree(root: Path) -> dict[str, int]:
    """Every path under `root` and its size: what "nothing written" compares."""
    return {str(p.relative_to(root)): p.lstat().st_size for p in root.rglob("*")}


def readonly(stack: ExitStack, tmp: Path) -> Path:
    return stack.enter_context(tmpfs(tmp / "ro", "ro"))


def full(stack: ExitStack, tmp: Path) -> Path:
    folder = stack.enter_context(tmpfs(tmp / "full"))
    fill(folder)
    return folder


def a_file(_stack: ExitStack, tmp: Path) -> Path:
    (tmp / "a-file").write_text("not a folder\n")
    return tmp / "a-file"


# (--out, --cache-dir) from the place made by the case's set-up; what the line must say
CASES = {
    "cache is a file": (a_file, lambda p, t: (t / "out", p),
                        "reference cache {p}: {p} is a file, not a folder; choose another"
                        " (--cache-dir)"),
    "out under a file": (a_file, lambda p, t: (p / "out", t / "cache"),
                         "output directory {p}/out: {p} is a file, not a folder"),
    "out read-only": (readonly, lambda p, t: (p / "out", t / "cache"),
                      "output directory {p}/out: cannot write in {p} (Read-only file system);"
                      " choose another (--out)"),
    "cache read-only": (readonly, lambda p, t: (t / "out", p / "cache"),
                        "reference cache {p}/cache: cannot write in {p} (Read-only file"
                        " system)"),
    "out full": (full, lambda p, t: (p / "out", t / "cache"),
                 "output directory {p}/out: {p} is full"),
    "cache full": (full, lambda p, t: (t / "out", p),
                   "reference cache {p}: {p} is full"),
}


@AS_ROOT
@pytest.mark.parametrize("command", ["run", "battery", "campaign"])
@pytest.mark.parametrize("case", list(CASES))
def test_a_folder_that_cannot_be_written_is_refused_before_anything(tmp_path, command, case):
    """Before the fix: an internal error (FileExistsError, EROFS, ENOSPC) after the run
    had written replay.yaml into --out, which then could not be used again."""
    make, folders, message = CASES[case]
    with ExitStack() as stack:
        place = make(stack, tmp_path)
        out, cache = folders(place, tmp_path)
        before = tree(tmp_path)
        started = time.monotonic()
        result = cli(command, "--out", str(out), "--cache-dir", str(cache), "--", str(TARGET),
                     "--steps", "4", cwd=tmp_path)
        assert result.returncode == 2, result.stdout + result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("torchchaos: error: "), result.stderr
        assert message.format(p=place) in lines[0], lines[0]
        assert tree(tmp_path) == before, "a refused command must write nothing"
        assert chaos_processes(tmp_path) == []
        assert time.monotonic() - started < 30  # no reference run was started


@AS_ROOT
def test_a_merge_into_a_read_only_folder_is_refused_before_anything(tmp_path):
    for index in (1, 2):
        (tmp_path / f"shard-{index}").mkdir()
        write_manifest(tmp_path / f"shard-{index}", "battery", "torchchaos battery",
                       Shard(index, 2), [Entry("run 1", Spec.read("kill:rank=0,step=5"))])
    with tmpfs(tmp_path / "ro", "ro") as place:
        before = tree(tmp_path)
        result = cli("merge", str(tmp_path / "shard-1"), str(tmp_path / "shard-2"), "--out",
                     str(place / "merged"), cwd=tmp_path)
        assert result.returncode == 2, result.stdout + result.stderr
        assert result.stderr.strip().splitlines() == [
            f"torchchaos: error: output directory {place}/merged: cannot write in {place}"
            " (Read-only file system); choose another (--out)"]
        assert tree(tmp_path) == before


@pytest.mark.parametrize("args", [["run", "--nproc", "100000"],
                                  ["battery", "--nodes", "1000", "--nproc", "100"]])
def test_force_is_bounded_by_what_the_machine_can_hold(tmp_path, args):
    """--force lets ranks share cores, not fork past the machine's memory or pids (before
    the fix, 100000 ranks were started). The bound names the world size and what limits
    it."""
    result = cli(*args, "--force", "--out", str(tmp_path / "out"), "--cache-dir",
                 str(tmp_path / "cache"), "--", str(TARGET), cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("torchchaos: error: --nproc"), result.stderr
    assert "ranks: this machine holds at most" in lines[0]
    assert "even with --force; lower --nproc or --nodes" in lines[0]
    assert list(tmp_path.iterdir()) == [] and chaos_processes(tmp_path) == []


@pytest.mark.parametrize("where, message", [
    ("a folder", "is a folder; name a file"),
    ("under a file", "is a file, not a folder"),
], ids=["a folder", "under a file"])
def test_a_junit_file_that_cannot_be_written_is_refused_before_the_sweep(tmp_path, where,
                                                                         message):
    """--junitxml is written when the sweep ends: found then, the sweep's table is lost."""
    (tmp_path / "file").write_text("")
    target = tmp_path if where == "a folder" else tmp_path / "file" / "report.xml"
    before = tree(tmp_path)
    done = cli("battery", "--junitxml", str(target), "--out", str(tmp_path / "out"),
               cwd=tmp_path)
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert tree(tmp_path) == before

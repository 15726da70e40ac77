"""What a power loss leaves of a directory tree: the durable state.

The model is the pessimistic POSIX one that checkpoint protocols must survive:

- a file's data is durable as of its last fsync (or fdatasync); a file created
  and never synced is empty after a power loss;
- a directory's entries (names created, removed or renamed in it) are durable
  as of the directory's last fsync; a name added since then is gone, a name
  removed since then is back, pointing at the same file as before.

Every kind of entry is one name in its folder and is kept by these rules: a
regular file, a symlink (to a file or a folder: the link itself, never what it
points at; its target string is durable with its name), each name of a hard
link, a folder, empty or not.

Everything present when tracking starts is durable. The tracker lives beside
the real tree (`root`, the folder under the mount) and is told about every
mutation by the filesystem just before it happens. Top-level folders named in
`private` are no part of the tree: never scanned, rewound or listed. It keeps
what a power loss would need to bring back in `shadow` (same filesystem as
`root`; it may lie inside a private folder):

- `shadow/data/<ino>`: the durable content of a file overwritten since its
  last fsync (copied at the first write after a sync; new files need none);
- `shadow/kept/<ino>`: a file or directory removed from the tree while some
  durable directory listing still names it (moved there, not deleted, so its
  inode number is never reused while the model refers to it).

`power_loss()` rewinds the tree to the durable state and starts over.
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

Listing = dict[str, int]  # entry name -> inode number


@dataclass
class PowerLossReport:
    """What a power loss dropped, for the history."""

    reverted_files: list[str] = field(default_factory=list)  # data rolled back to last fsync
    removed: list[str] = field(default_factory=list)  # names that were not durable
    restored: list[str] = field(default_factory=list)  # removed names that come back

    def to_dict(self) -> dict[str, list[str]]:
        return {"reverted_files": self.reverted_files, "removed": self.removed,
                "restored": self.restored}


class DurabilityTracker:
    def __init__(self, root: Path, shadow: Path, private: frozenset[str] = frozenset()) -> None:
        self.root = root
        self.shadow = shadow
        self.private = private
        # stat, not lstat: the root may be a /proc/self/fd link to the folder
        self.root_ino = os.stat(root).st_ino
        self.durable_dirs: dict[int, Listing] = {}  # dir inode -> entries as of its last fsync
        self.dirty: dict[int, Path | None] = {}  # file inode -> durable content (None: empty)
        self.kept: dict[int, Path] = {}  # inode removed from the tree -> where it is kept
        self.reset()

    # -- bookkeeping ---------------------------------------------------------
    def reset(self) -> None:
        """Declare everything in the tree durable (at start, and after a power loss)."""
        shutil.rmtree(self.shadow, ignore_errors=True)
        (self.shadow / "data").mkdir(parents=True)
        (self.shadow / "kept").mkdir()
        self.dirty.clear()
        self.kept.clear()
        self.durable_dirs = self._scan()

    def _walk(self) -> Iterator[tuple[str, list[str], list[str]]]:
        """os.walk over the tree, without the private folders. A symlink is an entry
        of its own, whatever it points at: os.walk lists a link to a folder among
        the folders (and does not descend), here it is among the other entries."""
        for folder, dirs, files in os.walk(self.root):
            links = [d for d in dirs if os.path.islink(os.path.join(folder, d))]
            dirs[:] = [d for d in dirs if d not in links]
            files = files + links
            if folder == str(self.root):
                dirs[:] = [d for d in dirs if d not in self.private]
                files = [f for f in files if f not in self.private]
            yield folder, dirs, files

    def _listing(self, folder: Path | str) -> Listing:
        """A folder's entries; the root's without the private folders."""
        found = _listing(Path(folder))
        if os.stat(folder).st_ino == self.root_ino:
            found = {name: ino for name, ino in found.items() if name not in self.private}
        return found

    def _scan(self) -> dict[int, Listing]:
        """Every directory under root: inode -> its current listing."""
        return {os.stat(folder).st_ino: self._listing(folder)
                for folder, _dirs, _files in self._walk()}

    def _durably_named(self, ino: int) -> bool:
        return any(ino in listing.values() for listing in self.durable_dirs.values())

    # -- told before each mutation ------------------------------------------
    def created(self, path: Path) -> None:
        """A new file or directory now exists at `path` (call after creating it)."""
        st = os.lstat(path)
        if stat.S_ISDIR(st.st_mode):
            self.durable_dirs[st.st_ino] = {}  # its own entries are not durable yet
        elif stat.S_ISREG(st.st_mode):
            self.dirty[st.st_ino] = None  # durable content: nothing

    def before_data_change(self, file: Path | int) -> None:
        """The content or size of `file` (a path or an open descriptor) is about to
        change (write, truncate)."""
        st = _stat(file)
        if st.st_ino in self.dirty or not stat.S_ISREG(st.st_mode):
            return
        copy = self.shadow / "data" / str(st.st_ino)
        # through /proc for a descriptor: works even if the file was unlinked meanwhile
        shutil.copyfile(f"/proc/self/fd/{file}" if isinstance(file, int) else file, copy)
        self.dirty[st.st_ino] = copy

    def file_synced(self, file: Path | int) -> None:
        copy = self.dirty.pop(_stat(file).st_ino, None)
        if copy is not None:
            copy.unlink(missing_ok=True)

    def dir_synced(self, path: Path) -> None:
        self.durable_dirs[os.stat(path).st_ino] = self._listing(path)

    def remove(self, path: Path) -> None:
        """Remove `path` (unlink or rmdir) on the caller's behalf, keeping it if a
        durable listing still names it."""
        st = os.lstat(path)
        if self._durably_named(st.st_ino):
            self._keep(path, st.st_ino)
        elif stat.S_ISDIR(st.st_mode):
            os.rmdir(path)
        else:
            os.unlink(path)
            if st.st_nlink == 1:
                self._forget(st.st_ino)

    def before_replace(self, path: Path) -> None:
        """`path` is about to be replaced by a rename; keep the victim if needed."""
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return
        if stat.S_ISDIR(st.st_mode):
            return  # rename(2) only replaces an empty directory; the caller's rename decides
        if self._durably_named(st.st_ino):
            os.link(path, self.shadow / "kept" / str(st.st_ino), follow_symlinks=False)
            self.kept[st.st_ino] = self.shadow / "kept" / str(st.st_ino)
        elif st.st_nlink == 1:
            self._forget(st.st_ino)

    def _keep(self, path: Path, ino: int) -> None:
        if os.path.isdir(path) and not os.path.islink(path) and any(os.scandir(path)):
            raise OSError(39, os.strerror(39), str(path))  # ENOTEMPTY, as rmdir would say
        place = self.shadow / "kept" / str(ino)
        os.rename(path, place)
        self.kept[ino] = place

    def _forget(self, ino: int) -> None:
        copy = self.dirty.pop(ino, None)
        if copy is not None:
            copy.unlink(missing_ok=True)

    def committed_files(self) -> list[Path]:
        """Regular files whose data and name are both durable: what a finished,
        correctly published checkpoint consists of."""
        return [path for path in self.files() if (ino := os.lstat(path).st_ino)
                not in self.dirty and self._durably_named(ino)]

    def files(self) -> list[Path]:
        """Every regular file in the tree, durable or not."""
        found = []
        for folder, _dirs, files in self._walk():
            for name in files:
                path = Path(folder) / name
                if stat.S_ISREG(os.lstat(path).st_mode):
                    found.append(path)
        return sorted(found)

    # -- the power loss ------------------------------------------------------
    def power_loss(self) -> PowerLossReport:
        """Rewind the tree to its durable state, then call everything durable."""
        report = PowerLossReport()
        where = self._locate_files()
        self._revert_data(where, report)
        staging = self.shadow / "staging"
        staging.mkdir()
        self._build(staging, self.root_ino, where, self._scan(), Path("."), report)
        self._report_removed(self.root_ino, report)
        trash = self.shadow / "trash"
        trash.mkdir()
        for name in self._listing(self.root):
            os.rename(self.root / name, trash / name)
        for entry in list(staging.iterdir()):
            os.rename(entry, self.root / entry.name)
        self.reset()  # also deletes staging, trash, kept copies and data copies
        return report

    def _locate_files(self) -> dict[int, Path]:
        """inode -> one current path, for every non-directory in the tree or kept."""
        where: dict[int, Path] = {}
        for folder, _dirs, files in self._walk():
            for name in files:
                path = Path(folder) / name
                where.setdefault(os.lstat(path).st_ino, path)
        for ino, place in self.kept.items():
            if not stat.S_ISDIR(os.lstat(place).st_mode):
                where.setdefault(ino, place)
        return where

    def _revert_data(self, where: dict[int, Path], report: PowerLossReport) -> None:
        for ino, copy in self.dirty.items():
            path = where.get(ino)
            if path is None:
                continue
            if copy is None:
                os.truncate(path, 0)
            else:
                shutil.copyfile(copy, path)
            report.reverted_files.append(self._show(path))

    def _build(self, into: Path, dir_ino: int, where: dict[int, Path],
               current: dict[int, Listing], rel: Path, report: PowerLossReport) -> None:
        """Recreate the durable entries of directory `dir_ino` inside `into`."""
        now = current.get(dir_ino, {})
        for name, ino in self.durable_dirs.get(dir_ino, {}).items():
            if ino in self.durable_dirs:  # a directory: recreate it, then its entries
                (into / name).mkdir()
                self._build(into / name, ino, where, current, rel / name, report)
            elif ino in where:
                os.link(where[ino], into / name, follow_symlinks=False)
            else:
                continue  # cannot happen while every removal goes through remove()
            if now.get(name) != ino:
                report.restored.append(os.path.normpath(rel / name))

    def _report_removed(self, root_ino: int, report: PowerLossReport) -> None:
        """Names in the current tree that the durable tree lacks."""
        durable_paths = set(self._durable_paths(root_ino, Path(".")))
        for folder, dirs, files in self._walk():
            for name in dirs + files:
                rel = Path(folder, name).relative_to(self.root)
                if rel not in durable_paths:
                    report.removed.append(str(rel))

    def _durable_paths(self, dir_ino: int, rel: Path) -> list[Path]:
        paths = []
        for name, ino in self.durable_dirs.get(dir_ino, {}).items():
            paths.append(rel / name)
            if ino in self.durable_dirs:
                paths.extend(self._durable_paths(ino, rel / name))
        return [Path(os.path.normpath(p)) for p in paths]

    def _show(self, path: Path) -> str:
        try:
            return str(path.relative_to(self.root))
        except ValueError:
            return f"(removed) {path.name}"


def _stat(file: Path | int) -> os.stat_result:
    return os.fstat(file) if isinstance(file, int) else os.lstat(file)


def _listing(folder: Path) -> Listing:
    return {entry.name: entry.inode() for entry in os.scandir(folder)}

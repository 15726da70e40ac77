"""See a rank's file events under the run directory by interposing on Python's I/O.

This is the light, in-process mechanism: it wraps `open`, the `os` calls that
make a checkpoint durable or visible (open, write, sendfile, fsync,
rename/replace, remove/unlink/rmdir, mkdir) and `torch.save` / `torch.load`
and safetensors' `save_file` / `load_file` with a path. Each event under the
watched root is reported to a listener *after* the operation took effect, so
a kill fired by the listener leaves exactly that state behind.

Consecutive writes to one open file count as one "write" event (a write
after an fsync is a new one). The event lands once the first half of the
first write's bytes is in the file and before the rest goes in, so a kill at
it leaves a strict, non-empty prefix of the file (torn), even for a writer
that hands over the whole file in one call. How each writer is seen:

- a Python file object (`open`, `os.fdopen`, `pathlib`'s `write_bytes`,
  `numpy.save` with a path, which writes its header and then its data
  through the wrapped `open`): "open", then "write" at half of the first
  `write()` call's data (flushed to the file first);
- `os.open` + `os.write`: "open", then "write" at half of the first
  `os.write()`'s bytes (the rest is written in a second call; the caller
  still sees one full write);
- `os.sendfile` (`shutil.copyfile` on Linux): "write" once half of what is
  left of the source (at most the count asked for) is sent, the rest follows
  in a second call;
- `torch.save(obj, path)`: the C++ writer would write the file unseen, so
  the path is opened through the wrapped `open` and torch saves into that
  file object: "open", then "write" inside the zip's first record. The
  bytes differ from an unwatched save to a path in one way: torch names the
  zip's top folder after the file (`step-10/data.pkl`) when it opens the
  path itself and `archive/` when it writes to a file object, and the
  alignment padding follows the name's length; the records and what
  `torch.load` returns are the same. (The legacy format is byte-identical.)
  A name torch refuses (no parent folder, `.hidden` with no stem) goes to
  torch unchanged, so the job meets torch's own error: "open", then no write;
- safetensors' `save_file(tensors, path)` (a Rust writer): the bytes come
  from `safetensors.torch.save` (identical) and go through the wrapped
  `open`: "open", then "write".

A mkdir of a folder that already exists is reported too (ranks race to make
a shared folder). Files under the harness's own folder (`_chaos/`) are never
reported.
"""

from __future__ import annotations

import builtins
import contextlib
import io
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

Listener = Callable[[str, str], None]  # (op, path)

WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC


class _WatchedFile:
    """A file object that reports its first write (and first write after an fsync)."""

    def __init__(self, raw: Any, path: str, watch: IOWatch) -> None:
        self._raw = raw
        self._path = path
        self._watch = watch
        self._reported = False

    def write(self, data: Any) -> Any:
        if self._reported:
            return self._raw.write(data)
        head, tail = split_first_write(data)
        written = self._raw.write(head)
        self._raw.flush()  # the torn prefix must be in the file if we die now
        self._reported = True
        self._watch.emit("write", self._path)
        if tail is None or written is None or written < len(head):
            return written  # an unbuffered file took less: the caller writes the rest
        more = self._raw.write(tail)
        return written if more is None else written + more

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def first_write_pending(self) -> bool:
        return not self._reported

    def written_through_fd(self) -> None:
        """Bytes went in by its descriptor (os.write, os.sendfile from shutil.copyfile)."""
        if not self._reported:
            self._reported = True
            self._watch.emit("write", self._path)

    def fileno(self) -> int:
        fd = self._raw.fileno()
        self._watch.track_fd(fd, self)
        return fd

    def rearm(self) -> None:
        self._reported = False

    def __enter__(self) -> _WatchedFile:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        if not self._raw.closed:
            self._watch.forget_fd(self._raw.fileno())
        self._raw.close()

    def __iter__(self) -> Any:
        return iter(self._raw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, name)


class IOWatch:
    """Installs the wrappers once per process; reports events under `root`."""

    def __init__(self, root: str, exclude: str, listener: Listener) -> None:
        self.root = os.path.abspath(root) + os.sep
        # A root reached through a symlink (a home or scratch folder linked elsewhere)
        # is not where a rank's relative paths land: os.getcwd() gives the real folder.
        # Paths under either are reported under `root` as given.
        self._real_root = os.path.realpath(root) + os.sep
        self.exclude = os.path.abspath(exclude) + os.sep
        self.listener = listener
        self._fds: dict[int, Any] = {}  # fd -> path (os.open) or _WatchedFile
        self._os_written: set[int] = set()
        # Per thread: an async checkpoint writer's events must not be muted
        # because the training thread happens to be inside torch.save.
        self._local = threading.local()
        self.open: Callable[..., Any] = builtins.open  # the watched open, once installed

    # -- helpers -----------------------------------------------------------
    def watched(self, path: Any, dir_fd: int | None = None) -> str | None:
        try:
            text = os.fsdecode(path)
        except TypeError:
            return None
        if dir_fd is not None and not os.path.isabs(text):
            text = os.path.join(_fd_path(dir_fd) or "", text)
        full = os.path.abspath(text)
        if self._real_root != self.root and full.startswith(self._real_root):
            full = self.root + full[len(self._real_root):]
        if full.startswith(self.root) and not (full + os.sep).startswith(self.exclude):
            return full
        return None

    def emit(self, op: str, path: str) -> None:
        if getattr(self._local, "busy", False):  # a handler's own I/O is not the target's
            return
        with self.muted():
            self.listener(op, path)

    @contextlib.contextmanager
    def muted(self) -> Iterator[None]:
        busy = getattr(self._local, "busy", False)
        self._local.busy = True
        try:
            yield
        finally:
            self._local.busy = busy

    def track_fd(self, fd: int, owner: Any) -> None:
        self._fds[fd] = owner

    def forget_fd(self, fd: int) -> None:
        # A descriptor number is reused once closed, also when a file object
        # (not os.close) closed it: a stale entry would report the writes of
        # whatever file gets the number next (the heartbeat's, say) as events.
        self._fds.pop(fd, None)
        self._os_written.discard(fd)

    def first_write_pending(self, fd: int) -> bool:
        """Whether a write through `fd` now is the first to a watched file: an event."""
        owner = self._fds.get(fd)
        if isinstance(owner, _WatchedFile):
            return owner.first_write_pending()
        return isinstance(owner, str) and fd not in self._os_written

    def first_write_done(self, fd: int) -> None:
        owner = self._fds.get(fd)
        if isinstance(owner, _WatchedFile):
            owner.written_through_fd()
        elif isinstance(owner, str):
            self._os_written.add(fd)
            self.emit("write", owner)

    # -- install -----------------------------------------------------------
    def install(self) -> None:
        self._wrap_open()
        self._wrap_os()
        self._wrap_torch()
        self._wrap_safetensors()

    def _wrap_open(self) -> None:
        real_open = builtins.open

        def watched_open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
            handle = real_open(file, mode, *args, **kwargs)
            if isinstance(file, int):  # os.fdopen of a descriptor os.open gave us
                owner = self._fds.get(file)
                path = owner if isinstance(owner, str) else None
                if path is not None and any(c in mode for c in "wax+"):
                    return _WatchedFile(handle, path, self)
                return handle
            path = self.watched(file)
            with contextlib.suppress(AttributeError, OSError, ValueError):
                self.forget_fd(handle.fileno())  # a fresh descriptor: no stale owner
            if path is None:
                return handle
            if any(c in mode for c in "wax+"):
                self.emit("open", path)
                return _WatchedFile(handle, path, self)
            self.emit("read", path)
            return handle

        builtins.open = watched_open
        io.open = watched_open
        self.open = watched_open

    def _wrap_os(self) -> None:
        real = {name: getattr(os, name) for name in
                ("open", "write", "fsync", "rename", "replace", "remove", "unlink",
                 "rmdir", "mkdir", "close", "sendfile")}

        def os_open(path: Any, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
            fd = real["open"](path, flags, mode, dir_fd=dir_fd)
            full = self.watched(path, dir_fd)
            self.forget_fd(fd)
            if full is not None and flags & WRITE_FLAGS:
                self._fds[fd] = full
                self.emit("open", full)
            return fd

        def os_write(fd: int, data: Any) -> int:
            if not self.first_write_pending(fd):
                return real["write"](fd, data)
            head, tail = split_first_write(data)
            written = real["write"](fd, head)
            self.first_write_done(fd)
            if tail is None or written < len(head):
                return written
            return written + _short_on_error(lambda: real["write"](fd, tail))

        def os_sendfile(out_fd: int, in_fd: int, offset: int | None, count: int) -> int:
            # shutil.copyfile (a checkpoint copied onto its final name) writes this way
            if not self.first_write_pending(out_fd):
                return real["sendfile"](out_fd, in_fd, offset, count)
            head = sendfile_head(in_fd, offset, count)
            sent = real["sendfile"](out_fd, in_fd, offset, head)
            self.first_write_done(out_fd)
            if head >= count or sent < head:
                return sent
            rest = None if offset is None else offset + sent
            return sent + _short_on_error(
                lambda: real["sendfile"](out_fd, in_fd, rest, count - sent))

        def os_fsync(fd: Any) -> None:
            real["fsync"](fd)
            number = fd if isinstance(fd, int) else fd.fileno()
            full = self.watched(_fd_path(number) or "")
            if full is not None:
                owner = self._fds.get(number)
                if isinstance(owner, _WatchedFile):
                    owner.rearm()
                self._os_written.discard(number)
                self.emit("fsync", full)

        def os_close(fd: int) -> None:
            self.forget_fd(fd)
            real["close"](fd)

        def mover(name: str) -> Callable[..., None]:
            def move(src: Any, dst: Any, *, src_dir_fd: int | None = None,
                     dst_dir_fd: int | None = None) -> None:
                real[name](src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)
                full = self.watched(dst, dst_dir_fd) or self.watched(src, src_dir_fd)
                if full is not None:
                    self.emit("rename", full)
            return move

        def path_op(name: str, op: str) -> Callable[..., None]:
            def run(path: Any, *args: Any, dir_fd: int | None = None, **kwargs: Any) -> None:
                full = self.watched(path, dir_fd)  # resolve before a remove makes it vanish
                try:
                    real[name](path, *args, dir_fd=dir_fd, **kwargs)
                except FileExistsError:
                    # Ranks that all make one shared folder race for it; counting the
                    # loser's attempt too keeps every rank's event numbers the same
                    # from run to run.
                    if full is not None and op == "mkdir":
                        self.emit(op, full)
                    raise
                if full is not None:
                    self.emit(op, full)
            return run

        os.open = os_open
        os.write = os_write
        os.sendfile = os_sendfile
        os.fsync = os_fsync
        os.close = os_close
        os.rename = mover("rename")
        os.replace = mover("replace")
        os.remove = path_op("remove", "remove")
        os.unlink = path_op("unlink", "remove")
        os.rmdir = path_op("rmdir", "remove")
        os.mkdir = path_op("mkdir", "mkdir")

    def _wrap_torch(self) -> None:
        import torch

        real_save, real_load = torch.save, torch.load

        def save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> Any:
            path = self.watched(f) if isinstance(f, (str, os.PathLike)) else None
            if path is None:
                return real_save(obj, f, *args, **kwargs)
            if not _torch_archive_name(os.fspath(f)):
                return whole(obj, f, path, *args, **kwargs)  # torch refuses the name itself
            try:
                handle = self.open(f, "wb")  # the "open" event; its first write is "write"
            except OSError:
                return whole(obj, f, path, *args, **kwargs)  # torch's own error, as unwatched
            with handle:
                return real_save(obj, handle, *args, **kwargs)

        def whole(obj: Any, f: Any, path: str, *args: Any, **kwargs: Any) -> Any:
            self.emit("open", path)
            with self.muted():
                result = real_save(obj, f, *args, **kwargs)
            self.emit("write", path)
            return result

        def load(f: Any, *args: Any, **kwargs: Any) -> Any:
            path = self.watched(f) if isinstance(f, (str, os.PathLike)) else None
            if path is None:
                return real_load(f, *args, **kwargs)
            self.emit("read", path)
            with self.muted():  # torch.load opens the file again: one event is enough
                return real_load(f, *args, **kwargs)

        torch.save = save
        torch.load = load

    def _wrap_safetensors(self) -> None:
        try:
            import safetensors.torch as st
        except ImportError:
            return
        real_save, real_load = st.save_file, st.load_file

        def save_file(tensors: Any, filename: Any, metadata: Any = None) -> None:
            if self.watched(filename) is None:
                return real_save(tensors, filename, metadata=metadata)
            # Rust would write the file unseen: the same bytes, through the watched open
            data = st.save(tensors, metadata=metadata)
            with self.open(filename, "wb") as out:
                out.write(data)
            return None

        def load_file(filename: Any, *args: Any, **kwargs: Any) -> Any:
            path = self.watched(filename)
            if path is not None:
                self.emit("read", path)
            with self.muted():
                return real_load(filename, *args, **kwargs)

        st.save_file, st.load_file = save_file, load_file


def split_first_write(data: Any) -> tuple[Any, Any]:
    """(head, tail) of a first write: a kill between them leaves a strict, non-empty
    prefix. tail is None where there is nothing to split (under two bytes or
    characters, or a buffer that is not contiguous)."""
    if isinstance(data, str):
        view: Any = data
    else:
        try:
            view = memoryview(data).cast("B")  # bytes, whatever the buffer's item type
        except (TypeError, ValueError):
            return data, None
    if len(view) < 2:
        return data, None
    half = len(view) // 2
    return view[:half], view[half:]


def sendfile_head(in_fd: int, offset: int | None, count: int) -> int:
    """How much of a first os.sendfile to send before its event: half of what is left
    of the source (the count asked for is often far more than the file holds)."""
    try:
        start = os.lseek(in_fd, 0, os.SEEK_CUR) if offset is None else offset
        left = min(count, os.fstat(in_fd).st_size - start)
    except OSError:  # not a seekable file: send as asked
        return count
    return max(left // 2, 1) if left >= 2 else count


def _torch_archive_name(path: str) -> str:
    """The zip's top folder torch's C++ writer names after a path: the file name up to
    its last dot ("" makes torch refuse the name)."""
    name = path.replace("\\", "/").rpartition("/")[2]
    return name.rpartition(".")[0] if "." in name else name


def _short_on_error(write: Callable[[], int]) -> int:
    """The second half of a split write. Its error is a short write (0 more bytes), as
    the kernel reports a write that fails part way: the caller retries and meets it."""
    try:
        return write()
    except OSError:
        return 0


def _fd_path(fd: int) -> str | None:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None

"""Where is each rank stuck? Capture a process's Python stacks from outside.

py-spy reads the stacks straight from the process's memory: it needs no
cooperation, works while the main thread is blocked in native code (a gloo or
NCCL wait) and, with `--nonblocking`, on a process that is stopped (SIGSTOP).
Where py-spy cannot attach (no ptrace permission, as in a container without
CAP_SYS_PTRACE), the agent's faulthandler, registered on `STACK_SIGNAL` at
boot, writes the stacks of every thread into a file; a stopped process must
then be continued for it to run.

`summarize` turns a dump into one line for the verdict: the innermost
framework call (a collective, backward) and the innermost call in the
target's own code.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from torchchaos import env
from torchchaos.host.procs import pid_stopped

STACK_SIGNAL = signal.SIGRTMIN + 6  # real-time: no target or library uses it for anything
PY_SPY_SECONDS = 10.0
FAULTHANDLER_SECONDS = 2.0

PY_SPY_PROCESS = re.compile(r"^Process (?P<pid>\d+):")
# py-spy names a thread ("MainThread") only when the target imported `threading`
PY_SPY_THREAD = re.compile(
    r'^Thread (?P<id>\S+) \((?:idle|active|gil)[^)]*\)(?:: "(?P<name>[^"]*)")?')
PY_SPY_FRAME = re.compile(r"^\s+(?P<func>\S+) \((?P<file>.+?):(?P<line>\d+)\)")
FH_THREAD = re.compile(r"^(Current thread|Thread) 0x[0-9a-f]+")
FH_FRAME = re.compile(r'^\s+File "(?P<file>.+)", line (?P<line>\d+) in (?P<func>\S+)')

# Framework calls worth naming (innermost first wins): collectives, backward, waits.
FRAMEWORK = ("torch/distributed/", "torch/autograd/", "torch/_tensor.py", "torch/cuda/")
FAULTS = str(env.package_dir("torchchaos.faults")) + os.sep
HARNESS = (str(env.package_dir()) + os.sep, FAULTS)
STDLIB = os.path.dirname(os.__file__) + os.sep
WRAPPERS = {"wrapper", "inner", "_fn", "decorate_context"}


@dataclass
class Frame:
    func: str
    file: str
    line: int

    def short(self) -> str:
        return f"{self.func} ({os.path.basename(self.file)}:{self.line})"


def capture(pid: int, fallback_file: Path | None) -> tuple[str, str]:
    """The stacks of `pid` as text, and how they were taken ("py-spy",
    "faulthandler"); where none could be, "" and why not, in words. `fallback_file` is
    where the agent's faulthandler writes them on STACK_SIGNAL; None for a process
    without an agent (a torchrun agent), which that signal, left at its default
    action, would kill."""
    text, py_spy_failed = _py_spy(pid)
    if text:
        return text, "py-spy"
    if fallback_file is None:
        return "", f"py-spy: {py_spy_failed}; no faulthandler in a process without an agent"
    text, handler_failed = _faulthandler(pid, fallback_file)
    if text:
        return text, "faulthandler"
    return "", f"py-spy: {py_spy_failed}; faulthandler: {handler_failed}"


def _py_spy_binary() -> str | None:
    beside = Path(sys.executable).with_name("py-spy")  # installed with torchchaos
    return str(beside) if beside.exists() else shutil.which("py-spy")


def _py_spy(pid: int) -> tuple[str, str]:
    """The dump, or "" and why there is none."""
    binary = _py_spy_binary()
    if binary is None:
        return "", "not installed"
    command = [binary, "dump", "--full-filenames", "--pid", str(pid)]
    # A stopped process is still already, and py-spy cannot suspend it again: read it
    # without suspending. A running one is suspended for a consistent stack; if that
    # fails (it was being stopped just then), read it without.
    attempts = [["--nonblocking"]] if pid_stopped(pid) else [[], ["--nonblocking"]]
    why = "no thread in its output"
    for extra in attempts:
        try:
            done = subprocess.run(command + extra, capture_output=True, text=True,
                                  timeout=PY_SPY_SECONDS)
        except subprocess.TimeoutExpired:
            return "", f"no answer in {PY_SPY_SECONDS:g} s"
        except OSError as exc:
            return "", str(exc)
        if done.returncode == 0 and "Thread" in done.stdout:
            return done.stdout, ""
        lines = (done.stderr or done.stdout).strip().splitlines()
        why = (lines[-1] if lines else f"exit status {done.returncode}")[:200]
    return "", why


def native(pid: int) -> str:
    """`py-spy dump --native` of `pid` ("" where it cannot be taken): each Python
    thread's C frames too. Taken of a frozen rank (no thread of it runs Python: one
    holds the GIL in native code) to tell which thread holds it (`gil_holder`)."""
    binary = _py_spy_binary()
    if binary is None:
        return ""
    try:
        done = subprocess.run([binary, "dump", "--native", "--full-filenames", "--pid",
                               str(pid)], capture_output=True, text=True,
                              timeout=PY_SPY_SECONDS)
    except (subprocess.TimeoutExpired, OSError):
        return ""
    return done.stdout if done.returncode == 0 and "Thread" in done.stdout else ""


# Where a thread of a frozen process waits. Every blocking call of the interpreter itself
# (a lock, time.sleep, select, a read, waiting to take the GIL back) releases the GIL
# first: a thread whose innermost frame past the C library is the interpreter's does not
# hold it. One in other native code (ctypes' libffi, an extension, torch) may.
SYSTEM_FRAME = re.compile(r"\((?:[^)]*/)?(?:libc|libpthread|ld-linux)[^)/]*\)\s*$|^\s+0x[0-9a-f]+ ")
INTERPRETER_FRAME = re.compile(r"\((?:[^)]*/)?(?:libpython[^)/]*|python3[\d.]*)\)\s*$"
                               r"|/(?:Python|Objects|Parser)/\w+\.c:\d+\)\s*$"
                               r"|/Modules/(?!_ctypes/)[\w/]+\.c:\d+\)\s*$")
PY_SPY_NATIVE_FRAME = re.compile(r"^\s+(?P<func>\S+) \((?P<where>[^)]*)\)\s*$")


def gil_holder(native_text: str) -> str | None:
    """In a `--native` dump of a process where no Python runs: the innermost Python frame
    of the one thread that can hold the GIL (its innermost native frame past the C library
    is not the interpreter's), as "func (file:line) in NATIVE", or None where not exactly
    one thread can."""
    holders = []
    for block in re.split(r"(?m)^(?=Thread )", native_text)[1:]:
        lines = block.splitlines()[1:]
        python_at = next((i for i, line in enumerate(lines) if ".py:" in line
                          and PY_SPY_FRAME.match(line)), None)
        if python_at is None:
            continue
        native_part = [line for line in lines[:python_at] if not SYSTEM_FRAME.search(line)]
        if not native_part or INTERPRETER_FRAME.search(native_part[0]):
            continue  # the interpreter released the GIL around this wait, or waits for it
        m = PY_SPY_FRAME.match(lines[python_at])
        assert m is not None
        top = PY_SPY_NATIVE_FRAME.match(lines[0])
        holders.append(Frame(m["func"], m["file"], int(m["line"])).short()
                       + (f" in {top['func']}" if top else ""))
    return holders[0] if len(holders) == 1 else None


def _faulthandler(pid: int, path: Path) -> tuple[str, str]:
    """Ask the agent's faulthandler for the stacks; what it appended, or "" and why."""
    start = path.stat().st_size if path.exists() else 0
    try:
        os.kill(pid, STACK_SIGNAL)
        if pid_stopped(pid):  # the handler runs only once the process runs
            os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        return "", "the process had ended"
    except PermissionError as exc:
        return "", str(exc)
    deadline = time.monotonic() + FAULTHANDLER_SECONDS
    while time.monotonic() < deadline:
        time.sleep(0.05)
        if path.exists() and path.stat().st_size > start:
            time.sleep(0.1)  # let it finish writing every thread
            with open(path, errors="replace") as f:
                f.seek(start)
                return f.read(), ""
    # the handler is C, but the signal is delivered to a thread that must run: one held
    # in the kernel (uninterruptible I/O, a FUSE request) or past the interpreter's
    # teardown never writes
    return "", f"nothing written in {FAULTHANDLER_SECONDS:g} s"


def threads(text: str) -> list[tuple[str, list[Frame]]]:
    """(thread name, frames innermost first) from a py-spy or faulthandler dump."""
    found: list[tuple[str, list[Frame]]] = []
    pid = ""
    for line in text.splitlines():
        if m := PY_SPY_PROCESS.match(line):
            pid = m["pid"]
        elif m := PY_SPY_THREAD.match(line):
            # the main thread's id is the process's own: py-spy leaves it unnamed in a
            # script that never imported threading (a plain interpreter in a venv)
            found.append((m["name"] or ("MainThread" if m["id"] == pid else ""), []))
        elif FH_THREAD.match(line):
            found.append(("", []))
        elif found and (m := PY_SPY_FRAME.match(line) or FH_FRAME.match(line)):
            found[-1][1].append(Frame(m["func"], m["file"], int(m["line"])))
    return [(name, _without_launcher(frames)) for name, frames in found]


def _without_launcher(frames: list[Frame]) -> list[Frame]:
    """A warm rank's frames end where an exec'd rank's do, at the script's `<module>`:
    past it lie runpy's and the launcher's that forked the rank (torchrun's
    run_script_path, called by torchchaos.rank.warmrun), which no hang is about."""
    for i, frame in enumerate(frames):
        if frame.func == "run_script_path" and frame.file.endswith("distributed/run.py"):
            script = frames[:i]
            while script and script[-1].file.startswith("<frozen runpy>"):
                script.pop()
            return script
    return frames


def main_thread(text: str) -> list[Frame]:
    """The frames of the thread that runs the script: its outermost frame is `<module>`."""
    found = threads(text)
    for name, frames in found:
        if name == "MainThread" or (frames and frames[-1].func == "<module>"):
            return frames
    return found[0][1] if found else []


def summarize(text: str) -> str:
    """One line: 'all_reduce (distributed_c10d.py:2950) <- train_step (ddp_lm.py:240)'."""
    frames = main_thread(text)
    if not frames:
        return "no stack could be taken"
    if _in_shutdown(frames):
        # the script returned; the interpreter waits for threads that never end
        waited = [name or "unnamed" for name, _ in threads(text)
                  if name != "MainThread" and not name.startswith("torchchaos-")]
        return (f"the interpreter's exit ({frames[0].short()}), waiting for thread(s)"
                f" still running: {', '.join(waited) or 'unknown'}")
    framework = _framework_frame(frames)
    own = next((f for f in frames if _own_code(f.file)), None)
    parts = [f.short() for f in (framework, own) if f is not None] or [frames[0].short()]
    line = " <- ".join(parts)
    fault = next((f for f in frames if f.file.startswith(FAULTS)), None)
    if fault is not None:  # a hang fault holds the rank there
        line += f", held there by torchchaos ({fault.func})"
    return line


def script_returned(text: str) -> bool:
    """Has the script run to its end? Its main thread holds only module-level frames (a
    destructor deadlocked as `main()` returned shows as the line that called it), or the
    interpreter's exit waiting for threads."""
    frames = main_thread(text)
    if not frames:
        return False
    return all(f.func == "<module>" for f in frames) or _in_shutdown(frames)


def _in_shutdown(frames: list[Frame]) -> bool:
    return frames[0].func == "_shutdown" and frames[0].file.endswith("threading.py")


def waits_in_framework(text: str) -> bool:
    """Is the main thread inside a collective or backward (waiting on its peers, most
    likely), rather than in the target's own code?"""
    return _framework_frame(main_thread(text)) is not None


def _framework_frame(frames: list[Frame]) -> Frame | None:
    return next((f for f in frames if any(p in f.file for p in FRAMEWORK)
                 and not f.func.startswith("_") and f.func not in WRAPPERS), None)


def _own_code(file: str) -> bool:
    """The target's own code: not the standard library, site-packages or the harness."""
    return not (file.startswith((STDLIB, "<", *HARNESS)) or "site-packages" in file)

"""Writers that hand over a whole file at once still leave a torn prefix at a kill.

torch.save to a path (C++), safetensors' save_file (Rust), shutil.copyfile
(os.sendfile), numpy.save, and a single write() or os.write() of a whole file:
a rank SIGKILLed at the file's "write" event must leave a strict, non-empty
prefix of the file that the reader rejects, and a save that is not killed must
write what it writes without the harness. Each writer runs in a child process
(the watch patches builtins).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from torchchaos.rundir.history import History

ROOT = Path(__file__).resolve().parents[2]

WRITE = textwrap.dedent("""
    import json, os, shutil, signal, sys
    import numpy as np, torch
    from torchchaos.rank.iowatch import IOWatch
    root, writer, die = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
    seen = []
    def listener(op, path):
        seen.append([op, os.path.relpath(path, root)])
        if die and op == "write":
            os.kill(os.getpid(), signal.SIGKILL)   # as the harness kills a rank
    IOWatch(root, os.path.join(root, "_chaos"), listener).install()
    from safetensors.torch import save_file   # imported after the agent, as in a rank
    g = torch.Generator().manual_seed(0)
    state = {"f32": torch.randn(256, 1024, generator=g),
             "bf16": torch.randn(512, 512, generator=g).bfloat16(),
             "i64": torch.arange(50000), "u8": torch.arange(256, dtype=torch.uint8)}
    blob = torch.randn(500000, generator=g).numpy().tobytes()
    out = os.path.join(root, "ckpt.out")
    if writer == "torch":
        torch.save(state, out)
    elif writer == "torch_legacy":
        torch.save(state, out, _use_new_zipfile_serialization=False)
    elif writer == "safetensors":
        save_file(state, out, metadata={"step": "10"})
    elif writer == "numpy":
        np.save(out, state["f32"].numpy(), allow_pickle=False)   # writes ckpt.out.npy
        out += ".npy"
    elif writer == "copy":
        os.makedirs(os.path.join(root, "_chaos"))
        staged = os.path.join(root, "_chaos", "staged")   # not watched
        with open(staged, "wb") as f:
            f.write(blob)
        shutil.copyfile(staged, out)   # os.sendfile on Linux
    elif writer == "python":
        with open(out, "wb") as f:
            f.write(blob)   # the whole file in one call
    elif writer == "os_write":
        fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        assert os.write(fd, blob) == len(blob)   # the caller still sees one full write
        os.close(fd)
    print(json.dumps(seen))
""")

WRITERS = ["torch", "torch_legacy", "safetensors", "numpy", "copy", "python", "os_write"]


def _write(root: Path, writer: str, die: bool) -> subprocess.CompletedProcess[str]:
    root.mkdir()
    return subprocess.run([sys.executable, "-c", WRITE, str(root), writer, str(int(die))],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)


def _output(root: Path) -> Path:
    return next(p for p in root.iterdir() if p.name.startswith("ckpt.out"))


def _rejected(writer: str, path: Path) -> bool:
    """Whether the writer's own reader refuses the file."""
    readers = {"safetensors": load_file, "numpy": np.load}
    read = readers.get(writer, lambda p: torch.load(p, weights_only=True))
    try:
        read(str(path))
    except (RuntimeError, EOFError, ValueError, OSError, SafetensorError, zipfile.BadZipFile):
        return True
    return False


@pytest.mark.parametrize("writer", WRITERS)
def test_a_kill_at_the_write_event_leaves_a_strict_prefix(tmp_path, writer):
    whole_run = _write(tmp_path / "whole", writer, die=False)
    assert whole_run.returncode == 0, whole_run.stderr
    name = _output(tmp_path / "whole").name
    assert json.loads(whole_run.stdout) == [["open", name], ["write", name]]
    killed = _write(tmp_path / "killed", writer, die=True)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    whole = _output(tmp_path / "whole").read_bytes()
    torn = _output(tmp_path / "killed").read_bytes()
    assert 0 < len(torn) < len(whole) and whole.startswith(torn), (len(torn), len(whole))
    if writer not in ("copy", "python", "os_write"):  # raw bytes: no reader to refuse
        assert not _rejected(writer, _output(tmp_path / "whole"))
        assert _rejected(writer, _output(tmp_path / "killed"))


SAME = textwrap.dedent("""
    import io, json, os, sys, torch
    from torchchaos.rank.iowatch import IOWatch
    root, elsewhere = sys.argv[1], sys.argv[2]
    seen = []
    IOWatch(root, os.path.join(root, "_chaos"),
            lambda op, path: seen.append([op, os.path.relpath(path, root)])).install()
    from safetensors.torch import save_file
    g = torch.Generator().manual_seed(1)
    state = {"f32": torch.randn(300, 70, generator=g), "f16": torch.randn(999, generator=g).half(),
             "bf16": torch.randn(33, 3, generator=g).bfloat16(), "f64": torch.randn(5).double(),
             "i8": torch.arange(-9, 9, dtype=torch.int8), "bool": torch.tensor([True, False]),
             "c64": torch.randn(4, dtype=torch.complex64, generator=g),
             "view": torch.arange(100.0)[10:20], "step": 10, "name": "run"}
    tensors = {k: v.contiguous() for k, v in state.items() if isinstance(v, torch.Tensor)}
    buffer = io.BytesIO()
    torch.save(state, buffer)   # not a path: torch's own writer, untouched
    with open(os.path.join(elsewhere, "buffer.pt"), "wb") as f:
        f.write(buffer.getvalue())
    for folder in (root, elsewhere):   # watched, then not
        torch.save(state, os.path.join(folder, "step-10.pt"))
        torch.save(state, os.path.join(folder, "legacy.pt"), _use_new_zipfile_serialization=False)
        save_file(tensors, os.path.join(folder, "model.safetensors"), metadata={"step": "10"})
    errors = []
    for folder in (root, elsewhere):   # names torch refuses: its own error, watched or not
        for bad in (".tmp-1", os.path.join("missing", "x.pt")):
            try:
                torch.save(state, os.path.join(folder, bad))
            except Exception as exc:
                errors.append(type(exc).__name__ + ": " + str(exc).replace(folder, "{dir}"))
    print(json.dumps({"seen": seen, "errors": errors}))
""")


def _records(path: Path) -> dict[str, bytes]:
    """The zip's records by name below its top folder (which torch names)."""
    with zipfile.ZipFile(path) as archive:
        return {name.partition("/")[2]: archive.read(name) for name in archive.namelist()}


def test_an_unkilled_save_writes_what_it_writes_without_the_watch(tmp_path):
    root, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    root.mkdir()
    elsewhere.mkdir()
    done = subprocess.run([sys.executable, "-c", SAME, str(root), str(elsewhere)],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    names = ["step-10.pt", "legacy.pt", "model.safetensors"]
    assert result["seen"] == [[op, n] for n in names for op in ("open", "write")] + [
        ["open", ".tmp-1"], ["open", "missing/x.pt"]]
    watched_errors, errors = result["errors"][:2], result["errors"][2:]
    assert watched_errors == errors and len(errors) == 2, errors
    assert all(e.startswith("RuntimeError: ") for e in errors), errors
    for name in ("legacy.pt", "model.safetensors"):
        assert (root / name).read_bytes() == (elsewhere / name).read_bytes(), name
    # torch names the zip's top folder after the path it opens ("step-10/"), and
    # "archive/" when it writes to a file object, as it does under the watch: those
    # bytes are a save to a buffer's, and every record is the same
    watched = (root / "step-10.pt").read_bytes()
    assert watched == (elsewhere / "buffer.pt").read_bytes()
    assert watched != (elsewhere / "step-10.pt").read_bytes()
    assert _records(root / "step-10.pt") == _records(elsewhere / "step-10.pt")
    assert zipfile.ZipFile(root / "step-10.pt").namelist()[0] == "archive/data.pkl"
    loaded = torch.load(root / "step-10.pt", weights_only=True)
    for key, value in torch.load(elsewhere / "step-10.pt", weights_only=True).items():
        same = torch.equal if isinstance(value, torch.Tensor) else (lambda a, b: a == b)
        assert same(loaded[key], value) and type(loaded[key]) is type(value), key


IN_PLACE = ROOT / "tests" / "scripts" / "save_in_place.py"


def test_a_job_overwriting_its_checkpoint_by_path_fails_the_mid_write_kill(chaos_run):
    """`torch.save(ckpt, "out/ckpt.pt")`, in place: killed in its 2nd save at the file's
    write event (1 open, 2 write), rank 0 leaves a torn checkpoint that the restart cannot
    read. Seen as one whole write, the kill left the finished file and this passed."""
    report = chaos_run(IN_PLACE, faults=["kill:rank=0,phase=checkpoint_save,save=2,event=2"],
                       args=["--steps", "12", "--ckpt-every", "4"], expect="fail",
                       max_restarts=1, max_relaunches=0)
    assert report.checks["atomic_recovery"]["ok"] is False, report.table()
    assert "resume failed on rank" in report.checks["atomic_recovery"]["detail"]
    history = History.of_run(Path(report.run_dir))
    [fault] = history.faults()
    hit = [e for e in history.of("file") if e["rank"] == 0 and e.get("save") == 2]
    assert [(e["op"], e["path"]) for e in hit] == [("open", "out/ckpt.pt"),
                                                    ("write", "out/ckpt.pt")], hit
    assert fault["step"] == 8

"""`torchchaos incident import` as a user meets it: what it prints and writes, and every
bad artefact refused in one line with exit 2 before anything is written."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from torchchaos.cli.main import main
from torchchaos.errors import UsageError
from torchchaos.incident.gather import gather
from torchchaos.scenario import files as scenario_file

DATA = Path(__file__).resolve().parents[1] / "data" / "incidents"
BUNDLED = Path(__file__).resolve().parents[2] / "targets" / "ddp_lm.py"


def test_import_writes_an_incident_file_replay_and_pytest_read(tmp_path, capsys):
    out = tmp_path / "raise.chaos.yaml"
    # the probe's own script (torchrun's summary names it): its steps are kept, and no
    # reference run is needed to place the fault
    code = main(["incident", "import", str(DATA / "raise"), "-o", str(out), "--script",
                 str(Path(__file__).resolve().parents[1] / "scripts" / "incident_probe.py"),
                 "--quiet"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "exception of rank 1 (other), between saves" in printed
    assert "why:" in printed and "launcher.log:" in printed
    assert "placed from its own steps (the same script)" in printed
    loaded = scenario_file.load(out)
    # the last step the log showed before the failure (the probe raised once its step 6
    # was done; `step=6` fires then too), of the type the traceback names
    assert [f.text for f in loaded.scenario.faults] == ["raise:rank=1,step=6,type=RuntimeError"]
    assert loaded.incident["signature"]["kind"] == "exception"
    assert loaded.expect.verdict == "pass"  # a test that fails until the bug is fixed


@pytest.mark.parametrize("name,content,why", [
    ("empty.log", b"", "empty"),
    ("blob.bin", bytes(range(256)) * 8, "binary, and no reader knows its format"),
    ("notes.txt", b"we restarted the job by hand on tuesday\n",
     "text, and no reader knows its format"),
    ("error.json", b'{"message": {"message": "RuntimeError: x", "extraInfo": {"py_ca',
     "cut off"),
    ("pod.json", b'{"kind": "Pod", "status": {"containerStatuses": 3}}',
     "status.containerStatuses is not a list"),
    ("sacct.txt", b"JobID|JobName|State|ExitCode\n42|train|NODE_FAIL\n", "cut off?"),
    ("report.html", b"<pre>RuntimeError: Connection closed by peer</pre>\n",
     "a page or a plot, not an artefact of the job"),
    ("fr_rank0", b"\x80\x04\x95" + b"entries pg_config" + b"\x00" * 20,
     "a flight-recorder pickle that does not load"),
])
def test_a_bad_artefact_is_one_line_and_exit_2_and_nothing_written(tmp_path, capsys, name,
                                                                     content, why):
    bad = tmp_path / name
    bad.write_bytes(content)
    out = tmp_path / "x.chaos.yaml"
    code = main(["incident", "import", str(bad), "-o", str(out), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2
    assert why in err and name in err, err
    assert "Traceback" not in err
    assert not out.exists()


def test_every_bad_file_of_a_folder_is_named_and_the_good_ones_do_not_hide_them(tmp_path,
                                                                               capsys):
    folder = tmp_path / "artefacts"
    shutil.copytree(DATA / "raise", folder)
    (folder / "torchrun" / "attempt_0" / "1" / "error.json").write_text('{"message": {"m')
    (folder / "pod.json").write_text('{"kind": "Pod", "status": []}')
    code = main(["incident", "import", str(folder), "-o", str(tmp_path / "x.yaml"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and "2 artefacts cannot be read" in err
    assert "error.json: cut off" in err and "pod.json:" in err
    assert not (tmp_path / "x.yaml").exists()


@pytest.mark.parametrize("argv,why", [
    (["incident", "import", "/no/such/folder"], "no such file or folder"),
    (["incident", "import", str(DATA / "kill"), "-o", "/no/such/dir/x.chaos.yaml"],
     "does not exist"),
    (["incident", "import", str(DATA / "kill"), "-o", "x.txt"], "is YAML"),
    (["incident", "import", str(DATA / "kill"), "--args", "'unclosed"], "--args"),
    (["incident", "import"], "the following arguments are required"),
    (["incident"], "incident needs a command"),
])
def test_wrong_command_lines_are_one_line_and_exit_2(argv, why, capsys, tmp_path):
    os.chdir(tmp_path)
    assert main(argv) == 2
    assert why in capsys.readouterr().err


def test_an_existing_output_file_is_never_replaced(tmp_path, capsys):
    out = tmp_path / "mine.chaos.yaml"
    out.write_text("my own notes\n")
    assert main(["incident", "import", str(DATA / "kill"), "-o", str(out)]) == 2
    assert "already exists" in capsys.readouterr().err
    assert out.read_text() == "my own notes\n"


def test_a_folder_with_nothing_readable_says_what_is_read(tmp_path):
    (tmp_path / "config.yaml").write_text("lr: 0.1\n")
    with pytest.raises(UsageError, match="nothing torchchaos can read"):
        gather([tmp_path])


# Every corpus file, cut, flipped or spliced: the import ends in observations or in a
# UsageError naming the file, never in another exception.
CORPUS = sorted(p for p in DATA.rglob("*") if p.is_file() and p.name != "expected.json")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_no_artefact_makes_the_import_fail_inside(tmp_path, data):
    source = data.draw(st.sampled_from(CORPUS))
    body = source.read_bytes()
    how = data.draw(st.sampled_from(["cut", "flip", "splice", "random"]))
    if how == "cut":
        body = body[:data.draw(st.integers(0, len(body)))]
    elif how == "flip" and body:
        at = data.draw(st.integers(0, len(body) - 1))
        body = body[:at] + bytes([body[at] ^ data.draw(st.integers(1, 255))]) + body[at + 1:]
    elif how == "splice":
        other = data.draw(st.sampled_from(CORPUS)).read_bytes()
        body = body[:len(body) // 2] + other[len(other) // 2:]
    else:
        body = data.draw(st.binary(max_size=4096))
    path = tmp_path / f"fuzz-{source.name}"
    path.write_bytes(body)
    try:
        from torchchaos.incident.attribute import attribute
        gathered = gather([path])
        attribute(gathered.observations, gathered.sources)
    except UsageError as exc:
        assert path.name in str(exc) or "nothing torchchaos" in str(exc)
    finally:
        path.unlink()


def test_the_command_line_never_shows_a_traceback_for_a_bad_artefact(tmp_path):
    bad = tmp_path / "error.json"
    bad.write_text('{"message": {"message": 1, "extraInfo": {"py_callstack": 2}}}')
    run = subprocess.run([sys.executable, "-m", "torchchaos.cli.main", "incident", "import",
                          str(bad), "-o", str(tmp_path / "x.yaml")], capture_output=True,
                         text=True)
    assert run.returncode == 2 and run.stderr.count("\n") == 2, run.stderr
    assert "Traceback" not in run.stderr


def test_a_large_binary_file_in_a_folder_is_passed_over_from_its_head(tmp_path):
    """A data set beside the logs (here 1 GiB, sparse) is shown to the readers by its first
    8 KiB, not read whole, and listed as passed over."""
    shutil.copytree(DATA / "kill", tmp_path / "job")
    with open(tmp_path / "job" / "tokens.npy", "wb") as f:
        f.truncate(1 << 30)
    found = gather([tmp_path / "job"])
    assert "job/tokens.npy" in found.passed_over


def _run_folder(tmp_path: Path, case: str) -> Path:
    """A run folder (`chaos/`) whose `_chaos/logs/` holds a harness corpus case's
    launcher log, as a replay leaves it; its `_chaos`."""
    chaos = tmp_path / "chaos" / "_chaos"
    (chaos / "logs").mkdir(parents=True)
    shutil.copy(DATA / "harness" / case / "launch-0-node-0.log", chaos / "logs")
    return chaos


def test_a_run_folder_is_read_as_the_job_left_it_not_as_the_harness_planned_it(tmp_path):
    """A replay is judged from its run folder. The harness's `_chaos/schedule.json` holds
    the injected faults' steps ("step": 12) and was read as a training log's step, which
    also cut the log's attempts wrong: the restart's exception was then taken for the
    first failure. Its empty stack dumps were read as launches that said nothing."""
    from torchchaos.scenario import schedule
    from torchchaos.scenario.spec import parse_fault_spec

    chaos = _run_folder(tmp_path, "exception_at_restart_load_plain_ddp")
    alone = gather([tmp_path / "chaos"]).observations
    specs = [parse_fault_spec("kill:rank=1,step=12"),
             parse_fault_spec("raise:rank=0,phase=checkpoint_load,event=1")]
    schedule.save(schedule.resolve(specs, seed=1, nproc=2, nodes=1), chaos / "schedule.json")
    (chaos / "stacks").mkdir()
    (chaos / "stacks" / "rank-0.pid-30839.txt").touch()
    assert gather([tmp_path / "chaos"]).observations == alone


def test_the_fault_filesystems_socket_and_shadow_copy_are_not_the_jobs(tmp_path,
                                                                        monkeypatch):
    """A power loss's replay leaves `_chaos/faultfs/<mount>/`: the daemon's control socket
    (whose read failed the whole import, so every such replay was judged as telling
    nothing) and the shadow copy of the files the job wrote."""
    import socket

    chaos = _run_folder(tmp_path, "quiet_peer")
    alone = gather([tmp_path / "chaos"]).observations
    mount = chaos / "faultfs" / "0-ckpt"
    (mount / "shadow" / "ckpt").mkdir(parents=True)
    (mount / "shadow" / "ckpt" / "step-0010.pt").write_bytes(b"PK\x03\x04 cut")
    (mount / "daemon.log").write_text("step 12: write ckpt/step-0010.pt\n")
    monkeypatch.chdir(mount)
    with socket.socket(socket.AF_UNIX) as control:
        control.bind("control.sock")  # relative: a socket path has a short limit
        assert gather([tmp_path / "chaos"]).observations == alone
        (tmp_path / "chaos" / "link.log").symlink_to(mount / "control.sock")
        assert gather([tmp_path / "chaos"]).observations == alone


def test_the_pages_and_plots_beside_a_runs_logs_are_not_read_again(tmp_path):
    """A replay's folder holds its report and timeline, which quote the lines of the logs
    they were drawn from: the collectives reader took a quoted 'Connection closed by
    peer' in report.html for a second peer's loss."""
    log = _run_folder(tmp_path, "quiet_peer") / "logs" / "launch-0-node-0.log"
    alone = gather([tmp_path / "chaos"]).observations
    quoted = "".join(f"<text>{line}</text>\n" for line in log.read_text().splitlines())
    (tmp_path / "chaos" / "report.html").write_text(f"<html><body>{quoted}</body></html>\n")
    (tmp_path / "chaos" / "timeline.svg").write_text(f"<svg>{quoted}</svg>\n")
    assert gather([tmp_path / "chaos"]).observations == alone


def test_a_log_no_reader_takes_is_a_launch_only_of_a_job_named_as_it_is(tmp_path):
    """A launcher's log that says nothing the readers take still counts as a launch, so
    a relaunch named as it is (launch-1-... after launch-0-...) that failed reading a bad
    checkpoint tells a node's death. Another log beside them (a build's) is no launch of
    the job: a job that failed at its start on a torn checkpoint (the real lines of
    `load/`'s restart) stays that exception, not a node's death."""
    from torchchaos.incident.attribute import attribute

    lines = (Path(__file__).resolve().parents[1] / "data" / "incidents" / "load" /
             "launcher.log").read_text().splitlines(keepends=True)
    (tmp_path / "launcher.log").write_text("".join(lines[26:]))  # from the restart on
    (tmp_path / "a_build.log").write_text("compiling the extension\ndone\n")
    found = attribute(gather([tmp_path]).observations).finding
    assert (found.kind, found.rank, found.phase) == ("exception", 0, "load"), found.rules

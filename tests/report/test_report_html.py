"""The HTML report, the timeline picture and the index page.

Built from hand-written histories judged by the real checkers (no torchrun),
plus one end-to-end run that reuses the session's reference cache.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from conftest import REPO, TARGET
from histories import Timeline, evidence, fp, reference

from torchchaos.cli import main as cli
from torchchaos.judge import interval
from torchchaos.judge.checks_by_name import run_checks
from torchchaos.report import html_report, timeline
from torchchaos.report.report_file import Report
from torchchaos.rundir.history import History
from torchchaos.rundir.layout import RunLayout

SVG = "{http://www.w3.org/2000/svg}"
FAULT = "kill:rank=1,step=12"
CHECK_NAMES = ("completes", "atomic_recovery", "deterministic_resume", "bounded_lost_work",
               "durable_checkpoints", "sdc_detected", "hang_detected", "no_split_brain",
               "no_orphans")


def chaos_run(ranks: int = 2, diverge_at: int | None = None) -> History:
    """Rank 1 is killed after step 12; the restart resumes from the checkpoint after
    step 10 and goes on to step 20. Launch and process start-up take long quiet
    stretches, as they do in a real run. `diverge_at`: rank 1's optimizer state is wrong
    from that step of the restart on (a resume bug)."""
    tl = Timeline()
    tl.add("launch", source="harness", launch=0, pids=[99])
    for attempt, steps, restored in ((0, range(1, 13), 0), (1, range(11, 21), 10)):
        tl.t += 30.0  # imports and rendezvous
        for rank in range(ranks):
            tl.add("boot", **tl.proc(rank, 0, attempt))
            if attempt:
                tl.add("load", path="ckpt/step-000010.pt", **tl.proc(rank, 0, attempt))
            tl.add("restore", restored=restored, match="exact", loads=attempt,
                   **tl.proc(rank, 0, attempt))
        for step in steps:
            for rank in range(ranks):
                wrong = attempt and diverge_at is not None and rank == 1 and step >= diverge_at
                prints = fp(step, optim_start="bad", optim="bad", params="bad") if wrong \
                    else fp(step)
                tl.add("step", step=step, local=step, loss=1.0, fp=prints,
                       **tl.proc(rank, 0, attempt))
            if step % 5 == 0:
                tl.add("save_begin", save=step // 5, after_step=step, **tl.proc(0, 0, attempt))
                tl.t -= 0.5  # the save takes half a second (add() moves on by one)
                tl.add("save_end", save=step // 5, last_step=step, **tl.proc(0, 0, attempt))
            if attempt == 0 and step == 12:
                tl.fault(1, 12)
        for rank in range(ranks):
            tl.add("rank_exit", source="harness", rank=rank, pid=tl.proc(rank, 0, attempt)["pid"],
                   launch=0, attempt=attempt)
    tl.add("job_exit", source="harness", launch=0, codes=[0], stopped=False)
    return tl.history()


def judged(history: History, out: Path, ranks: int = 2) -> tuple[Report, list]:
    """The report the engine would write for this history (without running anything)."""
    ev = evidence(history, reference(20, ranks))
    checks = run_checks(ev)
    faults = [{"id": "f0-kill", "kind": "kill", "target_type": "rank", "index": 1,
               "trigger": {"step": 12, "phase": None, "event": 1, "save": 1, "time": None,
                           "p": None},
               "params": {}, "spec": FAULT, "seed": 1, "fired": True, "fired_step": 12}]
    report = Report.from_checks(checks, faults=faults, restarts=len(ev.recoveries),
                                run_dir=str(out / "chaos"), reference_dir="/refs/run-0",
                                replay=str(out / "replay.yaml"),
                                checkpoint=interval.advice(ev, 3.0))
    return report, ev.recoveries


def write_page(tmp_path: Path, history: History, ranks: int = 2) -> tuple[Report, str, ET.Element]:
    report, recoveries = judged(history, tmp_path, ranks)
    page = html_report.write_run(report, tmp_path, history, recoveries)
    svg = ET.parse(tmp_path / "timeline.svg").getroot()
    return report, page.read_text(), svg


def groups(svg: ET.Element, cls: str) -> list[ET.Element]:
    return [g for g in svg.iter(f"{SVG}g") if g.get("class") == cls]


def tip(element: ET.Element) -> str:
    title = element.find(f"{SVG}title")
    return "" if title is None else title.text or ""


def lane_span(svg: ET.Element, rank: int) -> tuple[float, float]:
    lane = next(g for g in groups(svg, "lane") if g.get("data-rank") == str(rank))
    rect = lane.find(f"{SVG}rect")
    assert rect is not None
    top = float(rect.get("y", 0))
    return top, top + float(rect.get("height", 0))


def centre_y(marker: ET.Element) -> float:
    shape = marker.find(f"{SVG}circle")
    assert shape is not None, "the marker is drawn as a circle"
    return float(shape.get("cy", 0))


def test_a_passing_run_page_shows_verdict_checks_fault_replay_and_interval(tmp_path):
    report, page, _ = write_page(tmp_path, chaos_run())
    assert report.verdict == "pass"
    assert '<div class="verdict v-pass"><div class="big">PASS</div>' in page
    for name in CHECK_NAMES:
        assert f"<code>{name}</code>" in page
    assert page.count('class="mark ok-true">PASS<') == 5  # the checks that held
    assert f"<code>{FAULT}</code>" in page and "step 12" in page
    assert f"torchchaos replay {tmp_path}/replay.yaml" in page
    assert str(tmp_path / "chaos") in page and "/refs/run-0" in page
    assert "lost steps: <b>2</b>" in page and "MTTR" in page and "ETTR" in page
    # Young/Daly: the chaos run's saves took 0.5 s, the target saves every 5 steps
    assert report.checkpoint is not None and report.checkpoint["interval_steps"] == 5
    assert report.checkpoint["cost_seconds"] == pytest.approx(0.5)
    assert "saves every <b>5 steps</b>" in page and "Young/Daly" in page
    assert f"{interval.format_seconds(report.checkpoint['young_daly_seconds'])}" in page
    # self-contained: the picture inline, nothing fetched, no script
    assert "<svg" in page and "<script" not in page and "src=" not in page
    assert "https://" not in page and "http://" not in page.replace(
        'xmlns="http://www.w3.org/2000/svg"', "")


def test_a_failing_run_page_names_the_failed_check_and_marks_the_divergence(tmp_path):
    report, page, svg = write_page(tmp_path, chaos_run(diverge_at=11))
    assert report.verdict == "fail"
    assert '<div class="verdict v-fail"><div class="big">FAIL</div>' in page
    assert "deterministic_resume failed: diverged from the reference at step 11" in page
    assert ('<tr class="failed"><td><code>deterministic_resume</code></td>'
            '<td class="mark ok-false">FAIL</td>') in page
    [ring] = groups(svg, "divergence")
    assert "step 11 on rank 1" in tip(ring)
    # the timeline names the cause the verdict names, in its words, not a component's
    cause = report.checks["deterministic_resume"]["cause"]
    assert cause and cause in report.checks["deterministic_resume"]["detail"]
    assert f"({cause})" in tip(ring) and "differs)" not in tip(ring)
    top, bottom = lane_span(svg, 1)
    assert top < centre_y(ring) < bottom, "the divergence is marked on rank 1's lane"
    # the redone step 11 (after the restart), not the first one, diverged
    restart = float(groups(svg, "restart")[0].find(f"{SVG}line").get("x1"))
    assert float(ring.find(f"{SVG}circle").get("cx")) > restart


@pytest.mark.parametrize("ranks", [2, 4])
def test_the_timeline_is_an_svg_with_one_lane_per_rank_and_the_fault(tmp_path, ranks):
    _, _, svg = write_page(tmp_path, chaos_run(ranks), ranks)
    assert svg.tag == f"{SVG}svg"
    width, height = float(svg.get("width")), float(svg.get("height"))
    assert 1000 <= width <= 1200 and height > 100
    assert svg.get("viewBox") == f"0 0 {svg.get('width')} {svg.get('height')}"
    lanes = groups(svg, "lane")
    assert [g.get("data-rank") for g in lanes] == [str(r) for r in range(ranks)]
    labels = [t.text for g in lanes for t in g.iter(f"{SVG}text")]
    assert labels == [f"rank {r}" for r in range(ranks)]
    [fault] = groups(svg, "fault")
    assert FAULT in tip(fault)
    top, bottom = lane_span(svg, 1)
    assert top < centre_y(fault) < bottom, "the fault is marked on the killed rank's lane"
    assert len(groups(svg, "restart")) == 1 and len(groups(svg, "launch")) == 1
    assert len(groups(svg, "commit")) == 4  # saves after steps 5 and 10, then 15 and 20
    steps = groups(svg, "step")
    assert len(steps) == ranks * (12 + 10)  # every step of both attempts, on every lane


def test_the_time_a_failure_cost_is_shaded_from_the_same_recovery_the_check_judged(tmp_path):
    report, _, svg = write_page(tmp_path, chaos_run())
    [redo] = groups(svg, "redo")
    [down] = groups(svg, "down")
    assert report.lost_steps == [2]
    assert "redoing steps 10..12: 2 step(s) lost" in tip(redo)
    x = {name: float(g.find(f"{SVG}rect").get("x")) for name, g in (("redo", redo),
                                                                    ("down", down))}
    fault_x = float(groups(svg, "fault")[0].find(f"{SVG}circle").get("cx"))
    restart_x = float(groups(svg, "restart")[0].find(f"{SVG}line").get("x1"))
    assert x["down"] == pytest.approx(fault_x, abs=0.2)  # down from the failure...
    assert x["redo"] > restart_x  # ...then redoing steps after the restart


def test_long_quiet_stretches_are_cut_short_and_the_axis_stays_in_order():
    steps = [100 + 0.1 * i for i in range(20)]
    axis = timeline.build_axis([0.0, *steps, 300.0], [0.1] * 19, 80, 1100)
    assert len(axis.breaks) == 2
    xs = [axis.x(t) for t in [0.0, 50.0, *steps, 200.0, 300.0]]
    assert xs == sorted(xs) and xs[0] == 80 and axis.right == pytest.approx(1100)
    assert axis.x(steps[-1]) - axis.x(steps[0]) > 500, "the steps get most of the width"
    linear = timeline.build_axis([0.0, 1.0, 2.0, 3.0], [1.0, 1.0], 80, 1100)
    assert linear.breaks == [] and linear.x(1.5) == pytest.approx(590)


def test_labels_that_would_overlap_go_to_separate_rows():
    notes = [timeline.Note(100, "kill:rank=1,step=12", "red"),
             timeline.Note(110, "restart 1", "black"), timeline.Note(600, "redo 2", "orange")]
    placed = timeline.place_notes(notes, 1100)
    assert [n.row for n in placed] == [0, 1, 0]


def test_an_empty_history_still_draws_a_valid_picture():
    root = ET.fromstring(timeline.render(History(), [], title="nothing"))
    assert root.tag == f"{SVG}svg" and root.get("viewBox")


def test_text_from_the_run_cannot_break_the_picture():
    history = chaos_run()
    history.events.append({"ev": "exception", "t": history.events[-1]["t"], "rank": 0,
                           "pid": 1000, "launch": 0, "attempt": 1, "type": "RuntimeError",
                           "message": "\x1b[31mboom <&> \"quoted\"\x1b[0m"})
    root = ET.fromstring(timeline.render(history, [], title="a <title> & more"))
    [raised] = [g for g in root.iter(f"{SVG}g") if g.get("class") == "exception"]
    assert 'boom <&> "quoted"' in tip(raised)


def test_the_table_has_a_checkpoint_line_and_report_json_the_field(tmp_path):
    report, _ = judged(chaos_run(), tmp_path)
    assert "Young/Daly at MTBF 3 h recommends every" in report.table()
    report.write(tmp_path)
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["checkpoint"]["interval_steps"] == 5 and data["checkpoint"]["saves"] == 4
    assert Report.read(tmp_path / "report.json").checkpoint == data["checkpoint"]


def _save_run(out: Path, history: History) -> None:
    """A finished run directory: report.json and the chaos run's history streams."""
    report, _ = judged(history, out)
    out.mkdir()
    report.write(out)
    streams = RunLayout(out / "chaos").history_dir
    streams.mkdir(parents=True)
    for event in history.events:
        name = "harness" if event.get("source") == "harness" else f"rank-{event['rank']}"
        with open(streams / f"{name}.jsonl", "a") as f:
            f.write(json.dumps(event) + "\n")


def test_report_command_rewrites_the_page_while_the_run_dir_is_there(tmp_path, capsys):
    out = tmp_path / "out"
    _save_run(out, chaos_run(diverge_at=11))
    assert cli.main(["report", str(out)]) == 1
    printed = capsys.readouterr().out
    assert "deterministic_resume" in printed and f"report: {out / 'report.html'}" in printed
    assert "FAIL" in (out / "report.html").read_text()
    assert groups(ET.parse(out / "timeline.svg").getroot(), "divergence")
    for name in ("report.html", "timeline.svg"):
        (out / name).unlink()
    (out / "chaos" / "_chaos" / "history").rename(tmp_path / "moved")
    (out / "chaos" / "_chaos").rmdir()
    (out / "chaos").rmdir()
    assert cli.main(["report", str(out)]) == 1
    assert "run directory is gone" in capsys.readouterr().out
    assert not (out / "report.html").exists()


def test_the_index_lists_every_run_with_its_verdict_and_a_link(tmp_path):
    passing, _ = judged(chaos_run(), tmp_path)
    failing, _ = judged(chaos_run(diverge_at=11), tmp_path)
    for number in (1, 2):
        (tmp_path / f"{number:02d}").mkdir()
        (tmp_path / f"{number:02d}" / "report.html").write_text("<html></html>")
    path = html_report.write_index(tmp_path, [("01", "kill rank 1", FAULT, passing),
                                              ("02", "kill rank 1 again", FAULT, failing),
                                              ("03", "kill node 0", "kill:node=0,step=12",
                                               None)],
                                   "torchchaos battery")
    page = path.read_text()
    assert path == tmp_path / "index.html" and "<h1>torchchaos battery</h1>" in page
    assert "3 run(s): <b>1 pass, 1 fail, 1 error</b>" in page
    assert '<a href="01/report.html">' in page and '<a href="02/report.html">' in page
    assert "03/report.html" not in page  # that run could not be judged: no page
    rows = page.split("<tr")[2:]  # grouped by cause, what did not pass first
    assert 'class="cause"' in rows[0] and "FAIL: deterministic_resume" in rows[0]
    assert ">FAIL<" in rows[1] and "kill rank 1 again" in rows[1]
    assert "ERROR: could not judge" in rows[2] and "kill:node=0,step=12" in rows[3]
    assert "PASS: every check passed" in rows[4] and ">PASS<" in rows[5]


def test_runs_that_fail_for_one_cause_are_listed_under_it_once(tmp_path):
    failing, _ = judged(chaos_run(diverge_at=11), tmp_path)
    page = html_report.write_index(
        tmp_path, [(f"{n:02d}", f"kill rank 1 run {n}", FAULT, failing) for n in (1, 2, 3)],
        "torchchaos battery").read_text()
    assert page.count("deterministic_resume:") == 1 and "(3 runs)" in page
    assert page.count(">FAIL<") == 3


def test_a_real_run_writes_the_page_and_the_picture(tmp_path, shared_cache):
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, "-m", "torchchaos.cli", "run", "--quiet", "--out", str(out), "--cache-dir",
         str(shared_cache), "--mtbf", "6", "--fault", FAULT, "--", str(TARGET), "--steps", "20",
         "--ckpt-every", "5"], capture_output=True, text=True, cwd=tmp_path, timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"report: {out / 'report.html'}" in result.stdout
    assert "Young/Daly at MTBF 6 h" in result.stdout
    page = (out / "report.html").read_text()
    assert ">PASS<" in page and f"torchchaos replay {out}/replay.yaml" in page
    svg = ET.parse(out / "timeline.svg").getroot()
    assert svg.tag == f"{SVG}svg"
    assert [g.get("data-rank") for g in groups(svg, "lane")] == ["0", "1"]
    assert FAULT in tip(groups(svg, "fault")[0]) and len(groups(svg, "restart")) == 1
    assert len(groups(svg, "redo")) == 1 and len(groups(svg, "commit")) >= 3
    report = json.loads((out / "report.json").read_text())
    checkpoint = report["checkpoint"]
    assert checkpoint["interval_steps"] == 5 and checkpoint["mtbf_hours"] == 6.0
    assert checkpoint["cost_seconds"] > 0 and checkpoint["young_daly_steps"] >= 1
    # the report.json contract and `torchchaos report` (this is the CLI's one plain run)
    assert report["verdict"] == "pass"
    assert set(report["checks"]) == {"completes", "atomic_recovery", "deterministic_resume",
                                     "bounded_lost_work", "durable_checkpoints", "sdc_detected",
                                     "hang_detected", "no_split_brain", "no_orphans"}
    assert report["faults"][0]["spec"] == FAULT and report["restarts"] == 1
    assert report["lost_steps"] == [2]
    again = subprocess.run([sys.executable, "-m", "torchchaos.cli", "report", str(out)],
                           capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert again.returncode == 0 and "verdict: PASS" in again.stdout


def test_the_progress_bar_of_a_long_sweep_estimates_what_is_left():
    from torchchaos.explore.runs import progress_bar, row_kind, time_left
    from torchchaos.scenario.spec import Spec

    assert progress_bar(2, 5, 60.0, 90.0) == "[########------------] 40% 1m00s, about 1m30s left"
    assert progress_bar(5, 5, 301.0, 0.0).startswith("[####################] 100% 5m01s")
    assert progress_bar(1, 3, 9.6, 19.2, width=6) == "[##----] 33% 10s, about 19s left"
    # from what the finished rows of each kind cost; a kind not seen yet at the dearest's
    kill, torn = row_kind(Spec.read("kill:rank=0,step=12")), row_kind(
        Spec.read("storage:mode=torn,rank=0,phase=checkpoint_save,save=2,event=7"))
    assert kill == "kill" and torn == "storage in a save"
    costs = {kill: [10.0, 12.0], "kill in a save": [30.0]}
    assert time_left(costs, [kill, torn, torn]) == 11.0 + 30.0 + 30.0
    assert time_left(costs, [kill, kill], jobs=2) == 11.0
    assert time_left({}, [kill]) == 0.0


def test_the_failing_check_that_names_the_cause_leads_everywhere(tmp_path):
    """A power loss that emptied a finished checkpoint fails durable_checkpoints (the
    cause) and completes (the resume died): the banner, the table's cause line, the
    JUnit message and the battery's details lead with durability, not table order."""
    checks = {"completes": {"ok": False, "detail": "job failed at step 10 of 30"},
              "atomic_recovery": {"ok": True, "detail": "fine"},
              "durable_checkpoints": {"ok": False, "detail": "ckpt.pt lost: fsync it"},
              "no_orphans": {"ok": True, "detail": "nothing survived"}}
    report = Report(verdict="fail", checks=checks)
    assert report.failing() == ["durable_checkpoints", "completes"]
    assert "cause: durable_checkpoints: ckpt.pt lost: fsync it" in report.table()
    assert html_report._why(report).startswith(
        "durable_checkpoints, completes failed: ckpt.pt lost")
    assert Report(verdict="pass", checks={"completes": checks["atomic_recovery"]}).cause() == ""


def test_a_log_line_is_shortened_between_words():
    from torchchaos.harness.runner import _shorten

    line = "RuntimeError: " + " ".join(["PytorchStreamReader failed reading zip archive"] * 9)
    short = _shorten(line, 100)
    assert len(short) <= 100 and short.endswith("…")
    assert short[:-1] == line[:len(short) - 1] and line[len(short) - 1] == " "

"""The HTML report: one page per run a person can read in ten seconds, and an index.

`report.html` puts the verdict first, then why (the check table), then the
timeline picture, then the numbers and how to reproduce. Everything is in the
one file (inline CSS, the SVG inlined too, no script, no network), so it can
be attached to a CI job or an incident ticket and opened anywhere. The
picture is also written on its own as `timeline.svg`.

`index.html` lists the runs of a battery, a crash-point sweep or a campaign,
each linked to its own page.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from html import escape
from pathlib import Path
from typing import Any

from torchchaos.judge import interval
from torchchaos.judge.evidence import Evidence, Recovery
from torchchaos.report import timeline
from torchchaos.report.report_file import MARK, Report
from torchchaos.rundir.history import History

HTML_FILE = "report.html"
SVG_FILE = "timeline.svg"
INDEX_FILE = "index.html"
REPLAY_FILE = "replay.yaml"  # written by the engine next to report.json

CSS = """
body{font:15px/1.45 system-ui,-apple-system,"Segoe UI",Helvetica,Arial,sans-serif;
 color:#0f172a;margin:0 auto;max-width:1180px;padding:18px 24px 48px}
h1{font-size:20px;margin:0 0 6px}h2{font-size:17px;margin:28px 0 8px}
.verdict{border-radius:10px;padding:16px 22px;color:#fff;margin:8px 0 10px}
.verdict .big{font-size:44px;font-weight:800;letter-spacing:2px;line-height:1}
.verdict .why{font-size:16px;margin-top:6px}
.v-pass{background:#15803d}.v-fail{background:#b91c1c}.v-error{background:#b45309}
.facts{display:flex;flex-wrap:wrap;gap:8px 22px;margin:6px 0 0;padding:0;list-style:none}
.facts b{font-variant-numeric:tabular-nums}
table{border-collapse:collapse;width:100%;font-size:14px}
th,td{text-align:left;padding:5px 10px;border-bottom:1px solid #e2e8f0;vertical-align:top}
th{background:#f1f5f9;font-weight:600}
td.mark{font-family:ui-monospace,Menlo,Consolas,monospace;font-weight:700;white-space:nowrap}
.ok-true{color:#15803d}.ok-false{color:#b91c1c}.ok-none{color:#94a3b8}
tr.failed{background:#fef2f2}
code,pre{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:13px}
pre{background:#0f172a;color:#e2e8f0;padding:10px 14px;border-radius:6px;overflow-x:auto;
 white-space:pre-wrap;word-break:break-all}
.timeline{overflow-x:auto;border:1px solid #e2e8f0;border-radius:6px}
.timeline svg{display:block;max-width:100%;height:auto}
.muted{color:#64748b}dl{display:grid;grid-template-columns:max-content 1fr;gap:4px 16px}
dt{color:#64748b}dd{margin:0;word-break:break-all}
"""


def _page(title: str, body: str) -> str:
    return (f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{escape(title)}</title><style>{CSS}</style></head>\n<body>\n{body}\n"
            "</body></html>\n")


# -- what the page needs from the run ----------------------------------------------------

def evidence_of(history: History, reference: History | None = None) -> Evidence:
    """Evidence with only the histories, for `torchchaos report DIR`: what the page
    derives again (recoveries, the checkpoint interval) depends on nothing else."""
    return Evidence(chaos=history, reference=reference or History(), completed=False,
                    deadline_hit=False, exit_codes=[], wall_seconds=0.0,
                    reference_wall_seconds=0.0)


def _measure_again(report: Report, history: History) -> dict[str, Any] | None:
    """The checkpoint numbers for a report.json older than its `checkpoint` field."""
    reference = Path(report.reference_dir) if report.reference_dir else None
    ref = History.of_run(reference) if reference and reference.is_dir() else None
    return interval.advice(evidence_of(history, ref))


def divergence_of(report: Report) -> timeline.Divergence | None:
    """The first step that differs from the reference, as a checker named it."""
    resume = report.checks.get("deterministic_resume", {})
    if resume.get("divergent_step") is not None:
        return timeline.Divergence(resume["divergent_step"], resume.get("rank", 0),
                                   resume.get("cause")  # the verdict's own words
                                   or f"{resume.get('component', 'state')} differs")
    sdc = report.checks.get("sdc_detected", {})
    ranks = sdc.get("reference_divergent_ranks") or [0]
    if sdc.get("reference_divergent_step") is not None:
        return timeline.Divergence(sdc["reference_divergent_step"], ranks[0], "bit flip spread")
    return None


def run_dir_of(report: Report, out_dir: Path) -> Path | None:
    """The chaos run's directory, if it still exists (where report.json says, or beside it)."""
    for candidate in (Path(report.run_dir) if report.run_dir else None, out_dir / "chaos"):
        if candidate is not None and candidate.is_dir():
            return candidate
    return None


def write_run(report: Report, out_dir: Path, history: History | None = None,
              recoveries: list[Recovery] | None = None) -> Path:
    """Write out_dir/report.html and out_dir/timeline.svg (when the run's history is
    there to draw); returns the HTML's path."""
    if history is None and (run_dir := run_dir_of(report, out_dir)) is not None:
        history = History.of_run(run_dir)
    svg = ""
    if history is not None and history.events:
        if recoveries is None:
            recoveries = evidence_of(history).recoveries
        if report.checkpoint is None:
            report = dataclasses.replace(report, checkpoint=_measure_again(report, history))
        svg = timeline.render(history, recoveries, divergence_of(report),
                              title=f"{_headline(report)}: {_fault_list(report)}")
        (out_dir / SVG_FILE).write_text(svg)
    path = out_dir / HTML_FILE
    path.write_text(render_run(report, out_dir, svg))
    return path


# -- the run page -------------------------------------------------------------------------

def _headline(report: Report) -> str:
    return report.verdict.upper()


def _fault_list(report: Report) -> str:
    return ", ".join(f["spec"] for f in report.faults) or "no faults"


def _why(report: Report) -> str:
    if report.verdict == "error":
        return f"could not judge: {report.reason}"
    failed = report.failing()
    if failed:
        first = report.checks[failed[0]]["detail"]
        return f"{', '.join(failed)} failed: {first}"
    held = sum(1 for c in report.checks.values() if c.get("ok"))
    return f"{held} check(s) held, none failed"


def _num(value: float | None, unit: str = " s", digits: int = 2) -> str:
    return "?" if value is None else f"{value:.{digits}f}{unit}"


def _facts(report: Report) -> str:
    items = [("faults", _fault_list(report)), ("restarts", str(report.restarts))]
    if report.lost_steps:
        items.append(("lost steps", ", ".join("?" if s is None else str(s)
                                              for s in report.lost_steps)))
        items.append(("seconds lost", ", ".join(_num(s) for s in report.seconds_lost)))
        items.append(("MTTR", ", ".join(_num(s) for s in report.mttr)))
    if report.ettr is not None:
        items.append(("ETTR", f"{report.ettr:.2f}"))
    items.append(("wall time", _num(report.wall_seconds, " s", 1)))
    return '<ul class="facts">' + "".join(f"<li>{k}: <b>{escape(v)}</b></li>"
                                          for k, v in items) + "</ul>"


def _checks_table(report: Report) -> str:
    rows = []
    for name, check in report.checks.items():
        ok = check.get("ok")
        key = {True: "true", False: "false", None: "none"}[ok]
        rows.append(f'<tr class="{"failed" if ok is False else ""}"><td><code>{escape(name)}'
                    f'</code></td><td class="mark ok-{key}">{MARK[ok]}</td>'
                    f"<td>{escape(str(check.get('detail', '')))}</td></tr>")
    return ("<table><thead><tr><th>check</th><th>verdict</th><th>detail</th></tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table>")


def _trigger(trigger: dict[str, Any]) -> str:
    if trigger.get("step") is not None:
        return f"step {trigger['step']}"
    if trigger.get("phase"):
        return (f"{trigger['phase']}, file event {trigger.get('event')} of save"
                f" {trigger.get('save')}")
    if trigger.get("time") is not None:
        return f"{trigger['time']} s after the start"
    if trigger.get("p") is not None:
        return f"p={trigger['p']} per step"
    return "?"


def _faults_table(report: Report) -> str:
    if not report.faults:
        return '<p class="muted">No faults were injected.</p>'
    rows = []
    for f in report.faults:
        params = ", ".join(f"{k}={v}" for k, v in (f.get("params") or {}).items()) or "-"
        fired = (f"yes, at step {f.get('fired_step')}" + (f": {f['did']}" if f.get("did") else "")
                 if f.get("fired") else "no" + (f": {f['error']}" if f.get("error") else ""))
        rows.append(f"<tr><td><code>{escape(f['spec'])}</code></td>"
                    f"<td>{escape(f.get('kind', ''))}</td>"
                    f"<td>{escape(str(f.get('target_type')))} {escape(str(f.get('index')))}</td>"
                    f"<td>{escape(_trigger(f.get('trigger') or {}))}</td>"
                    f"<td>{escape(params)}</td><td>{escape(fired)}</td></tr>")
    return ("<table><thead><tr><th>spec</th><th>kind</th><th>target (resolved)</th>"
            "<th>trigger</th><th>parameters</th><th>fired</th></tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table>")


def _recovery_table(report: Report) -> str:
    if not report.lost_steps:
        return '<p class="muted">No recovery happened, so no work was lost.</p>'
    rows = "".join(f"<tr><td>{i}</td><td>{'?' if s is None else s}</td><td>{_num(sec)}</td>"
                   f"<td>{_num(m)}</td></tr>"
                   for i, (s, sec, m) in enumerate(zip(report.lost_steps, report.seconds_lost,
                                                       report.mttr), 1))
    ettr = ("" if report.ettr is None else
            f"<p>ETTR (fault-free wall time / this run's wall time): <b>{report.ettr:.2f}</b>"
            " <span class=muted>(industry average about 0.90, best about 0.96)</span></p>")
    return ("<table><thead><tr><th>recovery</th><th>steps redone</th><th>seconds lost</th>"
            "<th>MTTR (failure to first step again)</th></tr></thead>"
            f"<tbody>{rows}</tbody></table>{ettr}")


def _checkpoint_section(data: dict[str, Any] | None) -> str:
    if not data:
        return '<p class="muted">No finished checkpoint save was seen: nothing to measure.</p>'
    fmt = interval.format_seconds
    step = data.get("step_seconds")
    parts = [f"A checkpoint save took <b>{fmt(data['cost_seconds'])}</b> on average"
             f" ({data['saves']} save(s) measured)"
             + (f"; a training step takes <b>{fmt(step)}</b>." if step else ".")]
    if data.get("interval_steps"):
        now = f"The target saves every <b>{data['interval_steps']} steps</b>"
        if data.get("interval_seconds"):
            now += f" (about {fmt(data['interval_seconds'])} of training)"
        if data.get("overhead_now") is not None:
            now += f": expected overhead <b>{100 * data['overhead_now']:.2f}%</b>"
        parts.append(now + ".")
    mtbf = data["mtbf_hours"] * 3600
    best = (f"Young/Daly at one failure every {data['mtbf_hours']:g} h: "
            f"&radic;(2 &times; {data['cost_seconds']:.4g} s &times; {mtbf:g} s) ="
            f" <b>{fmt(data['young_daly_seconds'])}</b>")
    if data.get("young_daly_steps"):
        best += f" &asymp; <b>every {data['young_daly_steps']} steps</b>"
    if data.get("overhead_young_daly") is not None:
        best += f", expected overhead {100 * data['overhead_young_daly']:.2f}%"
    parts.append(best + ".")
    return ("<p>" + " ".join(parts) + "</p><p class=muted>Overhead = checkpoint cost per"
            " interval plus half an interval redone per failure (C/T + T/2F). Large jobs see"
            " about one interruption every 3 hours; set another rate with --mtbf HOURS.</p>")


def _reproduce(report: Report, out_dir: Path) -> str:
    replay = report.replay or str(out_dir / REPLAY_FILE)
    items = [("run dir", report.run_dir), ("reference dir", report.reference_dir),
             ("report.json", str(out_dir / "report.json"))]
    if report.command:
        items.append(("command (node 0)", " ".join(report.command)))
    rows = "".join(f"<dt>{k}</dt><dd><code>{escape(v)}</code></dd>" for k, v in items if v)
    return (f"<pre>torchchaos replay {escape(replay)}</pre><dl>{rows}</dl>")


def render_run(report: Report, out_dir: Path, svg: str) -> str:
    """The page for one run; `svg` is the timeline ("" when the run dir is gone)."""
    picture = (f'<div class="timeline">{_strip_xml_header(svg)}</div><p class="muted">'
               f'Also as <a href="{SVG_FILE}">{SVG_FILE}</a>. Hover a marker for details.</p>'
               if svg else '<p class="muted">The run directory is gone; no timeline.</p>')
    body = "\n".join([
        f"<h1>torchchaos run <span class=muted>{escape(str(out_dir))}</span></h1>",
        f'<div class="verdict v-{escape(report.verdict)}"><div class="big">'
        f'{_headline(report)}</div><div class="why">{escape(_why(report))}</div></div>',
        _facts(report),
        "<h2>Checks</h2>", _checks_table(report),
        "<h2>Timeline</h2>", picture,
        "<h2>Faults (resolved schedule)</h2>", _faults_table(report),
        "<h2>Lost work</h2>", _recovery_table(report),
        "<h2>Checkpoint interval</h2>", _checkpoint_section(report.checkpoint),
        "<h2>Reproduce</h2>", _reproduce(report, out_dir),
    ])
    return _page(f"torchchaos {_headline(report)}: {_fault_list(report)}", body)


def _strip_xml_header(svg: str) -> str:
    return svg[svg.index("<svg"):] if "<svg" in svg else svg


# -- the index of a battery, sweep or campaign --------------------------------------------

def write_index(out_dir: Path, runs: Sequence[tuple[str, str, str, Report | None]],
                title: str) -> Path:
    """out_dir/index.html: the runs (their folder's name, their name, their fault, their
    report or None when it could not be judged) grouped by what they came to: runs that
    failed for the same cause under one heading that says it once (the rows that did not
    pass first); a run's page is FOLDER/report.html."""
    counts = {"pass": 0, "fail": 0, "error": 0}
    groups: dict[tuple[str, str], list[str]] = {}
    causes: dict[tuple[str, str], str] = {}
    for folder, name, fault, report in runs:
        verdict = report.verdict if report else "error"
        counts[verdict] = counts.get(verdict, 0) + 1
        cause = _cause(report)
        key = (verdict, re.sub(r"\d+", "#", cause))  # the same cause at another step
        causes.setdefault(key, cause)
        link = f"{folder}/{HTML_FILE}"
        page = (f'<a href="{link}">{link}</a>' if (out_dir / link).is_file()
                else '<span class="muted">none</span>')
        groups.setdefault(key, []).append(
            f'<tr class="{"failed" if verdict == "fail" else ""}"><td>{escape(folder)}</td>'
            f"<td>{escape(name)}</td><td><code>{escape(fault)}</code></td>"
            f'<td class="mark v-text-{verdict}">{verdict.upper()}</td><td>{page}</td></tr>')
    order = {"fail": 0, "error": 1, "pass": 2}
    rows = []
    for key in sorted(groups, key=lambda k: order.get(k[0], 1)):
        verdict, members = key[0], groups[key]
        like = f" ({len(members)} runs)" if len(members) > 1 else ""
        rows.append(f'<tr class="cause"><th colspan=5 class="v-text-{verdict}">'
                    f"{escape(verdict.upper())}: {escape(causes[key] or 'every check passed')}"
                    f"{escape(like)}</th></tr>")
        rows += members
    summary = ", ".join(f"{n} {v}" for v, n in counts.items() if n) or "no runs"
    body = (f"<h1>{escape(title)}</h1><p>{len(runs)} run(s): <b>{escape(summary)}</b>"
            f' <span class=muted>in {escape(str(out_dir))}</span></p>'
            "<table><thead><tr><th>#</th><th>run</th><th>fault</th><th>verdict</th>"
            "<th>report</th></tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table>")
    page_css = (".v-text-pass{color:#15803d}.v-text-fail{color:#b91c1c}"
                ".v-text-error{color:#b45309}tr.cause th{text-align:left;padding-top:1em}")
    path = out_dir / INDEX_FILE
    path.write_text(_page(title, f"<style>{page_css}</style>{body}"))
    return path


def _cause(report: Report | None) -> str:
    """What a run came to, in one line: its failing checks with their details, or why it
    could not be judged; "" for a pass."""
    if report is None:
        return "could not judge"
    failing = report.failing()
    return "; ".join(f"{n}: {report.checks[n]['detail']}" for n in failing) or (
        report.reason if report.verdict != "pass" else "")

"""The postmortem page: the incident as its artefacts told it, beside its replay.

Two columns: what the import read (the finding, each rank's last step, how it
ended and where it was, the rules and the lines they stand on) and what the
replay's own artefacts show read by the same rules, with the verdict on the
invariants and whether the signature was reproduced. Written next to the
replay's report.html (and its timeline.svg, linked) as postmortem.html.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from torchchaos.incident.signature import Signature


def write(out_dir: Path, name: str, incident: dict[str, Any], replay: Signature,
          replayed: dict[str, Any], differences: list[str], verdict: str,
          failing: list[str]) -> Path:
    """`incident`: the incident file's `incident:` mapping; `replayed`: the replay's
    artefacts read by the same rules (an Incident's `to_dict`, empty where they could not
    be read)."""
    want = Signature.from_dict(incident.get("signature", {}))
    left = _column("The incident (from its artefacts)", want, incident)
    right = _column("The replay (from its own artefacts)", replay, replayed)
    checks = ", ".join(failing) or "none"
    timeline = ' The steps, faults and restarts: <a href="timeline.svg">timeline.svg</a>.' \
        if (out_dir / "timeline.svg").exists() else ""
    body = f"""<!doctype html><meta charset="utf-8"><title>postmortem: {_e(name)}</title>
<style>body{{font:14px system-ui,sans-serif;margin:2em;max-width:80em}}
.cols{{display:grid;grid-template-columns:1fr 1fr;gap:2em}}
table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:.2em .5em;
text-align:left;vertical-align:top}}pre{{white-space:pre-wrap}}
.ok{{color:#176b2c}}.bad{{color:#a11}}</style>
<h1>Postmortem: {_e(name)}</h1>
{_outcome(differences, verdict)}
<p>Verdict on the invariants: <b>{_e(verdict.upper())}</b> (failing checks: {_e(checks)}).
The verdict table: <a href="report.html">report.html</a>.{timeline}</p>
<div class="cols">{left}{right}</div>
"""
    path = out_dir / "postmortem.html"
    path.write_text(body)
    return path


def _outcome(differences: list[str], verdict: str) -> str:
    """Reproduced, or how the replay differs. Not reproduced with every invariant holding
    is what a fixed script gives, so it is not shown as a failure."""
    if not differences:
        return '<p class="ok"><b>incident reproduced</b></p>'
    said = "incident not reproduced: differs in " + "; ".join(differences)
    if verdict == "pass":
        return (f'<p><b>{_e(said)}</b><br>Every invariant held: the job recovered'
                " from the replayed fault, as a script with the incident's bug fixed does.</p>")
    return f'<p class="bad"><b>{_e(said)}</b></p>'


def _column(title: str, sig: Signature, told: dict[str, Any]) -> str:
    finding = told.get("finding", {})
    job_step = (finding.get("step_window") or [None])[0]
    rows = "".join(_rank_row(rank, story, job_step) for rank, story in
                   sorted((told.get("ranks") or {}).items(), key=lambda kv: int(kv[0])))
    said = ([f"the job's last step before it: {job_step}"] if job_step is not None else []) \
        + list(finding.get("rules", []))
    if told.get("recovery"):
        said.append(f"the restart: {told['recovery']}")
    items = "".join(f"<li>{_e(line)}</li>" for line in said) + \
        "".join(f"<li>not known: {_e(u)}</li>" for u in told.get("unknowns", []))
    return f"""<section><h2>{_e(title)}</h2><p>{_e(sig.describe())}</p>
<table><tr><th>rank</th><th>last step</th><th>ended</th><th>error</th><th>where</th></tr>
{rows}</table><ul>{items or "<li>the artefacts told nothing</li>"}</ul></section>"""


def _rank_row(rank: str, story: dict[str, Any], job_step: int | None) -> str:
    # a log whose step lines name no rank tells the job's last step, not each rank's
    step = story.get("last_step")
    shown = step if step is not None else f"{job_step} (the job)" if job_step is not None \
        else "not known"
    cells = (rank, shown, story.get("end") or "not told", story.get("error", ""),
             story.get("frame", ""))
    return "<tr>" + "".join(f"<td>{_e(cell)}</td>" for cell in cells) + "</tr>"


def _e(value: object) -> str:
    return html.escape(str(value))

"""The postmortem page: the incident as its artefacts told it, beside its replay.

Two columns: what the import read (the finding, each rank's last step, how it
ended and where it was, the rules and the lines they stand on) and what the
replay's own artefacts show read by the same rules, with the verdict on the
invariants and whether the signature was reproduced. Written next to the
replay's report.html as postmortem.html.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from torchchaos.incident.signature import Signature


def write(out_dir: Path, name: str, incident: dict[str, Any], replay: Signature,
          replay_ranks: dict[str, Any], differences: list[str], verdict: str,
          failing: list[str]) -> Path:
    want = Signature.from_dict(incident.get("signature", {}))
    reproduced = "reproduced" if not differences else \
        "not reproduced: differs in " + "; ".join(differences)
    finding = incident.get("finding", {})
    lo = (finding.get("step_window") or [None])[0]
    window = [f"the job's last step before it: {lo}"] if lo is not None else []
    left = _column("The incident (from its artefacts)", want, incident.get("ranks", {}),
                   window + finding.get("rules", []), incident.get("unknowns", []))
    right = _column("The replay (from its own artefacts)", replay, replay_ranks, [], [])
    checks = ", ".join(failing) or "none"
    body = f"""<!doctype html><meta charset="utf-8"><title>postmortem: {_e(name)}</title>
<style>body{{font:14px system-ui,sans-serif;margin:2em;max-width:80em}}
.cols{{display:grid;grid-template-columns:1fr 1fr;gap:2em}}
table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:.2em .5em;
text-align:left;vertical-align:top}}pre{{white-space:pre-wrap}}
.ok{{color:#176b2c}}.bad{{color:#a11}}</style>
<h1>Postmortem: {_e(name)}</h1>
<p class="{'ok' if not differences else 'bad'}"><b>{_e(reproduced)}</b></p>
<p>Verdict on the invariants: <b>{_e(verdict.upper())}</b> (failing checks: {_e(checks)}).
The verdict table: <a href="report.html">report.html</a>.</p>
<div class="cols">{left}{right}</div>
"""
    path = out_dir / "postmortem.html"
    path.write_text(body)
    return path


def _column(title: str, sig: Signature, ranks: dict[str, Any], rules: list[str],
            unknowns: list[str]) -> str:
    rows = "".join(
        f"<tr><td>{_e(r)}</td><td>{_e(s.get('last_step', '?'))}</td><td>{_e(s.get('end', ''))}"
        f"</td><td>{_e(s.get('error', ''))}</td><td>{_e(s.get('frame', ''))}</td></tr>"
        for r, s in sorted(ranks.items(), key=lambda kv: int(kv[0])))
    extra = "".join(f"<li>{_e(rule)}</li>" for rule in rules)
    unknown = "".join(f"<li>not known: {_e(u)}</li>" for u in unknowns)
    return f"""<section><h2>{_e(title)}</h2><p>{_e(sig.describe())}</p>
<table><tr><th>rank</th><th>last step</th><th>ended</th><th>error</th><th>where</th></tr>
{rows}</table><ul>{extra}{unknown}</ul></section>"""


def _e(value: object) -> str:
    return html.escape(str(value))

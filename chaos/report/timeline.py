"""The timeline picture: what every rank did, and what the faults did to it, over time.

One lane per rank (plus one for the job as the harness saw it), seconds since
the chaos run began on the x axis. Steps are ticks, checkpoint saves blue,
restores green, faults red, restarts and launches vertical lines; the time a
failure cost is shaded (grey: the job was down; amber: it redid steps it had
already done) from the same `Recovery` records `bounded_lost_work` judges,
so the picture and the verdict never disagree. The divergence point found by
the checkers is ringed.

A real run spends most of its wall time starting processes (imports,
rendezvous) and very little training on a small target; drawn to scale, the
steps would be a smudge. Long quiet stretches are therefore cut short and
labelled with how long they really were; the rest of the axis is linear.

Plain string building, no dependency: the picture must render anywhere, as a
file or inlined into the HTML report.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import cache
from html import escape
from statistics import median

from torchchaos.faults.registry import loadable_kinds
from torchchaos.judge.evidence import Recovery
from torchchaos.rundir.history import Event, History

WIDTH = 1120
LEFT = 78  # lane labels
RIGHT = 24
BREAK_W = 46  # a quiet stretch cut short
MIN_SEGMENT_W = 16  # an instant of activity (a launch) still gets room
LANE_H = 42
JOB_LANE_H = 30
NOTE_ROW_H = 17
FONT = "DejaVu Sans, Helvetica, Arial, sans-serif"
CHAR_W = 6.3  # average width of an 11 px character, for label placement

COLORS = {
    "step": "#334155", "alive": "#e2e8f0", "save": "#2563eb", "restore": "#16a34a",
    "fault": "#dc2626", "down": "#64748b", "redo": "#f59e0b", "diverge": "#9333ea",
    "launch": "#0f172a", "detect": "#0891b2", "grid": "#cbd5e1", "text": "#0f172a",
    "muted": "#64748b",
}

# a white outline under a label keeps it readable over lines and hatching
HALO = ' paint-order="stroke" stroke="#ffffff" stroke-width="3" stroke-linejoin="round"'
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f]")
AXIS_IGNORES = ("reaped",)


@dataclass
class Divergence:
    """Where the chaos run first differs from the reference (from a checker's data)."""

    step: int
    rank: int
    what: str


# -- the x axis ----------------------------------------------------------------------------

@dataclass
class Axis:
    """Seconds (since the run began) -> x, linear except for quiet stretches cut short."""

    pieces: list[tuple[float, float, float, float]]  # (t0, t1, x0, x1), in order
    breaks: list[tuple[float, float, float, float]]  # the pieces that are cut short
    seconds_per_px: float

    def x(self, t: float) -> float:
        for t0, t1, x0, x1 in self.pieces:
            if t <= t1:
                if t <= t0 or t1 == t0:
                    return x0
                return x0 + (x1 - x0) * (t - t0) / (t1 - t0)
        return self.pieces[-1][3]

    @property
    def right(self) -> float:
        return self.pieces[-1][3]


def _quiet_threshold(times: list[float], step_gaps: list[float]) -> float:
    """A stretch without any event longer than this is cut short: many typical steps
    long, and never less than 1/40 of the run."""
    span = times[-1] - times[0]
    typical = median(step_gaps) if step_gaps else span / 50
    return max(8 * typical, span / 40, 1e-9)


def build_axis(times: list[float], step_gaps: list[float], left: float, right: float) -> Axis:
    times = sorted(set(times)) or [0.0]
    threshold = _quiet_threshold(times, step_gaps)
    gaps = [(a, b) for a, b in zip(times, times[1:]) if b - a > threshold]
    span = times[-1] - times[0]
    if sum(b - a for a, b in gaps) < 0.25 * span:
        gaps = []  # cutting would save little: draw everything to scale
    active, start = [], times[0]
    for a, b in gaps:
        active.append((start, a))
        start = b
    active.append((start, times[-1]))
    widths, scale = _active_widths(active, right - left - BREAK_W * len(gaps))
    pieces, breaks, x = [], [], left
    for i, (t0, t1) in enumerate(active):
        pieces.append((t0, t1, x, x + widths[i]))
        x += widths[i]
        if i < len(gaps):
            piece = (gaps[i][0], gaps[i][1], x, x + BREAK_W)
            pieces.append(piece)
            breaks.append(piece)
            x += BREAK_W
    return Axis(pieces, breaks, 1 / scale if scale else 1.0)


def _active_widths(active: list[tuple[float, float]], room: float) -> tuple[list[float], float]:
    """Share `room` pixels among the active stretches in proportion to their length, with
    a minimum width for each; returns the widths and the common pixels per second."""
    fixed: set[int] = set()
    scale = 0.0
    for _ in range(len(active) + 1):
        flexible = sum(t1 - t0 for i, (t0, t1) in enumerate(active) if i not in fixed)
        left = room - MIN_SEGMENT_W * len(fixed)
        scale = left / flexible if flexible > 0 else 0.0
        small = {i for i, (t0, t1) in enumerate(active)
                 if i not in fixed and (t1 - t0) * scale < MIN_SEGMENT_W}
        if not small:
            break
        fixed |= small
    widths = [MIN_SEGMENT_W if i in fixed else (t1 - t0) * scale
              for i, (t0, t1) in enumerate(active)]
    if scale == 0.0:  # every stretch is an instant: share the room equally
        widths = [room / len(active)] * len(active)
    return widths, scale


def _nice(value: float) -> float:
    """The 1-2-5 number at or above value (a tick spacing)."""
    if value <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= value)


def _fmt_t(t: float, step: float) -> str:
    digits = max(0, -math.floor(math.log10(step))) if step < 1 else 0
    return f"{t:.{digits}f}"


# -- notes above the lanes -----------------------------------------------------------------

@dataclass
class Note:
    """A label in the band above the lanes, with a leader line to what it names."""

    x: float
    text: str
    color: str
    rank: int | None = None  # whose lane the leader line reaches; None: the top lane
    row: int = -1
    left: float = 0.0

    @property
    def width(self) -> float:
        return len(self.text) * CHAR_W + 6


def place_notes(notes: list[Note], right: float, max_rows: int = 6) -> list[Note]:
    """Greedy rows: each label in the first row where it does not overlap another.
    A label that fits in no row is left out (its marker keeps the tooltip)."""
    ends: list[float] = []
    placed = []
    for note in sorted(notes, key=lambda n: n.x):
        note.left = note.x + 3 if note.x + 3 + note.width <= right else right - note.width
        row = next((r for r, end in enumerate(ends) if end + 8 <= note.left), len(ends))
        if row >= max_rows:
            continue
        if row == len(ends):
            ends.append(0.0)
        ends[row] = note.left + note.width
        note.row = row
        placed.append(note)
    return placed


# -- the picture ---------------------------------------------------------------------------

@dataclass
class Picture:
    history: History
    recoveries: list[Recovery]
    divergence: Divergence | None = None
    title: str = ""
    t0: float = 0.0
    axis: Axis = field(init=False)
    ranks: list[int] = field(init=False)
    notes: list[Note] = field(default_factory=list)
    layers: dict[str, list[str]] = field(default_factory=dict)
    job_lane_taken: list[tuple[float, float]] = field(default_factory=list)  # x ranges

    def __post_init__(self) -> None:
        events = self.history.events
        self.t0 = min((e["t"] for e in events), default=0.0)
        self.ranks = self.history.ranks()
        # The reaping after the job's end is bookkeeping, not worth axis room.
        times = [e["t"] - self.t0 for e in events if e["ev"] not in AXIS_IGNORES]
        self.axis = build_axis(times, _step_gaps(self.history), LEFT + 8, WIDTH - RIGHT - 8)
        self.layers = {k: [] for k in ("bands", "lanes", "spans", "lines", "ticks", "marks")}

    # geometry, fixed once the notes are placed
    def x(self, t: float) -> float:
        return self.axis.x(t - self.t0)

    def lane_y(self, rank: int) -> float:
        return self.lanes_top + JOB_LANE_H + self.ranks.index(rank) * LANE_H

    @property
    def lanes_top(self) -> float:
        rows = max((n.row for n in self.notes), default=-1) + 1
        return (34 if self.title else 12) + rows * NOTE_ROW_H + 8

    @property
    def lanes_bottom(self) -> float:
        return self.lanes_top + JOB_LANE_H + len(self.ranks) * LANE_H

    def add(self, layer: str, svg: str) -> None:
        self.layers[layer].append(svg)

    def note(self, t: float, text: str, color: str, rank: int | None = None) -> None:
        self.notes.append(Note(self.x(t), text, color, rank))


def _step_gaps(history: History) -> list[float]:
    by_pid: dict[object, list[float]] = {}
    for e in history.steps():
        by_pid.setdefault(e.get("pid"), []).append(e["t"])
    return [b - a for times in by_pid.values() for a, b in zip(times, times[1:])]


def _esc(text: str) -> str:
    """Escaped for XML; control characters (an exception's ANSI colours) are not
    allowed in an XML document at all, so they become "?"."""
    return escape(_CONTROL.sub("?", text))


def _title(text: str) -> str:
    return f"<title>{_esc(text)}</title>"


def _group(cls: str, body: str, tip: str = "") -> str:
    return f'<g class="{cls}">{_title(tip) if tip else ""}{body}</g>'


def render(history: History, recoveries: list[Recovery], divergence: Divergence | None = None,
           title: str = "") -> str:
    """The timeline of one chaos run as a standalone SVG document."""
    pic = Picture(history, recoveries, divergence, title)
    if not history.events:
        return _empty(title)
    _collect_notes(pic)
    pic.notes = place_notes(pic.notes, WIDTH - RIGHT)
    _draw_lanes(pic)
    _draw_job_events(pic)  # before the recoveries: their labels keep clear of it
    _draw_recoveries(pic)
    _draw_processes(pic)
    _draw_saves(pic)
    _draw_steps(pic)
    _draw_rank_events(pic)
    _draw_divergence(pic)
    return _assemble(pic)


def _empty(title: str) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="60"'
            f' viewBox="0 0 {WIDTH} 60" font-family="{FONT}"><text x="12" y="34"'
            f' font-size="13">{_esc(title)} (no events were recorded)</text></svg>')


# Notes are collected before anything is drawn: their rows decide where the lanes start.
def _collect_notes(pic: Picture) -> None:
    h = pic.history
    for e in h.of("launch"):
        pic.note(e["t"], f"launch {e.get('launch', 0)}", COLORS["launch"])
    for rec in pic.recoveries:
        if rec.attempt:  # a relaunch is already named by its launch event
            pic.note(rec.started, f"restart {rec.attempt}", COLORS["launch"])
    for e in h.of("fault"):
        pic.note(e["t"], f"{e.get('spec') or e.get('kind')}", COLORS["fault"], e.get("rank"))
    for e in h.of("nemesis_begin"):
        pic.note(e["t"], f"{e.get('kind', 'fault')} begins", COLORS["fault"])
    for e in h.of("hang"):
        pic.note(e["t"], f"hang: no progress {e.get('seconds', '?')} s", COLORS["fault"])
    for e in h.of("deadline"):
        pic.note(e["t"], "deadline", COLORS["fault"])
    detections: dict[tuple[object, object], Event] = {}
    for e in h.of("detection"):  # every rank may report the same finding: name it once
        detections.setdefault((e.get("what"), e.get("step")), e)
    for (what, step), e in detections.items():
        pic.note(e["t"], f"detected: {what} at step {step}", COLORS["detect"], e.get("rank"))
    for rec in pic.recoveries:
        if rec.lost_steps and rec.caught_up_at is not None and rec.first_step_at is not None:
            pic.note(rec.first_step_at, f"redo {rec.lost_steps} steps", "#b45309")
    if pic.divergence and (e := _divergent_event(pic)):
        pic.note(e["t"], f"diverges: step {pic.divergence.step} ({pic.divergence.what})",
                 COLORS["diverge"], pic.divergence.rank)


def _draw_lanes(pic: Picture) -> None:
    top = pic.lanes_top
    lanes = [("job", "job", top, JOB_LANE_H)]
    lanes += [(f"rank {r}", str(r), pic.lane_y(r), LANE_H) for r in pic.ranks]
    for i, (label, key, y, height) in enumerate(lanes):
        fill = "#f8fafc" if i % 2 else "#ffffff"
        cls = "job-lane" if key == "job" else "lane"
        data = "" if key == "job" else f' data-rank="{key}"'
        pic.add("lanes", f'<g class="{cls}"{data}><rect x="{LEFT}" y="{y:.1f}"'
                         f' width="{WIDTH - RIGHT - LEFT}" height="{height}" fill="{fill}"'
                         f' stroke="{COLORS["grid"]}" stroke-width="0.5"/>'
                         f'<text x="{LEFT - 8}" y="{y + height / 2 + 4:.1f}" text-anchor="end"'
                         f' font-size="12" fill="{COLORS["text"]}">{label}</text></g>')
    for t0, t1, x0, x1 in pic.axis.breaks:  # a quiet stretch cut short
        pic.add("bands", _group("break", f'<rect x="{x0:.1f}" y="{top:.1f}"'
                                         f' width="{x1 - x0:.1f}"'
                                         f' height="{pic.lanes_bottom - top:.1f}"'
                                         ' fill="url(#quiet)"/>',
                                f"{t1 - t0:.2f} s without events, cut short"))


def _band(pic: Picture, cls: str, t0: float, t1: float, fill: str, tip: str,
          top: float | None = None, bottom: float | None = None) -> None:
    x0, x1 = pic.x(t0), pic.x(t1)
    y0 = pic.lanes_top if top is None else top
    y1 = pic.lanes_bottom if bottom is None else bottom
    pic.add("bands", _group(cls, f'<rect x="{x0:.1f}" y="{y0:.1f}" width="{max(x1 - x0, 2):.1f}"'
                                 f' height="{y1 - y0:.1f}" fill="{fill}"/>', tip))


def _draw_recoveries(pic: Picture) -> None:
    """Downtime (failure -> first step again) and redone work (-> the failed step again):
    the intervals bounded_lost_work measures MTTR and seconds lost with."""
    for rec in pic.recoveries:
        back = rec.first_step_at
        if back is not None:
            _band(pic, "down", rec.failed_at, back, "url(#down)",
                  f"down {back - rec.failed_at:.2f} s: from the failure after step"
                  f" {rec.failed_step} to the first step of restart {rec.launch}.{rec.attempt}")
            _band_label(pic, rec.failed_at, back, f"down {back - rec.failed_at:.1f} s")
        if rec.lost_steps and back is not None and rec.caught_up_at is not None:
            _band(pic, "redo", back, rec.caught_up_at, COLORS["redo"] + "55",
                  f"redoing steps {rec.restored_step}..{rec.failed_step}: {rec.lost_steps}"
                  f" step(s) lost, {rec.caught_up_at - rec.failed_at:.2f} s lost in all")
        line = _vline(pic, rec.started, COLORS["launch"], dash="5 3")
        pic.add("lines", _group("restart", line, f"restart {rec.launch}.{rec.attempt}: new"
                                                 f" workers, resumed from step"
                                                 f" {rec.restored_step}"))


def _band_label(pic: Picture, t0: float, t1: float, text: str) -> None:
    """A band's length written inside it on the job lane, clear of what the job lane
    already shows (an exit code); left out where it does not fit."""
    x0, x1 = pic.x(t0) + 4, pic.x(t1) - 4
    width = len(text) * CHAR_W + 4
    starts = [(x0 + x1 - width) / 2, *(end + 6 for _, end in pic.job_lane_taken),
              *(start - 6 - width for start, _ in pic.job_lane_taken)]
    left = next((a for a in starts if x0 <= a and a + width <= x1 and not any(
        a < end and start < a + width for start, end in pic.job_lane_taken)), None)
    if left is None:
        return
    pic.job_lane_taken.append((left, left + width))
    y = pic.lanes_top + JOB_LANE_H / 2 + 4
    pic.add("marks", f'<text x="{left:.1f}" y="{y:.1f}" font-size="11"'
                     f' fill="{COLORS["down"]}" font-weight="bold"{HALO}>{_esc(text)}</text>')


def _vline(pic: Picture, t: float, color: str, dash: str = "", width: float = 1.2) -> str:
    x = pic.x(t)
    dashed = f' stroke-dasharray="{dash}"' if dash else ""
    return (f'<line x1="{x:.1f}" y1="{pic.lanes_top:.1f}" x2="{x:.1f}"'
            f' y2="{pic.lanes_bottom:.1f}" stroke="{color}" stroke-width="{width}"{dashed}/>')


def _processes(history: History) -> dict[int, list[Event]]:
    by_pid: dict[int, list[Event]] = {}
    for e in history.events:
        if "rank" in e and "pid" in e:
            by_pid.setdefault(e["pid"], []).append(e)
    return by_pid


def _draw_processes(pic: Picture) -> None:
    """A bar from a worker's boot to its exit: the gaps between bars are downtime."""
    for pid, events in _processes(pic.history).items():
        rank = events[0]["rank"]
        x0, x1 = pic.x(events[0]["t"]), pic.x(events[-1]["t"])
        y = pic.lane_y(rank) + LANE_H / 2 - 7
        head = events[0]
        tip = (f"rank {rank}, pid {pid} (launch {head.get('launch', 0)}, attempt"
               f" {head.get('attempt', 0)}): {events[0]['t'] - pic.t0:.2f}"
               f"-{events[-1]['t'] - pic.t0:.2f} s")
        pic.add("spans", _group("process", f'<rect x="{x0:.1f}" y="{y:.1f}"'
                                           f' width="{max(x1 - x0, 2):.1f}" height="14" rx="3"'
                                           f' fill="{COLORS["alive"]}"/>', tip))


def _draw_saves(pic: Picture) -> None:
    ends = {(e.get("pid"), e.get("save")): e for e in pic.history.of("save_end")}
    last: dict[tuple[object, object], float] = {}  # a save's last file event
    for e in pic.history.of("file"):
        last[(e.get("pid"), e.get("save"))] = e["t"]
    for begin in pic.history.of("save_begin"):
        if "rank" not in begin:
            continue
        end = ends.get((begin.get("pid"), begin.get("save")))
        y = pic.lane_y(begin["rank"]) + LANE_H / 2 - 7
        x0 = pic.x(begin["t"])
        stop = end["t"] if end else last.get((begin.get("pid"), begin.get("save")), begin["t"])
        x1 = max(pic.x(stop), x0 + 3)
        after = begin.get("after_step")
        if end is None:
            pic.add("spans", _group("save-torn", f'<rect x="{x0:.1f}" y="{y:.1f}"'
                                                 f' width="{x1 - x0:.1f}" height="14"'
                                                 f' fill="none" stroke="{COLORS["save"]}"'
                                                 ' stroke-dasharray="2 2"/>',
                                    f"save after step {after}: no commit recorded (the"
                                    " process was killed or ended first)"))
            continue
        seconds = end["t"] - begin["t"]
        body = (f'<rect x="{x0:.1f}" y="{y:.1f}" width="{x1 - x0:.1f}" height="14"'
                f' fill="{COLORS["save"]}" fill-opacity="0.35"/>' + _diamond(x1, y + 7, 5,
                                                                          COLORS["save"]))
        pic.add("marks", _group("commit", body, f"checkpoint after step {after} committed"
                                                f" (save {begin.get('save')}, rank"
                                                f" {begin['rank']}, {seconds * 1000:.1f} ms)"))


def _diamond(x: float, y: float, r: float, color: str) -> str:
    return (f'<path d="M{x:.1f} {y - r:.1f} L{x + r:.1f} {y:.1f} L{x:.1f} {y + r:.1f}'
            f' L{x - r:.1f} {y:.1f} Z" fill="{color}" stroke="#ffffff" stroke-width="0.8"/>')


def _draw_steps(pic: Picture) -> None:
    """A tick per step (thinned where they would touch); step numbers at round
    multiples that fit, and on the first step of every process (where it resumed)."""
    for rank in pic.ranks:
        base = pic.lane_y(rank) + LANE_H / 2
        steps = pic.history.steps(rank)
        every = _label_every([pic.x(e["t"]) for e in steps])
        drawn_x, labelled_x, pid = -1e9, -1e9, None
        for e in steps:
            x = pic.x(e["t"])
            if x - drawn_x >= 1.5:
                loss = e.get("loss")
                tip = f"step {e['step']} on rank {rank} at {e['t'] - pic.t0:.3f} s" + (
                    f", loss {loss:.4g}" if isinstance(loss, (int, float)) else "")
                pic.add("ticks", _group("step", f'<line x1="{x:.1f}" y1="{base - 6:.1f}"'
                                                f' x2="{x:.1f}" y2="{base + 6:.1f}"'
                                                f' stroke="{COLORS["step"]}"'
                                                ' stroke-width="1.4"/>', tip))
                drawn_x = x
            first = e.get("pid") != pid
            pid = e.get("pid")
            if (first or e["step"] % every == 0) and x - labelled_x >= 18:
                pic.add("ticks", f'<text x="{x:.1f}" y="{base + 17:.1f}" font-size="9.5"'
                                 f' text-anchor="middle" fill="{COLORS["muted"]}">'
                                 f'{e["step"]}</text>')
                labelled_x = x


def _label_every(xs: list[float]) -> int:
    """Label every N-th step, N a round number that leaves room for the numbers."""
    gaps = [b - a for a, b in zip(xs, xs[1:]) if b > a]
    px = median(gaps) if gaps else 30.0
    return 1 if px >= 24 else int(_nice(24 / px))


def _draw_rank_events(pic: Picture) -> None:
    for e in pic.history.events:
        rank = e.get("rank")
        if rank not in pic.ranks or e.get("source") == "harness" and e["ev"] != "rank_exit":
            continue
        y = pic.lane_y(rank) + LANE_H / 2
        x = pic.x(e["t"])
        mark = _mark_of(e["ev"])
        if mark is not None:
            mark(pic, e, x, y)
    for e in pic.history.of("hang_begin"):
        if e.get("rank") in pic.ranks:
            until = _hang_end(pic.history, e)
            y = pic.lane_y(e["rank"])
            _band(pic, "hang", e["t"], until, COLORS["fault"] + "33",
                  f"rank {e['rank']} hung ({e.get('mode', '?')}) for {until - e['t']:.1f} s",
                  top=y + 3, bottom=y + LANE_H - 3)


def _hang_end(history: History, begin: Event) -> float:
    """A hang lasts until the fault heals it, the harness tears the job down, or the
    hung process's last event."""
    later = [e["t"] for e in history.events if e["t"] > begin["t"] and (
        (e["ev"] == "hang_end" and e.get("pid") == begin.get("pid"))
        or e["ev"] in ("hang", "job_exit", "deadline")
        or (e["ev"] == "rank_exit" and e.get("pid") == begin.get("pid")))]
    return min(later, default=history.events[-1]["t"])


def _fault_mark(pic: Picture, e: Event, x: float, y: float) -> None:
    body = (f'<circle cx="{x:.1f}" cy="{y:.1f}" r="7" fill="{COLORS["fault"]}"/>'
            f'<path d="M{x - 3:.1f} {y - 3:.1f} L{x + 3:.1f} {y + 3:.1f} M{x + 3:.1f}'
            f' {y - 3:.1f} L{x - 3:.1f} {y + 3:.1f}" stroke="#ffffff" stroke-width="1.8"/>')
    pic.add("marks", _group("fault", body, f"fault {e.get('spec', e.get('kind'))} fired on rank"
                                           f" {e['rank']} at step {e.get('step')}"
                                           f" ({e['t'] - pic.t0:.2f} s)"))


def _effect_mark(pic: Picture, e: Event, x: float, y: float) -> None:
    details = ", ".join(f"{k}={v}" for k, v in e.items()
                        if k not in ("ev", "t", "rank", "pid", "launch", "attempt", "fp"))
    body = (f'<rect x="{x - 4:.1f}" y="{y - 4:.1f}" width="8" height="8"'
            f' fill="{COLORS["fault"]}" transform="rotate(45 {x:.1f} {y:.1f})"/>')
    pic.add("marks", _group("fault-effect", body, f"{e['ev']} on rank {e['rank']}: {details}"))


def _restore_mark(pic: Picture, e: Event, x: float, y: float) -> None:
    if (e.get("launch", 0), e.get("attempt", 0)) == (0, 0) and not e.get("loads"):
        return  # a fresh start, not a restore
    restored = e.get("restored")
    what = f"step {restored}" if restored is not None else "a state no reference step has"
    body = (f'<path d="M{x:.1f} {y - 12:.1f} L{x + 6:.1f} {y - 2:.1f} L{x - 6:.1f} {y - 2:.1f}'
            f' Z" fill="{COLORS["restore"]}"/>')
    pic.add("marks", _group("restore", body, f"rank {e['rank']} restored {what}"
                                             f" (match: {e.get('match', '?')})"))


def _rollback_mark(pic: Picture, e: Event, x: float, y: float) -> None:
    body = (f'<path d="M{x:.1f} {y - 12:.1f} L{x + 6:.1f} {y - 2:.1f} L{x - 6:.1f} {y - 2:.1f}'
            f' Z" fill="#ffffff" stroke="{COLORS["restore"]}" stroke-width="1.8"/>')
    pic.add("marks", _group("restore", body, f"rank {e['rank']} rolled back in place from step"
                                             f" {e.get('from_step')} to step"
                                             f" {e.get('restored')}"))


def _load_mark(pic: Picture, e: Event, x: float, y: float) -> None:
    body = (f'<line x1="{x:.1f}" y1="{y + 7:.1f}" x2="{x:.1f}" y2="{y + 12:.1f}"'
            f' stroke="{COLORS["restore"]}" stroke-width="2"/>')
    pic.add("marks", _group("load", body, f"rank {e['rank']} read {e.get('path', '?')}"))


def _exit_mark(pic: Picture, e: Event, x: float, y: float) -> None:
    body = (f'<line x1="{x:.1f}" y1="{y - 9:.1f}" x2="{x:.1f}" y2="{y + 9:.1f}"'
            f' stroke="{COLORS["muted"]}" stroke-width="2.5"/>')
    pic.add("marks", _group("exit", body, f"rank {e['rank']} (pid {e.get('pid')}) exited"))


def _exception_mark(pic: Picture, e: Event, x: float, y: float) -> None:
    body = (f'<text x="{x:.1f}" y="{y - 9:.1f}" font-size="13" font-weight="bold"'
            f' text-anchor="middle" fill="{COLORS["fault"]}">!</text>')
    pic.add("marks", _group("exception", body, f"rank {e['rank']} raised {e.get('type')}:"
                                               f" {str(e.get('message', ''))[:200]}"))


def _detect_mark(pic: Picture, e: Event, x: float, y: float) -> None:
    body = (f'<circle cx="{x:.1f}" cy="{y:.1f}" r="6" fill="none"'
            f' stroke="{COLORS["detect"]}" stroke-width="2.2"/>')
    details = e.get("details")
    why = details.get("reason", "") if isinstance(details, dict) else ""
    pic.add("marks", _group("detection", body, f"rank {e['rank']} detected {e.get('what')}"
                                               f" at step {e.get('step')}"
                                               + (f": {why}" if why else "")))


_RANK_MARKS = {"fault": _fault_mark, "restore": _restore_mark, "rollback": _rollback_mark,
               "load": _load_mark, "rank_exit": _exit_mark, "exception": _exception_mark,
               "detection": _detect_mark}


def _mark_of(ev: str) -> Callable[..., None] | None:
    """How to draw a rank's event: the timeline's own marks, then each fault kind's
    (`FaultKind.marks`: the events a kind records where it acted)."""
    if ev in _RANK_MARKS:
        return _RANK_MARKS[ev]
    return _effect_mark if ev in _effect_events() else None


@cache
def _effect_events() -> frozenset[str]:
    return frozenset(name for kind in loadable_kinds().values() for name in kind.marks)


def _job_marker(pic: Picture, t: float, cls: str, color: str, tip: str, shape: str) -> None:
    x, y = pic.x(t), pic.lanes_top + JOB_LANE_H / 2
    if shape == "circle":
        body = f'<circle cx="{x:.1f}" cy="{y:.1f}" r="5" fill="{color}"/>'
    else:
        body = f'<rect x="{x - 5:.1f}" y="{y - 5:.1f}" width="10" height="10" fill="{color}"/>'
    pic.add("marks", _group(cls, body, tip))


def _draw_job_events(pic: Picture) -> None:
    """The harness's view: launches, the job's exit, hangs it found, network faults."""
    h = pic.history
    for e in h.of("launch"):
        pic.add("lines", _group("launch", _vline(pic, e["t"], COLORS["launch"], width=1.6),
                                f"launch {e.get('launch', 0)}: torchrun started"))
    for e in h.of("job_exit"):
        codes = e.get("codes") or []
        _job_marker(pic, e["t"], "job-exit", COLORS["muted"], f"job exited, codes {codes}",
                    "rect")
        text = "exit " + ",".join("killed" if c is None else str(c) for c in codes)
        x, y = pic.x(e["t"]), pic.lanes_top + JOB_LANE_H / 2 + 4
        pic.job_lane_taken.append((x - 9 - len(text) * CHAR_W, x + 6))
        pic.add("marks", f'<text x="{x - 9:.1f}" y="{y:.1f}" font-size="10.5"'
                         f' text-anchor="end" fill="{COLORS["muted"]}"{HALO}>{_esc(text)}</text>')
    for e in h.of("hang", "deadline"):
        pic.add("lines", _group("fault", _vline(pic, e["t"], COLORS["fault"], width=2),
                                f"{e['ev']}: the harness tore the job down"
                                f" ({e.get('seconds', '?')} s)"))
    ends = {(e.get("id"), e.get("window")): e["t"] for e in h.of("nemesis_end")}
    for e in h.of("nemesis_begin"):
        until = ends.get((e.get("id"), e.get("window")), h.events[-1]["t"])
        extra = ", ".join(f"{k}={v}" for k, v in e.items()
                          if k not in ("ev", "t", "source", "id", "window"))
        _band(pic, "fault", e["t"], until, COLORS["fault"] + "22",
              f"{e.get('kind')} in force for {until - e['t']:.1f} s ({extra})")
        _job_marker(pic, e["t"], "fault", COLORS["fault"], f"{e.get('kind')} begins", "circle")


def _divergent_event(pic: Picture) -> Event | None:
    """The step event the checker named. A step redone after a restart occurs twice; the
    checker compares steps in time order and steps before the first fault matched (else
    it would have found the target non-deterministic), so the first occurrence at or
    after the first fault is the one that diverged."""
    d = pic.divergence
    if d is None:
        return None
    found = [e for e in pic.history.steps(d.rank) if e.get("step") == d.step]
    faults = pic.history.faults()
    after = [e for e in found if faults and e["t"] >= faults[0]["t"]]
    return (after or found or [None])[0]


def _draw_divergence(pic: Picture) -> None:
    e = _divergent_event(pic)
    if e is None or pic.divergence is None:
        return
    x, y = pic.x(e["t"]), pic.lane_y(e["rank"]) + LANE_H / 2
    body = (f'<circle cx="{x:.1f}" cy="{y:.1f}" r="9" fill="none" stroke="{COLORS["diverge"]}"'
            ' stroke-width="2.5"/>')
    pic.add("marks", _group("divergence", body, f"first step that differs from the reference:"
                                                f" step {pic.divergence.step} on rank"
                                                f" {pic.divergence.rank}"
                                                f" ({pic.divergence.what})"))


# -- putting it together -------------------------------------------------------------------

def _defs() -> str:
    return ('<defs><pattern id="down" width="6" height="6" patternUnits="userSpaceOnUse"'
            ' patternTransform="rotate(45)"><rect width="6" height="6" fill="#f1f5f9"/>'
            f'<line x1="0" y1="0" x2="0" y2="6" stroke="{COLORS["down"]}" stroke-width="1.6"'
            ' stroke-opacity="0.45"/></pattern>'
            '<pattern id="quiet" width="8" height="8" patternUnits="userSpaceOnUse">'
            '<rect width="8" height="8" fill="#f1f5f9"/><circle cx="4" cy="4" r="0.9"'
            ' fill="#cbd5e1"/></pattern></defs>')


def _notes_svg(pic: Picture) -> Iterable[str]:
    base = 34 if pic.title else 12
    for note in pic.notes:
        y = base + note.row * NOTE_ROW_H + 11
        target = (pic.lane_y(note.rank) + LANE_H / 2 - 8 if note.rank in pic.ranks
                  else pic.lanes_top)
        yield (f'<g class="note"><line x1="{note.x:.1f}" y1="{y + 3:.1f}" x2="{note.x:.1f}"'
               f' y2="{target:.1f}" stroke="{note.color}" stroke-width="0.8"'
               f' stroke-dasharray="1 2"/><text x="{note.left:.1f}" y="{y:.1f}"'
               f' font-size="11" fill="{note.color}">{_esc(note.text)}</text></g>')


def _axis_svg(pic: Picture) -> Iterable[str]:
    y = pic.lanes_bottom
    yield (f'<line x1="{LEFT}" y1="{y:.1f}" x2="{WIDTH - RIGHT}" y2="{y:.1f}"'
           f' stroke="{COLORS["text"]}" stroke-width="1"/>')
    step = _nice(70 * pic.axis.seconds_per_px)
    for t0, t1, x0, x1 in pic.axis.pieces:
        if (t0, t1, x0, x1) in pic.axis.breaks:
            mid = (x0 + x1) / 2
            yield (f'<g class="axis-break"><path d="M{mid - 5:.1f} {y + 5:.1f} L{mid - 1:.1f}'
                   f' {y - 5:.1f} M{mid + 1:.1f} {y + 5:.1f} L{mid + 5:.1f} {y - 5:.1f}"'
                   f' stroke="{COLORS["text"]}" stroke-width="1.2"/><text x="{mid:.1f}"'
                   f' y="{y + 30:.1f}" font-size="9.5" text-anchor="middle"'
                   f' fill="{COLORS["muted"]}">+{t1 - t0:.1f} s</text></g>')
            continue
        tick = math.ceil(t0 / step) * step
        while tick <= t1 + 1e-9:
            x = pic.axis.x(tick)
            yield (f'<line x1="{x:.1f}" y1="{y:.1f}" x2="{x:.1f}" y2="{y + 5:.1f}"'
                   f' stroke="{COLORS["text"]}"/><text x="{x:.1f}" y="{y + 17:.1f}"'
                   f' font-size="10" text-anchor="middle" fill="{COLORS["text"]}">'
                   f'{_fmt_t(tick, step)}</text>')
            tick += step
    cut = " (quiet stretches cut short, their length marked +N s)" if pic.axis.breaks else ""
    yield (f'<text x="{LEFT}" y="{y + 44:.1f}" font-size="11" fill="{COLORS["muted"]}">'
           f'seconds since the chaos run began{cut}</text>')


LEGEND = (
    ("step", "step"), ("commit", "checkpoint save + commit"), ("restore", "restore"),
    ("fault", "fault"), ("hang", "hung"), ("launch", "launch / restart"), ("down", "job down"),
    ("redo", "work redone (lost)"), ("diverge", "diverges from reference"),
)


def _legend_svg(y: float) -> Iterable[str]:
    x = LEFT
    for key, text in LEGEND:
        yield f'<g class="legend-item">{_legend_icon(key, x, y)}'
        yield (f'<text x="{x + 18:.1f}" y="{y + 4:.1f}" font-size="11"'
               f' fill="{COLORS["text"]}">{text}</text></g>')
        x += 32 + len(text) * CHAR_W


def _legend_icon(key: str, x: float, y: float) -> str:
    c = x + 7
    icons = {
        "step": f'<line x1="{c}" y1="{y - 6}" x2="{c}" y2="{y + 6}" stroke="{COLORS["step"]}"'
                ' stroke-width="1.4"/>',
        "commit": f'<rect x="{x}" y="{y - 5}" width="10" height="10" fill="{COLORS["save"]}"'
                  f' fill-opacity="0.35"/>' + _diamond(x + 10, y, 5, COLORS["save"]),
        "restore": f'<path d="M{c} {y - 6} L{c + 6} {y + 4} L{c - 6} {y + 4} Z"'
                   f' fill="{COLORS["restore"]}"/>',
        "fault": f'<circle cx="{c}" cy="{y}" r="6" fill="{COLORS["fault"]}"/>',
        "launch": f'<line x1="{c - 3}" y1="{y - 7}" x2="{c - 3}" y2="{y + 7}"'
                  f' stroke="{COLORS["launch"]}" stroke-width="1.6"/><line x1="{c + 3}"'
                  f' y1="{y - 7}" x2="{c + 3}" y2="{y + 7}" stroke="{COLORS["launch"]}"'
                  ' stroke-dasharray="3 2"/>',
        "hang": f'<rect x="{x}" y="{y - 7}" width="14" height="14"'
                f' fill="{COLORS["fault"]}33"/>',
        "down": f'<rect x="{x}" y="{y - 7}" width="14" height="14" fill="url(#down)"/>',
        "redo": f'<rect x="{x}" y="{y - 7}" width="14" height="14" fill="{COLORS["redo"]}55"/>',
        "diverge": f'<circle cx="{c}" cy="{y}" r="6" fill="none" stroke="{COLORS["diverge"]}"'
                   ' stroke-width="2.5"/>',
    }
    return icons[key]


def _assemble(pic: Picture) -> str:
    legend_y = pic.lanes_bottom + 66
    height = legend_y + 18
    head = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height:.0f}"'
            f' viewBox="0 0 {WIDTH} {height:.0f}" font-family="{FONT}" role="img">')
    parts = [head, _title(pic.title or "torchchaos timeline"), _defs(),
             f'<rect width="{WIDTH}" height="{height:.0f}" fill="#ffffff"/>']
    if pic.title:
        parts.append(f'<text x="{LEFT}" y="22" font-size="14" font-weight="bold"'
                     f' fill="{COLORS["text"]}">{_esc(pic.title)}</text>')
    for layer in ("lanes", "bands", "spans", "lines", "ticks", "marks"):
        parts.extend(pic.layers[layer])
    parts.extend(_notes_svg(pic))
    parts.extend(_axis_svg(pic))
    parts.extend(_legend_svg(legend_y))
    parts.append("</svg>")
    return "\n".join(parts) + "\n"

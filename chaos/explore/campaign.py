"""Bit-flip campaigns: N seeded flips, one chaos run each, one outcome table.

Each run flips one bit of one seeded element of a seeded tensor kind, with a
seeded bit class, rank and step (within the reference run's steps). The
outcomes use the fault-injection literature's categories (`torchchaos.judge.sdc`):
masked, detected, silent divergence, crash, hang, counted overall and by bit
class and by tensor kind, which is the table a reliability team reads before
deciding how much checking to pay for.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from torchchaos.errors import UsageError
from torchchaos.explore.rows import Entry
from torchchaos.faults.registry import get_kind
from torchchaos.harness.reference import get_reference
from torchchaos.judge.sdc import CATEGORIES
from torchchaos.progress import Progress
from torchchaos.scenario.model import Scenario
from torchchaos.scenario.spec import Spec

# The in-memory tensors a campaign flips (the bit flip kind's others: the loss, a file).
TENSORS = ("param", "grad", "optim", "activation")
NOT_JUDGED = "not judged"


def plan(base: Scenario, cache_dir: Path, progress: Progress, runs: int, seed: int,
         tensors: list[str], bit_classes: list[str]) -> list[Entry]:
    known = get_kind("bitflip").choices
    for tensor in tensors:
        if tensor not in TENSORS:
            raise UsageError(f"campaign --tensor {tensor!r}: choose from {', '.join(TENSORS)}")
    for bit in bit_classes:
        if bit not in known["bit"]:
            raise UsageError(f"campaign --bit {bit!r}: choose from {', '.join(known['bit'])}")
    final = get_reference(base, cache_dir, progress).history().final_step()
    if final < 2:
        raise UsageError(f"the reference run has {final} step(s); a campaign needs at least 2")
    rng = random.Random(seed)
    entries = []
    for _ in range(runs):
        tensor, bit = rng.choice(tensors), rng.choice(bit_classes)
        rank, step = rng.randrange(base.world_size), rng.randint(1, final - 1)
        entries.append(Entry(f"{tensor} {bit} rank {rank} step {step}",
                             Spec.make("bitflip", rank=rank, step=step, tensor=tensor, bit=bit),
                             seed=rng.randrange(2**31)))
    return entries


OUTCOMES = (*CATEGORIES, NOT_JUDGED)


def parse_outcomes(text: str) -> frozenset[str]:
    """`--fail-on`'s value: outcomes by name, comma-separated ("silent divergence,hang";
    "silent-divergence" and "silent_divergence" too)."""
    chosen = set()
    for word in (w.strip().replace("-", " ").replace("_", " ") for w in text.split(",")):
        if word not in OUTCOMES:
            raise UsageError(f"no campaign outcome {word!r}: choose from {', '.join(OUTCOMES)}")
        chosen.add(word)
    return frozenset(chosen)


def exit_code(entries: list[Entry], fail_on: frozenset[str] = frozenset()) -> int:
    """A campaign is a measurement, not a test: 0 once every run was judged, 2 when one
    was not. A nightly that must go red on what it measured names those outcomes
    (`--fail-on "silent divergence"`): 1 when a run ended in one of them."""
    outcomes = {outcome(e) for e in entries}
    if outcomes & fail_on:
        return 1
    return 2 if NOT_JUDGED in outcomes else 0


def outcome(entry: Entry) -> str:
    if entry.report is None:
        return NOT_JUDGED
    check = entry.report.checks.get("sdc_detected", {})
    return str(check.get("outcome") or NOT_JUDGED)


def _key(entry: Entry, index: int) -> str:
    return entry.name.split()[index]


def counts(entries: list[Entry], group_index: int | None) -> dict[str, dict[str, int]]:
    """Outcome counts per group (a word of the entry's name), or overall (None)."""
    table: dict[str, dict[str, int]] = {}
    for entry in entries:
        group = "all" if group_index is None else _key(entry, group_index)
        row = table.setdefault(group, dict.fromkeys((*CATEGORIES, NOT_JUDGED), 0))
        row[outcome(entry)] += 1
    return table


def table(entries: list[Entry], numbers: list[int] | None = None) -> str:
    """The outcome counts and the runs, over the entries numbered `numbers` (1-based;
    default all): a shard's, or the whole campaign's."""
    numbers = numbers if numbers is not None else list(range(1, len(entries) + 1))
    entries, all_entries = [entries[n - 1] for n in numbers], entries
    columns = (*CATEGORIES, NOT_JUDGED)
    lines = []
    for title, index in (("by bit class", 1), ("by tensor", 0), ("all runs", None)):
        rows = counts(entries, index)
        lines.append(f"{title:<14}" + "".join(f"{c:>{len(c) + 2}}" for c in columns)
                     + f"{'total':>7}")
        for group, row in sorted(rows.items()):
            lines.append(f"{group:<14}" + "".join(f"{row[c]:>{len(c) + 2}}" for c in columns)
                         + f"{sum(row.values()):>7}")
        lines.append("")
    lines.append("runs:")
    width = max((len(e.name) for e in entries), default=0)
    for number in numbers:
        entry = all_entries[number - 1]
        lines.append(f"  {number:02d} {entry.name:<{width}}  {outcome(entry)}")
    return "\n".join(lines)


def write(entries: list[Entry], out_dir: Path, numbers: list[int] | None = None) -> Path:
    """out_dir/campaign.json over the entries numbered `numbers` (default all)."""
    if numbers is not None:
        entries = [entries[n - 1] for n in numbers]
    path = out_dir / "campaign.json"
    runs = [{"name": e.name, "fault": str(e.fault), "seed": e.seed, "outcome": outcome(e),
             "details": e.report.checks.get("sdc_detected") if e.report else None}
            for e in entries]
    path.write_text(json.dumps({"runs": runs, "by_bit_class": counts(entries, 1),
                                "by_tensor": counts(entries, 0),
                                "all": counts(entries, None).get(  # none finished yet
                                    "all", dict.fromkeys((*CATEGORIES, NOT_JUDGED), 0))},
                               indent=2) + "\n")
    return path

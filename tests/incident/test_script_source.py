"""Where a silent script's peers waited, read in the script's own lines.

The logs are harness runs of tests/scripts/plain_ddp.py (tests/data/incidents/harness/),
which prints no step and no save. Each test moves the log's script path to one that does
not exist here, so the script the test writes (or the real one) is found only by name,
as `--script` finds it.
"""

from __future__ import annotations

import re
from pathlib import Path

from torchchaos.incident import script_source
from torchchaos.incident.attribute import attribute
from torchchaos.incident.gather import gather

REPO = Path(__file__).resolve().parents[2]
PLAIN = REPO / "tests" / "scripts" / "plain_ddp.py"
HARNESS = REPO / "tests" / "data" / "incidents" / "harness"
ELSEWHERE = "/cluster/jobs/1234/plain_ddp.py"  # where the job ran: not on this machine


def finding(case: str, tmp_path: Path, script: Path | None, edit=None):
    """Import `case`'s log as if the job ran the script elsewhere; `script` stands in."""
    log = (HARNESS / case / "launch-0-node-0.log").read_text()
    folder = tmp_path / "artefacts"
    folder.mkdir()
    # wherever the corpus was made: every plain_ddp.py path in the log moves elsewhere
    (folder / "launcher.log").write_text(re.sub(r'"[^"]*/plain_ddp\.py"', f'"{ELSEWHERE}"',
                                                log))
    if script is not None and edit is not None:
        lines = PLAIN.read_text().splitlines()
        edit(lines)
        script.write_text("\n".join(lines) + "\n")
    gathered = gather([folder], script=script)
    return attribute(gathered.observations, gathered.sources).finding


def _replace(old: str, new: str):
    def edit(lines: list[str]) -> None:
        at = next(i for i, line in enumerate(lines) if line.strip() == old)
        lines[at] = lines[at].replace(old, new)  # same line count: the quoted lines stay
    return edit


def test_a_peer_at_the_barrier_after_the_save_places_the_kill_mid_save(tmp_path):
    found = finding("silent_mid_save", tmp_path, PLAIN)
    assert (found.kind, found.rank, found.phase, found.phase_seen) == \
        ("kill", 0, "mid_save", True)
    assert any("`dist.barrier()` (plain_ddp.py:94" in r and "plain_ddp.py:93" in r
               for r in found.rules), found.rules


def test_a_barrier_with_no_save_before_it_says_nothing_of_a_save(tmp_path):
    script = tmp_path / "plain_ddp.py"
    found = finding("silent_mid_save", tmp_path, script,
                    _replace("save(step, net, optim)", "pass"))
    assert found.phase != "mid_save", found.rules


def test_a_peer_in_backward_places_the_kill_between_fenced_saves(tmp_path):
    found = finding("silent_between", tmp_path, PLAIN)
    assert (found.kind, found.rank, found.phase, found.phase_seen) == \
        ("kill", 0, "between_saves", True)
    assert any("fences its save" in r for r in found.rules), found.rules


def placed_by_rule_only(found) -> bool:
    """No phase told as seen: at most placed between saves by rule, after the save the
    restart resumed from (the log has no step line)."""
    return not found.phase_seen and (found.phase == "unknown" or any(
        "by rule" in r for r in found.rules))


def test_without_the_fence_a_peer_in_backward_tells_no_phase(tmp_path):
    # the writer could be saving while its peer runs the next step: nothing tells
    script = tmp_path / "plain_ddp.py"
    found = finding("silent_between", tmp_path, script,
                    _replace("dist.barrier()", "pass"))
    assert placed_by_rule_only(found), found.rules


def test_a_script_whose_lines_moved_is_not_read_as_the_one_that_failed(tmp_path):
    script = tmp_path / "plain_ddp.py"
    found = finding("silent_mid_save", tmp_path, script, lambda lines: lines.insert(0, "#"))
    assert placed_by_rule_only(found), found.rules


def test_without_the_script_no_phase_is_told_as_seen(tmp_path):
    found = finding("silent_mid_save", tmp_path, None)
    assert (found.kind, found.rank) == ("kill", 0) and placed_by_rule_only(found), found.rules


def test_a_rank_that_left_no_line_of_its_own_is_the_one_that_died():
    gathered = gather([HARNESS / "quiet_peer"])
    found = attribute(gathered.observations, gathered.sources).finding
    assert (found.kind, found.rank) == ("kill", 1), found.rules
    assert any("only rank with no word" in r for r in found.rules)


def test_fences_and_saves_in_other_ways_of_writing_them():
    lines = ["for step in range(10):",
             "    train(step)",
             "    if step % 5 == 0:",
             "        if rank == 0:",
             "            torch.save(model.state_dict(), 'ckpt.pt')",
             "",
             "        torch.distributed.barrier()",
             "def save(x):",
             "    torch.save(x, 'p')",
             "    return x"]
    assert script_source.save_before(lines, 7) == 5
    assert script_source.fenced_save(lines) == (5, 7)
    assert script_source.save_before(lines, 2) is None
    unfenced = lines[:6] + ["        log('saved')"]
    assert script_source.fenced_save(unfenced) is None


def test_a_barrier_in_the_middle_of_a_save_fences_nothing():
    """Every rank writes its file, a barrier, then rank 0 alone writes `latest` and
    prunes (bench/targets/adamw_trainer.py): its peer trains on past that barrier."""
    lines = ["def save_checkpoint(step, state, rank):",
             "    torch.save(state, tmp)",
             "    os.replace(tmp, path)",
             "    dist.barrier()",
             "    if rank == 0:",
             "        with open(latest + '.tmp', 'w') as f:",
             "            f.write(str(step))",
             "        cleanup_old(ckpt_dir, keep=2)",
             "",
             "def train():"]
    assert script_source.fenced_save(lines) is None
    assert script_source.fenced_save(lines[:4]) == (2, 4)  # the barrier ends the save


def test_a_peer_past_a_barrier_inside_the_save_does_not_place_the_kill_between_saves():
    """adamw_trainer.py, rank 0 SIGKILLed in its 3rd save after the barrier (pruning the
    oldest step folder) while rank 1 ran the next step's backward: the import said
    "between saves: the script fences its save" (bench/incident_attribution.py,
    adamw/05, 2026-11-28). The log places it instead: the restart resumed from step 15,
    whose save the log, saying when each is done, never said done."""
    trainer = REPO / "bench" / "targets" / "adamw_trainer.py"
    gathered = gather([HARNESS / "barrier_inside_the_save"], script=trainer)
    found = attribute(gathered.observations, gathered.sources).finding
    assert (found.kind, found.rank, found.phase, found.save) == ("kill", 0, "mid_save", 3)
    assert not any("fences its save" in r for r in found.rules), found.rules

"""What the log readers share: decoding, the rank a line is tagged with, tracebacks."""

from __future__ import annotations

import re

from torchchaos.incident.readers import BadArtefact
from torchchaos.log_lines import FRAME, RANK_TAG


def decode(data: bytes) -> str:
    """A log's text, its stray NUL bytes dropped; a binary file is not a log."""
    if not is_text(data):
        raise BadArtefact("binary, not a text log")
    return data.replace(b"\x00", b"").decode("utf-8", errors="replace")


# a log may hold a stray NUL: torch's DataLoader worker writes one after "ERROR:
# Unexpected segmentation fault encountered in worker." (its C handler's string
# terminator); a binary file (a pickle, a zip, a core) has many, or bytes that are no text
STRAY_NULS = 4


def is_text(data: bytes) -> bool:
    head = data[:8192]
    nuls = head.count(0)
    if nuls == 0:
        return True
    if nuls > STRAY_NULS:
        return False
    sample = head.replace(b"\x00", b"").decode("utf-8", errors="replace")
    printable = sum(ch.isprintable() or ch in "\n\r\t" for ch in sample)
    return printable >= 0.98 * len(sample)


# what differs between two prints of one line: numbers (steps, times, pids, rates) and
# addresses
NUMBERS = re.compile(r"0x[0-9a-fA-F]+|\d+")


# past this many kinds of lines a log is too varied to compare (ids, hashes in every line)
MAX_SHAPES = 20_000


# what two prints of one step's line differ in: a wall-clock time or date, and what is
# measured in time (a step's milliseconds, a throughput, nanoGPT's "mfu 3.21%")
CLOCK = re.compile(r"\d{4}-\d\d-\d\d|\b\d\d:\d\d:\d\d(?:[.,]\d+)?|\b[WIEF]\d{4}\b"
                   r"|-?\b\d+(?:\.\d+)?\s*(?:ms|s|secs?|seconds|min|us|µs|ns|%|"
                   r"(?:it|samples?|tokens?|tok|steps?)/s)(?!\w)")


def outline(data: bytes, wanted: set[int]) -> tuple[frozenset[str] | None, tuple[str, ...]]:
    """(the kinds of lines the log printed, each with its numbers blanked (a progress bar's
    last frame only), or None for a log too varied to compare; its lines numbered in
    `wanted` (1-based), in order, with `CLOCK` blanked: times, dates, durations, rates):
    what two launches of one job are compared by."""
    shapes: set[str] | None = set()
    lines = []
    for number, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), 1):
        if number in wanted:
            lines.append(" ".join(CLOCK.sub("#", line).split()))
        shape = " ".join(NUMBERS.sub("#", line.rpartition("\r")[2]).split())
        if shape and shapes is not None:
            shapes.add(shape)
            if len(shapes) > MAX_SHAPES:
                shapes = None  # too varied to compare; the lines wanted are still read
    return (frozenset(shapes) if shapes is not None else None), tuple(lines)


def text_of(data: bytes) -> str | None:
    """A file's text for a reader's sniff, or None for a binary file: one rule for all."""
    return data.decode("utf-8", errors="replace") if is_text(data) else None


def says_any(data: bytes, *patterns: re.Pattern[str]) -> bool:
    """A line reader's sniff: whether a text file holds a line any of `patterns` finds."""
    body = text_of(data)
    return body is not None and any(p.search(body) for p in patterns)


def split_tag(line: str) -> tuple[int | None, str, bool]:
    """(rank, the line without its tag, whether the tag was a local rank). A launcher's
    tag before torch's own (torchrun --tee's "[default1]:[rank3]: ...", srun --label's
    "1: [rank3]: ...", a node's task) gives way to torch's global rank."""
    m = RANK_TAG.match(line)
    if not m:
        return None, line, False
    rank, local, plain = m.group(1), m.group(2), m.group(3) or m.group(4)
    rest = line[m.end():]
    if (local or plain) is not None and (inner := RANK_TAG.match(rest)) and inner.group(1):
        return int(inner.group(1)), rest[inner.end():], False
    number = rank or local or plain
    return int(number), rest, local is not None


def frame_text(m: re.Match[str]) -> str:
    path = m.group("file")
    short = "/".join(path.split("/")[-3:]) if "site-packages" in path else path.split("/")[-1]
    return f"{m.group('func')} ({short}:{m.group('line')})"


# A frame's code as the traceback quotes it: (file as printed, line, the source line)
Code = tuple[str, int, str]


def script_code(m: re.Match[str], quoted: str) -> Code | None:
    """A frame of the user's own code (not a library's, not `<string>`), with the line the
    traceback quotes under it: what lets `script_source` find the file and check it."""
    path = m.group("file")
    if path.startswith("<") or "-packages/" in path or "/lib/python" in path:
        return None
    return path, int(m.group("line")), quoted.strip()


def tracebacks(lines: list[tuple[int, str]]
               ) -> list[tuple[int, tuple[str, ...], str, tuple[Code, ...]]]:
    """Each Python traceback in (line number, text) pairs of one stream: the line it
    starts on, its frames (innermost last), its last line ("Type: message") and the code
    of its frames in the user's own files."""
    found: list[tuple[int, tuple[str, ...], str, tuple[Code, ...]]] = []
    i = 0
    while i < len(lines):
        number, text = lines[i]
        if not text.lstrip().startswith("Traceback (most recent call last)"):
            i += 1
            continue
        frames: list[str] = []
        code: list[Code] = []
        j = i + 1
        while j < len(lines):
            body = lines[j][1]
            m = FRAME.match(body)
            if m:
                frames.append(frame_text(m))
                quoted = lines[j + 1][1] if j + 1 < len(lines) else ""
                if (mine := script_code(m, "" if FRAME.match(quoted) else quoted)):
                    code.append(mine)
            elif body.startswith((" ", "\t")) or not body.strip():
                pass  # the source line and its carets
            elif body.startswith("Traceback (most recent call last)"):
                pass  # two ranks' untagged tracebacks interleaved: read as one
            else:
                break
            j += 1
        last = lines[j][1].strip() if j < len(lines) else ""
        found.append((number, tuple(frames), last, tuple(code)))
        i = j + 1
    return found


def has_tagged_traceback(body: str) -> bool:
    """Whether a log holds a traceback a rank's tag heads ("[rank1]: Traceback", srun
    --label's "3: Traceback", Open MPI's "[1,2]<stderr>:Traceback")."""
    tagged = (split_tag(line) for line in body.splitlines() if "Traceback" in line)
    return any(rank is not None and said.lstrip().startswith("Traceback (most recent call")
               for rank, said, _ in tagged)

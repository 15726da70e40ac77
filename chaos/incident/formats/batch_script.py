"""A job's batch script (sbatch's, or any shell script that starts the training): which
script it runs, with which arguments.

    #!/bin/bash
    #SBATCH --time=00:01:00
    cd /job
    torchrun --standalone --nproc_per_node 2 /job/train.py --out run

The last line that starts a `.py` script (torchrun, srun, python, accelerate; its
continuation lines joined) is the job's command. It is read, never run.
"""

from __future__ import annotations

import re
import shlex

from torchchaos.incident.formats import text
from torchchaos.incident.observations import Observation, Source
from torchchaos.incident.readers import Reader

LAUNCHES = re.compile(r"\b(torchrun|srun|mpirun|python[\d.]*|torch\.distributed\.run|"
                      r"accelerate|deepspeed)\b")


class BatchScript(Reader):
    name = "batchscript"
    summary = "a job's batch script (#SBATCH, #!/bin/bash): the training script it starts"

    def sniff(self, data: bytes, name: str) -> bool:
        body = text.text_of(data)
        return body is not None and body.startswith("#!") and "sh" in body.split("\n", 1)[0] \
            and last_command(body) is not None

    def read(self, data: bytes, name: str) -> list[Observation]:
        body = text.decode(data)
        found = last_command(body)
        if found is None:
            return []
        line, script, args = found
        return [Observation("launch_command", Source(name, line), detail=f"runs {script}",
                            extra={"script": script, "args": args})]


def last_command(body: str) -> tuple[int, str, list[str]] | None:
    """(line, script, arguments) of the script's last line that starts a .py script."""
    found = None
    lines = body.splitlines()
    number = 0
    while number < len(lines):
        start, line = number + 1, lines[number]
        while line.endswith("\\") and number + 1 < len(lines):  # continuation lines
            number += 1
            line = line[:-1] + " " + lines[number]
        number += 1
        line = line.split(" #", 1)[0].strip()
        if line.startswith("#") or not LAUNCHES.search(line):
            continue
        command = from_command_line(line.rstrip("&").strip())
        if command is not None:
            found = (start, *command)
    return found


def from_command_line(line: str) -> tuple[str, list[str]] | None:
    """(the .py script, its arguments) of a command line; None where it starts none."""
    try:
        words = shlex.split(line)
    except ValueError:
        words = line.split()
    for i, word in enumerate(words):
        if word.endswith(".py"):
            return word, words[i + 1:]
    return None

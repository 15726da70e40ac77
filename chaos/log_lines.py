"""The words a training job's log is made of, as patterns: one vocabulary.

torchrun, torch.distributed's backends and Python write the same lines whoever
reads them. The harness reads a live run's log with these (`harness/errorlines`:
why a rank stopped), the incident readers a dead job's (`incident/formats/`: who
died of what, when); a fix to how a line is recognised lands here, for both.
Nothing here decides anything: the readers do.
"""

from __future__ import annotations

import re

# -- rank tags --------------------------------------------------------------------
# torch prefixes a rank's stderr with "[rank1]:"; torchrun --tee/--log-dir with
# "[default1]:" (the role's local rank). What the harness's own runs write.
TORCHRUN_RANK_TAG = re.compile(r"^\[(rank|default)\d+\]:\s?")
# Any launcher's or framework's: the above, Lightning's "[rank: 1]", many wrappers'
# "rank 1:" (srun --label: "3: "), Open MPI's --tag-output "[1,2]<stderr>:" (job, rank).
# Groups: the rank (1), the local rank (2), srun's (3), Open MPI's (4).
RANK_TAG = re.compile(r"^\s*\[(?:rank|Rank |rank: )(\d+)\]:?\s?|^\s*\[default(\d+)\]:\s?"
                      r"|^(\d+): |^\[\d+,(\d+)\]<std(?:out|err)>:\s?")

# -- torchrun's launcher ------------------------------------------------------------
# a worker exited with a status of its own; groups: exit code, local rank, pid
WORKER_FAILED = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: (\d+) \(pid: (\d+)\)")
# the launcher stops a worker: its subprocess mode's line, and its multiprocessing mode's
# (a function launched by elastic_launch, start method fork or spawn)
CLOSING = re.compile(r"(?:Sending process (\d+) closing signal|(?:Closing|Terminating) process"
                     r" (\d+) via signal) (SIG\w+)")
RESTART = re.compile(r"Worker group (\w+)\. (\d+)/(\d+) attempts left; will restart worker group")
# the launcher itself got a signal (a scheduler's, an operator's) and stops its workers
AGENT_SIGNAL = re.compile(r"Received (?:Signals\.)?(SIG\w+) death signal")
# the summary block torchrun prints when the job failed begins here
SUMMARY_START = re.compile(r"ChildFailedError:\s*$")
# its report that a rank failed (a command's, or a forked rank's): an echo of the rank's
# error, never its cause
LAUNCHER_ECHO = re.compile(r"ChildFailedError|Process(Exited|Raised)Exception")

# -- Python's ------------------------------------------------------------------------
ERROR_LINE = re.compile(r"\b\w+(Error|Exception)\b: ")  # one anywhere in a line
# a line that is an exception's last line: "torch.OutOfMemoryError: ...", "KeyError: 'x'"
EXCEPTION_LINE = re.compile(r"^(?P<type>[A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit|"
                            r"Failure|Timeout|Warning)|[A-Za-z_][\w.]*Error\w*): ?(?P<msg>.*)$")
FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+),? in (?P<func>\S+)')
# argparse's (and click's) refusal of the command line: "prog: error: ..."
USAGE_ERROR = re.compile(r"^\S+: error: \S|^Error: (No such option|Invalid value|Missing)")

# -- collectives (gloo, NCCL, the c10d store) ----------------------------------------
# a peer gone, as a collective says it: gloo's "pair.cc:534] Connection closed by peer",
# NCCL's remote error. A socket's "Connection reset by peer" anywhere else (an HTTP retry,
# a data stream) is no peer of the job's.
PEER_LOST = re.compile(r"(?=.*(?:gloo|pair\.cc|c10d|ProcessGroup|Dist(?:Network|Backend)Error"
                       r"|TCPStore|NCCL)).*Connection (?:closed|reset) by peer"
                       r"|NCCL (?:communicator was aborted|error).*remote|ncclRemoteError")
# wider: any line of a rank that is the echo of another rank's death (its lost
# connection), in the error lines of a run the harness itself launched
COLLATERAL = re.compile(r"Connection (reset|closed|refused)|Broken pipe|DistNetworkError")
GLOO_TIMEOUT = re.compile(r"Timed out waiting (\d+)ms for (\w+) operation|"
                          r"Application timeout caused pair closure")
NCCL_WATCHDOG = re.compile(r"Watchdog caught collective operation timeout: WorkNCCL\("
                           r"SeqNum=(\d+), OpType=(\w+).*?\) ran for (\d+) milliseconds")
NCCL_RANK = re.compile(r"\[(?:PG [^\]]*?)?Rank (\d+)\]")

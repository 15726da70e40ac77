"""Collective errors as gloo and NCCL print them: a peer gone, a timeout, the watchdog.

    ... gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:16283 ...
    ... pair.cc:537] Read error [127.0.0.1]:6317: Connection reset by peer ...
    ... unbound_buffer.cc:78] Timed out waiting 3000ms for recv operation to complete
    [rank3]:[E ProcessGroupNCCL.cpp:632] [Rank 3] Watchdog caught collective operation timeout:
        WorkNCCL(SeqNum=1234, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000)
        ran for 600054 milliseconds before timing out.

A line tagged with a rank ([rank3]:, [Rank 3], "PG ... Rank 3]") gives the rank
that saw it: the waiting one, not the one it waited for.
"""

from __future__ import annotations

from torchchaos.incident.formats import text
from torchchaos.incident.observations import Observation, Source
from torchchaos.incident.readers import Reader
from torchchaos.log_lines import GLOO_TIMEOUT, NCCL_RANK, NCCL_WATCHDOG, PEER_LOST

OPS = {"ALLREDUCE": "all_reduce", "BROADCAST": "broadcast", "ALLGATHER": "all_gather",
       "_ALLGATHER_BASE": "all_gather_into_tensor", "REDUCE_SCATTER": "reduce_scatter",
       "_REDUCE_SCATTER_BASE": "reduce_scatter_tensor", "BARRIER": "barrier",
       "ALLTOALL": "all_to_all", "ALLTOALL_BASE": "all_to_all", "SEND": "send", "RECV": "recv",
       "COALESCED": "coalesced"}


class CollectiveErrors(Reader):
    name = "collectives"
    summary = "gloo and NCCL errors: a peer closed the connection, a receive or watchdog timeout"

    def sniff(self, data: bytes, name: str) -> bool:
        return text.says_any(data, PEER_LOST, GLOO_TIMEOUT, NCCL_WATCHDOG)

    def read(self, data: bytes, name: str) -> list[Observation]:
        found, seen = [], set()
        for number, line in enumerate(text.decode(data).splitlines(), 1):
            rank, body, _ = text.split_tag(line)
            if rank is None and (m := NCCL_RANK.search(body)):
                rank = int(m.group(1))
            key = (rank, body.strip())
            if key in seen:  # torchrun repeats a rank's error in its summary
                continue
            where = Source(name, number)
            if m := NCCL_WATCHDOG.search(body):
                seen.add(key)
                found.append(Observation(
                    "collective_timeout", where, rank=rank, seq=int(m.group(1)),
                    collective=OPS.get(m.group(2).upper(), m.group(2).lower()),
                    detail=f"NCCL watchdog: {m.group(2)} #{m.group(1)} ran for"
                           f" {m.group(3)} ms", extra={"ms": int(m.group(3))}))
            elif m := GLOO_TIMEOUT.search(body):
                seen.add(key)
                said = f"timed out waiting {m.group(1)} ms for {m.group(2)}" if m.group(1) \
                    else "a timeout closed the connection"
                found.append(Observation("collective_timeout", where, rank=rank,
                                         detail=f"gloo: {said}",
                                         extra={"ms": int(m.group(1))} if m.group(1) else {}))
            elif PEER_LOST.search(body):
                seen.add(key)
                found.append(Observation("peer_lost", where, rank=rank,
                                         detail=PEER_LOST.search(body).group(0)))  # type: ignore[union-attr]
        return found

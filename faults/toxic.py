"""toxic: degrade a TCP endpoint of the job through a Toxiproxy server.

Where namespaces and nftables cut a network outright, Toxiproxy
(https://github.com/Shopify/toxiproxy) sits in a TCP path and makes it bad:
slow, thin, stalled, reset or chopped up. The harness creates one proxy per
job on the server given by `TORCHCHAOS_TOXIPROXY` (a URL, default
http://127.0.0.1:8474) in front of the rendezvous store on node 0; nodes 1
and up reach the store through it (node 0's own agent connects directly).
`TORCHCHAOS_TOXIPROXY_UPSTREAM` is the host name under which the server
reaches this machine (default 127.0.0.1; in docker-compose, the harness's
service name). The proxy is deleted when the job ends, on every exit path.

Toxics (`type=`, attributes as Toxiproxy names them):
- `latency`: `latency=` ms added to each chunk (`jitter=` ms);
- `bandwidth`: `rate=` KB/s;
- `timeout`: data stops; the connection closes after `timeout=` ms (0:
  never, a black hole);
- `reset_peer`: the connection is reset after `timeout=` ms;
- `slicer`: data is cut into `average_size=` byte pieces (`size_variation=`)
  sent `delay=` microseconds apart;
- `limit_data`: the connection closes after `bytes=` bytes.
`stream=upstream|downstream` (default downstream: towards the client),
`toxicity=` the fraction of connections hit (default 1). Timing as for
partitions: the trigger starts it, `for=` heals it, `flaps=`/`gap=` repeat it.

Needs `--network host` (the server must reach node 0's store, and the nodes
the server) and 2+ nodes. It talks to the server through `toxiproxy_api`
(every call timed out, every refusal said in one line); a toxic counts as in
force only once the server lists it.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from torchchaos.errors import UsageError
from torchchaos.faults.contract import (
    ClusterJob,
    ClusterMapping,
    HarnessKind,
    JobContext,
    JobResource,
    NotExported,
    ResolvedFault,
)
from torchchaos.faults.params import choice, fraction, non_negative_int, positive_int, seconds
from torchchaos.faults.toxiproxy_api import Server, ToxiproxyError, host_port
from torchchaos.host import netns

URL_ENV = "TORCHCHAOS_TOXIPROXY"
UPSTREAM_ENV = "TORCHCHAOS_TOXIPROXY_UPSTREAM"
DEFAULT_URL = "http://127.0.0.1:8474"
ATTRIBUTES = {
    "latency": ("latency", "jitter"),
    "bandwidth": ("rate",),
    "timeout": ("timeout",),
    "reset_peer": ("timeout",),
    "slicer": ("average_size", "size_variation", "delay"),
    "limit_data": ("bytes",),
}
REQUIRED = {"latency": "latency", "bandwidth": "rate", "limit_data": "bytes",
            "slicer": "average_size"}


def server() -> Server:
    """The Toxiproxy server `TORCHCHAOS_TOXIPROXY` names (a host, an IPv6 one in brackets)."""
    url = os.environ.get(URL_ENV) or DEFAULT_URL
    parts = urlsplit(url if "//" in url else f"http://{url}")
    try:
        host, port = parts.hostname, parts.port
    except ValueError:  # a port that is no number, an IPv6 host without its brackets
        host = port = None
    if not host or (":" in host and "[" not in parts.netloc):
        raise UsageError(f"{URL_ENV}={url!r} is not a URL like {DEFAULT_URL}"
                         " (an IPv6 host in brackets: http://[::1]:8474)")
    return Server(host, port or 8474)


def unreachable_reason() -> str:
    """Why no Toxiproxy server answers, or "" if one does."""
    try:
        server().version()
    except ToxiproxyError as exc:
        return f"{exc}; set {URL_ENV}"
    return ""


@dataclass
class StoreProxy:
    """The job's proxy in front of the rendezvous store (a JobResource)."""

    server: Server
    name: str
    rendezvous_endpoint: str  # where nodes 1.. reach the store
    environ: dict[str, str] = field(default_factory=dict)
    closed: bool = False

    def settle(self) -> None:
        pass

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            try:
                self.server.delete_proxy(self.name)
            except ToxiproxyError:  # the server is gone (and its proxy with it)
                pass


class Toxic(HarnessKind):
    name = "toxic"
    summary = ("degrade the rendezvous store's TCP path through Toxiproxy: latency,"
               " bandwidth, timeout, reset_peer, slicer, limit_data")
    params = {"type": choice(tuple(ATTRIBUTES)), "stream": choice(("downstream", "upstream")),
              "toxicity": fraction, "latency": non_negative_int, "jitter": non_negative_int,
              "rate": positive_int, "timeout": non_negative_int, "average_size": positive_int,
              "size_variation": non_negative_int, "delay": non_negative_int,
              "bytes": non_negative_int, "for": seconds, "flaps": positive_int,
              "gap": seconds}

    def chaos_mesh(self, fault: ResolvedFault, job: ClusterJob) -> ClusterMapping:
        raise NotExported("degrades one TCP endpoint (the rendezvous store) through Toxiproxy;"
                          " NetworkChaos acts on whole pods' traffic, not one port")

    def validate(self, params: dict[str, object]) -> None:
        kind = params.get("type")
        if kind is None:
            raise UsageError(f"toxic needs type= (one of {', '.join(ATTRIBUTES)})")
        given = [k for k in params if k in {a for v in ATTRIBUTES.values() for a in v}]
        foreign = [k for k in given if k not in ATTRIBUTES[str(kind)]]
        if foreign:
            raise UsageError(f"toxic type={kind} has no attribute {foreign[0]}= (its attributes:"
                             f" {', '.join(ATTRIBUTES[str(kind)])})")
        needed = REQUIRED.get(str(kind))
        if needed and needed not in params:
            raise UsageError(f"toxic type={kind} needs {needed}=")
        if ("flaps" in params or "gap" in params) and "for" not in params:
            raise UsageError("toxic: flaps= and gap= need for= (how long each lasts)")

    def check_job(self, params: dict[str, object], nodes: int, network: str) -> None:
        if nodes < 2:
            raise UsageError("toxic needs --nodes 2 or more (it sits between nodes 1.. and"
                             " the store on node 0)")
        if network != "host":
            raise UsageError("toxic needs --network host (the Toxiproxy server must reach"
                             " the nodes)")
        reason = unreachable_reason()
        if reason:
            raise UsageError(f"toxic: {reason}")

    def setup_job(self, faults: list[ResolvedFault], ctx: JobContext) -> JobResource:
        toxiproxy = server()
        upstream = os.environ.get(UPSTREAM_ENV) or "127.0.0.1"
        port = netns.free_port()
        name = f"torchchaos-{ctx.run_id}-{uuid.uuid4().hex[:6]}"
        anywhere = "::" if ":" in toxiproxy.host else "0.0.0.0"  # an IPv6 server listens on v6
        toxiproxy.create_proxy(name, listen=host_port(anywhere, port),
                               upstream=host_port(upstream, ctx.store_port or 0))
        return StoreProxy(toxiproxy, name, host_port(toxiproxy.host, port))

    def cut(self, fault: ResolvedFault, ctx: JobContext
            ) -> tuple[Callable[[], None], dict[str, Any]]:
        resource = ctx.resources.get(self.name)
        if not isinstance(resource, StoreProxy):
            raise ToxiproxyError("the job has no Toxiproxy proxy")
        toxiproxy, proxy = resource.server, resource.name
        kind, params = str(fault.params["type"]), fault.params
        name = f"{fault.id}-{kind}"
        attributes = {a: params[a] for a in ATTRIBUTES[kind] if a in params}
        toxiproxy.add_toxic(proxy, {"name": name, "type": kind,
                                    "stream": params.get("stream", "downstream"),
                                    "toxicity": params.get("toxicity", 1.0),
                                    "attributes": attributes})
        if name not in toxiproxy.toxics(proxy):  # accepted is not in force
            raise ToxiproxyError(f"Toxiproxy at {toxiproxy.where} took toxic {name} but does"
                                 f" not list it on {proxy}")

        def heal() -> None:
            try:
                toxiproxy.delete_toxic(proxy, name)
            except ToxiproxyError:  # gone already (healed, or the proxy deleted)
                pass

        return heal, {"toxic": kind, "attributes": attributes, "proxy": proxy}

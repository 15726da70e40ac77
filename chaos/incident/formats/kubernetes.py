"""Kubernetes: `kubectl get pod -o json` (a Pod or a List of them) and a Kubeflow PyTorchJob.

From a pod: each container's `state.terminated` and `lastState.terminated`
(`exitCode`, `signal`, `reason`: OOMKilled, Error, Completed), `restartCount`,
and a `DisruptionTarget` condition or an `Evicted` status (the node or the
scheduler took the pod away). From a PyTorchJob: its `status.conditions`
(Restarting, Failed, Succeeded with their reason and message).

The pod's node of the job is the index Kubeflow names it by (`<job>-master-0` is
node 0, `<job>-worker-<i>` node i+1) or the last number of its name.
"""

from __future__ import annotations

import re
from typing import Any

from torchchaos.incident.formats.errorfile import load_json
from torchchaos.incident.observations import Observation, Source, signal_of_exitcode
from torchchaos.incident.readers import BadArtefact, Reader

WORKER = re.compile(r"-(master|worker)-(\d+)$")
LAST_NUMBER = re.compile(r"(\d+)$")


class KubernetesStatus(Reader):
    name = "kubernetes"
    summary = "kubectl get pod -o json, and a Kubeflow PyTorchJob's status"
    structured = True

    def sniff(self, data: bytes, name: str) -> bool:
        head = data[:65536]
        return data.lstrip()[:1] == b"{" and b'"kind"' in head and \
            (b'"Pod"' in head or b'"PyTorchJob"' in head or b'"List"' in head
             and b'"Pod"' in data)

    def read(self, data: bytes, name: str) -> list[Observation]:
        doc = load_json(data)
        if not isinstance(doc, dict):
            raise BadArtefact("a Kubernetes object must be a JSON object")
        if doc.get("kind") == "List":
            items = doc.get("items")
            if not isinstance(items, list):
                raise BadArtefact("a List without items")
            return [o for i, item in enumerate(items)
                    for o in _object(item, name, f"items[{i}].")]
        return _object(doc, name, "")


def _object(doc: Any, name: str, at: str) -> list[Observation]:
    if not isinstance(doc, dict):
        raise BadArtefact(f"{at or 'the document'} is not an object")
    if doc.get("kind") == "Pod":
        return _pod(doc, name, at)
    if doc.get("kind") == "PyTorchJob":
        return _pytorchjob(doc, name, at)
    raise BadArtefact(f"kind {doc.get('kind')!r} is not a Pod or a PyTorchJob")


def _mapping(doc: Any, key: str) -> dict[str, Any]:
    value = doc.get(key) if isinstance(doc, dict) else None
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise BadArtefact(f"{key} is not an object")
    return value


def _pod(pod: dict[str, Any], name: str, at: str) -> list[Observation]:
    pod_name = str(_mapping(pod, "metadata").get("name", ""))
    node = _node_index(pod_name)
    status = _mapping(pod, "status")
    found: list[Observation] = []
    if status.get("reason") in ("Evicted", "NodeLost", "Preempting", "Terminated"):
        found.append(Observation("node_lost", Source(name, key=f"{at}status.reason"),
                                 reason=str(status["reason"]), host=pod_name,
                                 detail=str(status.get("message", ""))[:200],
                                 extra={"node": node}))
    for i, cond in enumerate(status.get("conditions") or []):
        if isinstance(cond, dict) and cond.get("type") == "DisruptionTarget" \
                and cond.get("status") == "True":
            found.append(Observation("node_lost", Source(name, key=f"{at}status.conditions[{i}]"),
                                     reason=str(cond.get("reason", "DisruptionTarget")),
                                     host=pod_name, detail=str(cond.get("message", ""))[:200],
                                     extra={"node": node}))
    statuses = status.get("containerStatuses") or []
    if not isinstance(statuses, list):
        raise BadArtefact("status.containerStatuses is not a list")
    for c, container in enumerate(statuses):
        if not isinstance(container, dict):
            raise BadArtefact(f"status.containerStatuses[{c}] is not an object")
        base = f"{at}status.containerStatuses[{c}]"
        restarts = container.get("restartCount", 0)
        for which in ("lastState", "state"):
            ended = _mapping(_mapping(container, which), "terminated")
            if not ended:
                continue
            code, sig = ended.get("exitCode"), ended.get("signal")
            code = code if isinstance(code, int) else None
            signal = signal_of_exitcode(-sig) if isinstance(sig, int) and sig else \
                signal_of_exitcode(code)
            reason = str(ended.get("reason", "")) or None
            what = "oom_kill" if reason == "OOMKilled" else "exit"
            found.append(Observation(what, Source(name, key=f"{base}.{which}.terminated"),
                                     host=pod_name, exitcode=code, signal=signal,
                                     reason=reason, detail=str(ended.get("message", ""))[:200],
                                     attempt=restarts if which == "state" else restarts - 1,
                                     extra={"node": node, "restarts": restarts,
                                            "replica": _replica(pod_name)}))
        if isinstance(restarts, int) and restarts > 0:
            found.append(Observation("restart", Source(name, key=f"{base}.restartCount"),
                                     host=pod_name, detail=f"{restarts} container restart(s)",
                                     extra={"node": node, "restarts": restarts}))
    return found


def _pytorchjob(job: dict[str, Any], name: str, at: str) -> list[Observation]:
    found = []
    for i, cond in enumerate(_mapping(job, "status").get("conditions") or []):
        if not isinstance(cond, dict):
            raise BadArtefact(f"status.conditions[{i}] is not an object")
        kind, state = cond.get("type"), cond.get("status")
        where = Source(name, key=f"{at}status.conditions[{i}]")
        text = f"{kind}: {cond.get('reason', '')} {cond.get('message', '')}".strip()[:200]
        if kind == "Restarting" and state == "True":
            found.append(Observation("restart", where, detail=text))
        elif kind in ("Failed", "Succeeded") and state == "True":
            failed = [m.group(2).lower() for m in REPLICAS_FAILED.finditer(text)]
            found.append(Observation("job_state", where, reason=kind, detail=text,
                                     extra={"failed_replicas": failed} if failed else {}))
    return found


# the operator's word on which replicas failed: "PyTorchJob gpt2 is failed because 1 Worker
# replica(s) failed." (the others it then tore down, SIGTERM, exit 143)
REPLICAS_FAILED = re.compile(r"(\d+) (Master|Worker) replica\(s\) failed")


def _replica(pod_name: str) -> str | None:
    m = WORKER.search(pod_name)
    return m.group(1) if m else None


def _node_index(pod_name: str) -> int | None:
    if m := WORKER.search(pod_name):
        return int(m.group(2)) + (1 if m.group(1) == "worker" else 0)
    m = LAST_NUMBER.search(pod_name)
    return int(m.group(1)) if m else None

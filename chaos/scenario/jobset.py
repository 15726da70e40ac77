"""A scenario's job as runnable Kubernetes JobSets whose pods run `torchchaos node`.

`torchchaos export FILE --jobset DIR` writes two files beside what Chaos Mesh
gets:

- `DIR/reference.yaml`: a JobSet (jobset.x-k8s.io/v1alpha2) of one Indexed Job
  with a pod per node, each running `torchchaos node --node-rank
  $JOB_COMPLETION_INDEX` without faults (run id `reference`);
- `DIR/chaos.yaml`: the same job with the faults Chaos Mesh has no counterpart
  for (kills of ranks, bit flips, hangs...: `--fault` of `torchchaos node`,
  which injects them from inside), after which node 0 judges the run
  (`torchchaos gather`, the verdict table in its log), then the Chaos Mesh
  Workflow of the node-level faults, whose offsets count from when it is
  applied: together with the JobSet.

Node 0 hosts the rendezvous store; the others reach it by the DNS name JobSet
gives its pod (`NAME-node-0-0.NAME`). The pods share a ReadWriteMany volume
(`claim`) at `/shared`, where `torchchaos node` keeps the run directories. The
pods carry the label `batch.kubernetes.io/job-completion-index`, which is the
node label the Chaos Mesh objects select by.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torchchaos.scenario import schema
from torchchaos.scenario.chaosmesh import ManifestError
from torchchaos.scenario.model import Scenario

API_VERSION = "jobset.x-k8s.io/v1alpha2"
NODE_LABEL = "batch.kubernetes.io/job-completion-index"  # set on every Indexed Job pod
REPLICATED_JOB = "node"
STORE_PORT = 29500
SHARED = "/shared"


@dataclass(frozen=True)
class JobOptions:
    name: str  # the JobSets are NAME-reference and NAME-chaos
    namespace: str
    image: str  # holds torchchaos and the script at its path relative to the working dir
    claim: str  # a ReadWriteMany PersistentVolumeClaim every pod mounts at /shared


def script_path(script: str) -> str:
    """The script as the pods name it: relative to where export runs (the image's
    working directory holds the same tree), absolute if it lies elsewhere."""
    relative = os.path.relpath(script)
    return script if relative.startswith("..") else relative


def jobset(scenario: Scenario, options: JobOptions, run_id: str, faults: list[str],
           gather: bool) -> dict[str, Any]:
    """One JobSet running the scenario's job under `torchchaos node` on every node."""
    name = f"{options.name}-{run_id}"
    node = [
        "torchchaos", "node", "--shared", f"{SHARED}/{options.name}",
        "--node-rank", "$JOB_COMPLETION_INDEX", "--nnodes", str(scenario.nodes),
        "--nproc", str(scenario.nproc),
        "--rdzv-endpoint", f"{name}-{REPLICATED_JOB}-0-0.{name}:{STORE_PORT}",
        "--run-id", run_id, *[a for f in faults for a in ("--fault", f)],
        "--seed", str(scenario.seed), "--timeout", f"{scenario.timeout:g}",
        "--max-restarts", str(scenario.max_restarts),
        "--max-relaunches", str(scenario.max_relaunches),
        *[a for link in scenario.links for a in ("--link", script_path(link))],
        "--", script_path(scenario.script), *scenario.args]
    script = " ".join(w if w.startswith("$") else shlex.quote(w) for w in node)
    if gather:  # this node's exit is not the verdict: node 0 judges the whole run
        script = (f"{script} || true\nif [ \"$JOB_COMPLETION_INDEX\" = 0 ]; then"
                  f" torchchaos gather {SHARED}/{options.name}/{run_id}; fi")
    container = {"name": "torchchaos", "image": options.image, "command": ["sh", "-c", script],
                 "ports": [{"containerPort": STORE_PORT, "name": "rendezvous"}],
                 "volumeMounts": [{"name": "shared", "mountPath": SHARED}]}
    if any(f.startswith("storage:") for f in faults):  # the fault filesystem: FUSE
        container["securityContext"] = {"privileged": True}
    job = {"completionMode": "Indexed", "completions": scenario.nodes,
           "parallelism": scenario.nodes, "backoffLimit": 0,
           "template": {"spec": {
               "restartPolicy": "Never", "containers": [container],
               "volumes": [{"name": "shared",
                            "persistentVolumeClaim": {"claimName": options.claim}}]}}}
    return {"apiVersion": API_VERSION, "kind": "JobSet",
            "metadata": {"name": name, "namespace": options.namespace},
            "spec": {"network": {"enableDNSHostnames": True},
                     "replicatedJobs": [{"name": REPLICATED_JOB, "replicas": 1,
                                         "template": {"spec": job}}]}}


def validate(manifest: Any) -> list[str]:
    """Every way a JobSet breaks schemas/jobset.json; [] if none."""
    return schema.errors("jobset", manifest)


def write(scenario: Scenario, options: JobOptions, kept: list[str], chaos_mesh: str,
          directory: Path) -> list[Path]:
    """DIR/reference.yaml and DIR/chaos.yaml (the JobSet, then `chaos_mesh`: the
    rendered Chaos Mesh manifests). A JobSet that breaks the schema is never written."""
    import yaml

    sets = [jobset(scenario, options, "reference", [], False),
            jobset(scenario, options, "chaos", kept, True)]
    for manifest in sets:
        errors = validate(manifest)
        if errors:
            raise ManifestError(f"the JobSet {manifest['metadata']['name']} does not"
                                f" validate: {'; '.join(errors[:3])}")
    directory.mkdir(parents=True, exist_ok=True)
    how = (f"# kubectl apply -f reference.yaml; kubectl wait --for=condition=Completed"
           f" jobset/{options.name}-reference --timeout=1h;"
           " kubectl apply -f chaos.yaml\n")
    reference = directory / "reference.yaml"
    reference.write_text(f"# the fault-free run of {options.name}, first\n{how}"
                         + yaml.safe_dump(sets[0], sort_keys=False, width=100))
    chaos = directory / "chaos.yaml"
    injected = ", ".join(kept) or "none"
    chaos.write_text(f"# the run with faults of {options.name}; torchchaos injects: {injected};"
                     f" node 0's log ends with the verdict\n{how}"
                     + yaml.safe_dump(sets[1], sort_keys=False, width=100)
                     + "---\n" + chaos_mesh)
    return [reference, chaos]

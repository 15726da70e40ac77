"""The cluster's accounting: a MariaDB server of its own and slurmdbd, for `sacct`.

The database lives in the cluster's folder (`db/`), made by `mariadb-install-db`
(under a second on this machine), served on 127.0.0.1 at a port of the cluster's,
and goes with the folder. slurmctld registers the cluster with slurmdbd itself
when it starts, so slurmdbd must answer first.
"""

from __future__ import annotations

import subprocess

from torchchaos.errors import CannotJudge
from torchchaos.host.slurm import daemons
from torchchaos.host.slurm.config import Layout, dbd_conf

PROGRAMS = ("mariadbd", "mariadb-install-db", "slurmdbd", "sacct", "sacctmgr")


def start(layout: Layout, marks: dict[str, str], timeout: float) -> list[subprocess.Popen]:
    """The database, then slurmdbd, each waited for: their processes."""
    _install_database(layout)
    database = daemons.start(_server(layout), layout.log("mariadb"), marks)
    daemons.wait_until(lambda: daemons.listening(layout.ports.database), "the database",
                       database, layout.log("mariadb"), timeout)
    layout.dbd_conf.write_text(dbd_conf(layout))
    layout.dbd_conf.chmod(0o600)  # slurmdbd refuses a configuration others can read
    dbd = daemons.start(["slurmdbd", "-D"], layout.log("slurmdbd-out"),
                        {**marks, "SLURM_CONF": str(layout.slurm_conf)})
    # listening is not ready: slurmctld dies ("we have no TRES from it") if it asks
    # before slurmdbd has made its tables; sacctmgr's answer says they are there
    conf = {"SLURM_CONF": str(layout.slurm_conf)}
    daemons.wait_until(lambda: daemons.answers(["sacctmgr", "-n", "-P", "show", "tres"], conf,
                                               "cpu"), "slurmdbd", dbd, layout.log("slurmdbd"),
                       timeout)
    return [database, dbd]


def _install_database(layout: Layout) -> None:
    layout.database.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mariadb-install-db", "--no-defaults", f"--datadir={layout.database}",
         "--auth-root-authentication-method=normal", "--skip-test-db", "--user=root"],
        capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()
        raise CannotJudge(f"mariadb-install-db failed: {said[-1] if said else done.returncode}")


def _server(layout: Layout) -> list[str]:
    return ["mariadbd", "--no-defaults", f"--datadir={layout.database}",
            f"--socket={layout.root / 'run' / 'mariadb.sock'}",
            f"--port={layout.ports.database}", "--bind-address=127.0.0.1",
            f"--pid-file={layout.pid_file('mariadb')}", "--user=root",
            "--skip-name-resolve", "--innodb-buffer-pool-size=32M",
            "--innodb-log-file-size=8M", f"--log-error={layout.log('mariadb')}"]

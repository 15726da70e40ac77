"""The cluster's accounting: a MariaDB server of its own and slurmdbd, for `sacct`.

The database lives in the cluster's folder (`db/`), made by `mariadb-install-db`
(under a second on this machine), served on 127.0.0.1 at a port of the cluster's,
and goes with the folder. slurmctld registers the cluster with slurmdbd itself
when it starts, so slurmdbd must answer first.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from torchchaos.errors import CannotJudge
from torchchaos.host.slurm import daemons
from torchchaos.host.slurm.config import Layout, dbd_conf

PROGRAMS = ("mariadbd", "mariadb-install-db", "mariadb", "slurmdbd", "sacct", "sacctmgr")


def start(layout: Layout, marks: dict[str, str], timeout: float) -> list[subprocess.Popen]:
    """The database, then slurmdbd, each waited for: their processes."""
    _install_database(layout)
    database = daemons.start(_server(layout), layout.log("mariadb"), marks)
    # listening is not answering: under CI's load slurmdbd, started once the port was
    # open, died with "Unable to initialize accounting_storage/mysql"; a query says
    daemons.wait_until(lambda: daemons.answers(_query(layout, "SELECT 'up'"), {}, "up"),
                       "the database", database, layout.log("mariadb"), timeout)
    layout.dbd_conf.write_text(dbd_conf(layout))
    layout.dbd_conf.chmod(0o600)  # slurmdbd refuses a configuration others can read
    return [database, _start_dbd(layout, marks, timeout)]


def _start_dbd(layout: Layout, marks: dict[str, str], timeout: float) -> subprocess.Popen:
    """slurmdbd, once its tables are made; started again once if it died while starting
    (its first connection to a database under load can fail)."""
    conf = {"SLURM_CONF": str(layout.slurm_conf)}
    dbd = daemons.start(["slurmdbd", "-D"], layout.log("slurmdbd-out"), {**marks, **conf})
    try:
        _wait_for_tables(layout, dbd, conf, timeout)
    except CannotJudge:
        if dbd.poll() is None:  # alive and not ready: no second start would help
            raise
        dbd = daemons.start(["slurmdbd", "-D"], layout.log("slurmdbd-out"), {**marks, **conf})
        _wait_for_tables(layout, dbd, conf, timeout)
    return dbd


def _wait_for_tables(layout: Layout, dbd: subprocess.Popen, conf: dict[str, str],
                     timeout: float) -> None:
    # listening is not ready: slurmctld dies ("we have no TRES from it") if it asks
    # before slurmdbd has made its tables; sacctmgr's answer says they are there
    daemons.wait_until(lambda: daemons.answers(["sacctmgr", "-n", "-P", "show", "tres"], conf,
                                               "cpu"), "slurmdbd", dbd, layout.log("slurmdbd"),
                       timeout)


def _query(layout: Layout, sql: str) -> list[str]:
    """The mariadb client's command for one query as slurmdbd connects (TCP, root)."""
    return ["mariadb", "--no-defaults", "-h", "127.0.0.1", "-P", str(layout.ports.database),
            "-u", "root", "-N", "-e", sql]


def _install_database(layout: Layout) -> None:
    layout.database.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mariadb-install-db", "--no-defaults", f"--datadir={layout.database}",
         "--auth-root-authentication-method=normal", "--skip-test-db", "--user=root",
         # its bootstrap server's files in the folder, not the machine's defaults: two
         # clusters made at once (two pytest workers) aborted on them
         f"--socket={layout.root / 'run' / 'mariadb-install.sock'}",
         f"--pid-file={layout.root / 'run' / 'mariadb-install.pid'}",
         f"--tmpdir={_tmpdir(layout)}"],
        capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()
        errors = [line for line in said if "[ERROR]" in line and "Aborting" not in line]
        raise CannotJudge("mariadb-install-db failed: "
                          f"{(errors or said or [str(done.returncode)])[0]}")


def _tmpdir(layout: Layout) -> Path:
    """The database's temporary tables in the cluster's folder, not in TMPDIR: a deep job
    TMPDIR another test emptied failed the install ("Could not remove temporary table")."""
    folder = layout.root / "run" / "mariadb-tmp"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _server(layout: Layout) -> list[str]:
    return ["mariadbd", "--no-defaults", f"--datadir={layout.database}",
            f"--tmpdir={_tmpdir(layout)}",
            f"--socket={layout.root / 'run' / 'mariadb.sock'}",
            f"--port={layout.ports.database}", "--bind-address=127.0.0.1",
            f"--pid-file={layout.pid_file('mariadb')}", "--user=root",
            "--skip-name-resolve", "--innodb-buffer-pool-size=32M",
            "--innodb-log-file-size=8M", f"--log-error={layout.log('mariadb')}"]

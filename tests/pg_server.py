"""A throwaway PostgreSQL cluster for the test run.

``initdb`` into a temporary directory, ``postgres`` on a free port of
127.0.0.1 (TCP only, trust authentication, superuser ``postgres``), stopped
and deleted when the run ends. Durability is pointless for a cluster that
lives as long as one test run, so ``fsync`` is off.

The server binaries are looked up on ``PATH`` and then in Debian's
``/usr/lib/postgresql/<version>/bin`` (newest version first). PostgreSQL
refuses to run as root; as root the cluster runs as the ``postgres`` user
(created by Debian's package) or else ``nobody``.

A cluster may get a **streaming standby** (:meth:`ThrowawayCluster.start_standby`:
``pg_basebackup -R`` from it, then ``postgres`` on a port of its own),
synchronous by default (``synchronous_standby_names = '*'`` on the primary,
so a commit returns only once the standby has it). The failover tests kill
the primary (:meth:`ThrowawayCluster.kill`, SIGKILL to the postmaster) and
promote the standby (:meth:`ThrowawayCluster.promote`); :func:`multi_host_url`
names both in one URL, as a gateway is given them in production.

Used by ``tests/conftest.py`` when ``LEDGERQ_TEST_PG`` names no server;
``python -m tests.pg_server`` starts one by hand and prints its URL.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psycopg

DEBIAN_ROOT = Path("/usr/lib/postgresql")
STARTUP_TIMEOUT_S = 60.0
INSTALL_HINT = "apt-get install -y postgresql, or set LEDGERQ_TEST_PG to a server's URL"


class ClusterError(RuntimeError):
    """The throwaway cluster could not be created or started."""


def find_bindir() -> Path | None:
    """The directory holding ``initdb`` and ``postgres``, or None."""
    initdb = shutil.which("initdb")
    if initdb is not None and Path(initdb).resolve().with_name("postgres").exists():
        return Path(initdb).resolve().parent

    def version(path: Path) -> tuple[int, ...]:
        return tuple(int(p) for p in re.findall(r"\d+", path.name)) or (0,)

    if DEBIAN_ROOT.is_dir():
        for candidate in sorted(DEBIAN_ROOT.iterdir(), key=version, reverse=True):
            bindir = candidate / "bin"
            if (bindir / "initdb").exists() and (bindir / "postgres").exists():
                return bindir
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _run_as() -> pwd.struct_passwd | None:
    """The unprivileged account to run the cluster as when we are root."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    raise ClusterError("running as root and neither a 'postgres' nor a 'nobody' user exists")


def _die_with_parent() -> Callable[[], None] | None:
    """Linux: the postmaster gets SIGQUIT (immediate shutdown) if the test run is killed."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
    pr_set_pdeathsig = 1

    def hook() -> None:
        libc.prctl(pr_set_pdeathsig, signal.SIGQUIT, 0, 0, 0)

    return hook


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_leftovers(older_than_s: float = 600.0) -> None:
    """Delete clusters left behind by killed runs: old, and no live postmaster.

    A run killed outright takes its server with it (``PR_SET_PDEATHSIG``) but
    cannot delete the directory; the next run does.
    """
    now = time.time()
    for root in Path(tempfile.gettempdir()).glob("ledgerq-pg-*"):
        try:
            if now - root.stat().st_mtime < older_than_s:
                continue
            pidfile = root / "data" / "postmaster.pid"
            if pidfile.exists() and _alive(int(pidfile.read_text().split()[0])):
                continue
        except (OSError, ValueError, IndexError):
            continue
        shutil.rmtree(root, ignore_errors=True)


class ThrowawayCluster:
    """One PostgreSQL cluster in a temporary directory; ``url`` reaches its ``postgres`` db."""

    def __init__(
        self,
        bindir: Path,
        *,
        settings: dict[str, str] | None = None,
        primary: ThrowawayCluster | None = None,
    ) -> None:
        self.bindir = bindir
        #: The cluster this one streams from (a standby), else None.
        self.primary = primary
        self.settings = {
            "fsync": "off",
            "full_page_writes": "off",
            "max_connections": "200",
            **(settings or {}),
        }
        self.root: Path | None = None
        self.port = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._account = _run_as()

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _spawn_kwargs(self) -> dict[str, object]:
        if self._account is None:
            return {}
        return {
            "user": self._account.pw_uid,
            "group": self._account.pw_gid,
            "extra_groups": [],
        }

    @property
    def data(self) -> Path:
        assert self.root is not None, "start the cluster first"
        return self.root / "data"

    @property
    def pid(self) -> int | None:
        """The postmaster's pid while it runs."""
        return None if self._proc is None else self._proc.pid

    def start(self) -> str:
        sweep_leftovers()
        self.root = Path(tempfile.mkdtemp(prefix="ledgerq-pg-"))
        if self._account is not None:
            os.chown(self.root, self._account.pw_uid, self._account.pw_gid)
        if self.primary is not None:
            self._base_backup()
        else:
            self._init()
        last_error = ""
        for _ in range(5):  # a free port can be taken between probe and bind
            self.port = _free_port()
            try:
                self._start_server(self.data)
                return self.url
            except ClusterError as exc:
                last_error = str(exc)
        self.stop()
        raise ClusterError(last_error)

    def _base_backup(self) -> None:
        """The primary's data, copied over a replication connection, with
        ``standby.signal`` and ``primary_conninfo`` written (``-R``)."""
        assert self.primary is not None
        backup = subprocess.run(
            [
                str(self.bindir / "pg_basebackup"),
                "-D",
                str(self.data),
                "-h",
                "127.0.0.1",
                "-p",
                str(self.primary.port),
                "-U",
                "postgres",
                "-R",
                "-X",
                "stream",
                "-c",
                "fast",
                "--no-sync",
            ],
            cwd=self.root,
            capture_output=True,
            check=False,
            **self._spawn_kwargs(),  # type: ignore[call-overload]
        )
        if backup.returncode != 0:
            self.stop()
            raise ClusterError(
                f"pg_basebackup failed: {backup.stderr.decode(errors='replace')[-1500:]}"
            )

    def _init(self) -> None:
        data = self.data
        init = subprocess.run(
            [
                str(self.bindir / "initdb"),
                "-D",
                str(data),
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
                "--no-instructions",
            ],
            cwd=self.root,
            capture_output=True,
            check=False,
            **self._spawn_kwargs(),  # type: ignore[call-overload]
        )
        if init.returncode != 0:
            self.stop()
            raise ClusterError(f"initdb failed: {init.stderr.decode(errors='replace')[-1500:]}")

    def _start_server(self, data: Path) -> None:
        assert self.root is not None
        log = self.root / f"postgres-{self.port}.log"
        args = [str(self.bindir / "postgres"), "-D", str(data), "-p", str(self.port)]
        args += ["-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories="]
        for key, value in self.settings.items():
            args += ["-c", f"{key}={value}"]
        with open(log, "wb") as out:
            if self._account is not None:
                os.chown(log, self._account.pw_uid, self._account.pw_gid)
            self._proc = subprocess.Popen(
                args,
                cwd=self.root,
                stdout=out,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent(),
                **self._spawn_kwargs(),  # type: ignore[call-overload]
            )
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                self._proc = None
                raise ClusterError(f"postgres exited at start: {log.read_text()[-1500:]}")
            try:
                with psycopg.connect(self.url, connect_timeout=2) as conn:
                    conn.execute("SELECT 1")
                return
            except psycopg.OperationalError:
                time.sleep(0.05)  # polling the server's readiness, not a test's timing
        self._terminate()
        raise ClusterError(f"postgres did not accept connections within {STARTUP_TIMEOUT_S:.0f} s")

    def start_standby(self, *, synchronous: bool = True) -> ThrowawayCluster:
        """A hot standby streaming from this cluster, started; with
        ``synchronous``, this cluster then commits only once the standby has
        the commit (``synchronous_standby_names = '*'``)."""
        standby = ThrowawayCluster(self.bindir, settings=self.settings, primary=self)
        standby.start()
        try:
            if synchronous:
                with psycopg.connect(self.url, autocommit=True) as conn:
                    conn.execute("ALTER SYSTEM SET synchronous_standby_names = '*'")
                    conn.execute("SELECT pg_reload_conf()")
                self._wait_for(
                    "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'",
                    "the standby to replicate synchronously",
                )
        except BaseException:
            standby.stop()
            raise
        return standby

    def _wait_for(self, query: str, what: str) -> None:
        """Poll this cluster until ``query`` answers a true value."""
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            with psycopg.connect(self.url, autocommit=True) as conn:
                row = conn.execute(query.encode()).fetchone()
            if row and row[0]:
                return
            time.sleep(0.05)  # polling the server's state, not a test's timing
        raise ClusterError(f"timed out waiting for {what}")

    def kill(self) -> None:
        """SIGKILL the postmaster, as a machine's crash would end it: its port
        closes at once and its backends exit as they notice. The files stay
        (``stop`` deletes them)."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(30)

    def promote(self) -> None:
        """Make this standby a primary (``pg_ctl promote``), waiting until it
        accepts writes."""
        done = subprocess.run(
            [str(self.bindir / "pg_ctl"), "promote", "-w", "-t", "60", "-D", str(self.data)],
            cwd=self.root,
            capture_output=True,
            check=False,
            **self._spawn_kwargs(),  # type: ignore[call-overload]
        )
        if done.returncode != 0:
            raise ClusterError(f"pg_ctl promote failed: {done.stderr.decode(errors='replace')}")
        self._wait_for("SELECT NOT pg_is_in_recovery()", "the promoted standby to accept writes")
        self.primary = None

    def _terminate(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGINT)  # fast shutdown: end sessions, no checkpoint wait
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGQUIT)
            proc.wait(30)

    def stop(self, *, remove_in_background: bool = False) -> None:
        """Stop the server and delete its directory; ``remove_in_background``:
        by a detached ``rm`` this process does not wait for (a run's cluster
        holds a database per test, hundreds of thousands of files)."""
        self._terminate()
        if self.root is not None:
            if remove_in_background:
                # The shell returns at once, leaving rm to run on its own.
                subprocess.run(
                    ["sh", "-c", 'rm -rf "$1" </dev/null >/dev/null 2>&1 &', "sh", str(self.root)],
                    check=True,
                    start_new_session=True,
                )
            else:
                shutil.rmtree(self.root, ignore_errors=True)
            self.root = None


def multi_host_url(*clusters: ThrowawayCluster, dbname: str = "postgres") -> str:
    """One URL naming every cluster's host, asking for the one that accepts
    writes (``target_session_attrs=read-write``): what a gateway is given
    for a primary and its standbys."""
    hosts = ",".join(f"127.0.0.1:{c.port}" for c in clusters)
    return f"postgresql://postgres@{hosts}/{dbname}?target_session_attrs=read-write"


def main() -> None:
    bindir = find_bindir()
    if bindir is None:
        raise SystemExit(f"no PostgreSQL server binaries found ({INSTALL_HINT})")
    cluster = ThrowawayCluster(bindir)
    print(cluster.start(), flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        signal.pause()
    cluster.stop()


if __name__ == "__main__":
    main()

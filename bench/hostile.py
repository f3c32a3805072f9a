"""The pipeline's throughput under hostile clients, as a share of the same run
without them.

Two ``ledgerq serve`` on one PostgreSQL database and a ``ledgerq node`` (real
processes, ``bench._cluster``), a token configured. The same ordered intkey
workload (``--services`` × ``--per-service`` batches, one list per service,
services spread over both gateways) is run twice, each time on a fresh
database and fresh processes: once quiet, once under the hostile load of
``bench._hostile`` — ``--slow`` connections dribbling headers,
``--long-polls`` status requests of ``--poll-ids`` ids parked with ``wait``,
``--large-posts`` clients posting a BatchList of about 10 MiB over and over
(verified to its last batch, then refused), a client without the token
trying every route (every client on 127.0.0.1: the cap per address is off
for these two runs). Throughput is batches from the first POST to the last
batch final. Then the attacks of :mod:`bench._attacks` (gzip bombs, 2,048
idle sockets from one address), on a gateway and on its node, caps at
their defaults. The run also checks that no claim lapsed (no gateway voided
another's claim) and that every batch was committed once, in order.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import click
import psycopg

from bench import _attacks as _attacks_mod
from bench import report
from bench._cluster import Cluster, Workload, check_invariants, install_fence_audit
from bench._hostile import (
    CpuProbe,
    HostileSizes,
    LoadProcess,
    broken_list,
    claims_voided,
    descendants,
    flow,
)
from bench.e2e import drop_pg_database, fresh_pg_database
from ledgerq.store import open_store

TOKEN = "bench-hostile-token-0123456789"


async def _migrate(url: str) -> None:
    store = await open_store(url)
    await store.close()


def _backends(db: str) -> list[int]:
    """The gateways' PostgreSQL backends (they connect as ``gw-…``)."""
    with psycopg.connect(db, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
            " AND application_name LIKE 'gw-%'"
        ).fetchall()
    return [pid for (pid,) in rows]


class _Profiles:
    """``py-spy record`` (if installed) on each gateway during the flow,
    collapsed stacks written to ``directory``."""

    def __init__(self, directory: Path | None, phase: str, pids: dict[str, int]) -> None:
        self.directory = directory
        self.phase = phase
        self.pids = pids
        self._procs: list[subprocess.Popen[bytes]] = []

    def start(self) -> None:
        if self.directory is None:
            return
        spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        self.directory.mkdir(parents=True, exist_ok=True)
        for name, pid in self.pids.items():
            out = self.directory / f"{self.phase}-{name}.txt"
            self._procs.append(
                subprocess.Popen(
                    [
                        *(spy, "record", "--pid", str(pid), "--rate", "100", "--nonblocking"),
                        *("--format", "raw", "--output", str(out)),
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )

    def stop(self) -> None:
        for p in self._procs:
            p.send_signal(signal.SIGINT)
        for p in self._procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
        self._procs = []


def _probe(cluster: Cluster, db: str, profile: Path | None, phase: str) -> CpuProbe:
    gateways = [g.proc.pid for g in cluster.gateways.values()]
    node = cluster.ledger.proc.pid
    profiles = _Profiles(profile, phase, {name: g.proc.pid for name, g in cluster.gateways.items()})
    return CpuProbe(
        {
            "gateways": lambda: gateways,
            "decoders": lambda: descendants(gateways) - set(gateways),
            "node": lambda: descendants([node]),
            "PostgreSQL": lambda: _backends(db),
        },
        on_start=profiles.start,
        on_stop=profiles.stop,
    )


def _phase(
    pg_admin: str,
    sizes: HostileSizes,
    services: int,
    per_service: int,
    hostile: bool,
    large: bytes,
    profile: Path | None = None,
) -> tuple[float, str, int, list[str]]:
    """One run: (batches/s, hostile outcome summary, claims voided, problems)."""
    db = fresh_pg_database(pg_admin)
    try:
        asyncio.run(_migrate(db))
        install_fence_audit(db)
        with tempfile.TemporaryDirectory(prefix="ledgerq-hostile-") as tmp:
            env = {
                "LEDGERQ_AUTH_TOKEN": TOKEN,
                # Room for every long-poll on the two gateways.
                "LEDGERQ_MAX_WAITERS": str(max(1_000, sizes.long_polls)),
                # Every client here, hostile or not, is on 127.0.0.1: no cap per address.
                "LEDGERQ_HTTP_MAX_CONNECTIONS_PER_ADDRESS": "0",
            }
            cluster = Cluster(Path(tmp), db, env=env)
            try:
                cluster.start_node()
                gateways = [cluster.start_gateway("a"), cluster.start_gateway("b")]
                urls = [g.url for g in gateways]
                workload = Workload(services=services, batches_per_service=per_service)
                load = (
                    LoadProcess(urls, sizes, workload.all_ids(), large_body=large, token=TOKEN)
                    if hostile
                    else None
                )
                probe = _probe(cluster, db, profile, "hostile" if hostile else "quiet")
                result = asyncio.run(flow(urls, db, workload, load=load, token=TOKEN, probe=probe))
                problems = check_invariants(db, cluster.ledger.url, workload)
                voided = claims_voided([g.log_path.read_text(errors="replace") for g in gateways])
                summary = (
                    result.report.summary()
                    if result.report is not None
                    else f"quiet: posting took {result.posting_s:.1f} s of {result.elapsed_s:.1f} s"
                )
                if result.report is not None:
                    answered, at_once = result.report.polls_between(result.began, result.ended)
                    summary += (
                        f"; during the flow ({result.elapsed_s:.1f} s) {answered} long-poll "
                        f"answers, {at_once} of them within a second of asking; posting took "
                        f"{result.posting_s:.1f} s; answers per second of the flow, waited/at "
                        f"once: {result.poll_timeline()}"
                    )
                summary += f"; CPU during the flow: {result.cpu_summary()}"
                if result.report is not None and result.report.unclear():
                    problems.append(f"unclear answers: {result.report.unclear()}")
                return result.batches_per_s, summary, voided, problems
            finally:
                cluster.close()
    finally:
        drop_pg_database(pg_admin, db)


TENANT_A = "bench-tenant-a-token-0123456789"
TENANT_B = "bench-tenant-b-token-0123456789"


def _attacks(pg_admin: str, seconds: float) -> tuple[str, list[str]]:
    """The gzip-bomb and idle-socket attacks on a gateway (two tenants' scoped
    tokens) and on its node: a table, and the targets missed."""
    db = fresh_pg_database(pg_admin)
    rows: list[tuple[str, ...]] = []
    missed: list[str] = []
    try:
        asyncio.run(_migrate(db))
        with tempfile.TemporaryDirectory(prefix="ledgerq-attacks-") as tmp:
            tokens = json.dumps(
                [
                    {"name": "a", "token": TENANT_A, "services": ["a-*"]},
                    {"name": "b", "token": TENANT_B, "services": ["b-*"]},
                ]
            )
            cluster = Cluster(Path(tmp), db, env={"LEDGERQ_AUTH_TOKENS": tokens})
            try:
                node = cluster.start_node()
                gateway = cluster.start_gateway("a")
                targets = (
                    ("gateway", gateway.url, "/health", "/batches?service_id=a-svc", TENANT_A),
                    ("node", node.url, "/status", "/batches", None),
                )
                for name, url, probe, post, token in targets:
                    port = int(url.rsplit(":", 1)[1])
                    quiet = asyncio.run(_attacks_mod.measure(url, probe, post, token, seconds))
                    rows.append((name, "none", *quiet.row(), "1.00"))
                    for kind, label, warmup in (
                        ("gzip", "2 gzip-bomb senders", 3.0),
                        ("idle", f"{_attacks_mod.IDLE_SOCKETS:,} idle sockets", 5.0),
                    ):
                        with _attacks_mod.Attack(kind, port, seconds + warmup + 5):
                            time.sleep(warmup)  # the attack under way before measuring
                            loaded = asyncio.run(
                                _attacks_mod.measure(url, probe, post, token, seconds)
                            )
                        ratio = loaded.post_p99() / quiet.post_p99()
                        rows.append((name, label, *loaded.row(), f"{ratio:.2f}"))
                        if loaded.probe_p99() > 50:
                            missed.append(f"{name} {probe} p99 under {label}")
                        if ratio > 2:
                            missed.append(f"{name} POST p99 under {label}")
            finally:
                cluster.close()
    finally:
        drop_pg_database(pg_admin, db)
    table = report.table(
        [
            "target",
            "attack",
            "probe p50 ms",
            "probe p99 ms",
            "POST p50 ms",
            "POST p99 ms",
            "POST p99 ÷ unloaded",
        ],
        rows,
    )
    return table, missed


@click.command("hostile")
@click.option("--services", default=50, show_default=True)
@click.option("--per-service", default=20, show_default=True, help="Ordered batches per service.")
@click.option("--slow", default=200, show_default=True, help="Connections dribbling headers.")
@click.option("--long-polls", default=1_000, show_default=True, help="Parked status requests.")
@click.option("--poll-ids", default=100, show_default=True, help="Batch ids per long-poll.")
@click.option("--large-posts", default=3, show_default=True, help="Clients posting 10 MiB lists.")
@click.option(
    "--prowler/--no-prowler",
    default=True,
    show_default=True,
    help="A client without the token trying every route.",
)
@click.option(
    "--pg", "pg_admin", default="postgresql://postgres@127.0.0.1:5432/postgres", show_default=True
)
@click.option(
    "--profile",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Record each gateway with py-spy (if installed) during each flow, into this folder.",
)
@click.option(
    "--attack-seconds",
    default=15.0,
    show_default=True,
    help="Measuring time of each attack (gzip bombs, idle sockets) on the gateway and the "
    "node; 0 leaves the attacks out.",
)
@click.option("--write/--no-write", default=True, help="Write figures to docs/BENCHMARKS.md.")
def command(
    services: int,
    per_service: int,
    slow: int,
    long_polls: int,
    poll_ids: int,
    large_posts: int,
    prowler: bool,
    pg_admin: str,
    profile: Path | None,
    attack_seconds: float,
    write: bool,
) -> None:
    """Pipeline batches/s under hostile clients, as a share of a quiet run."""
    sizes = HostileSizes(
        slow=slow,
        long_polls=long_polls,
        poll_ids=poll_ids,
        large_posts=large_posts,
        prowler=prowler,
    )
    large = broken_list(sizes.large_bytes)
    quiet, quiet_summary, quiet_voided, quiet_problems = _phase(
        pg_admin, sizes, services, per_service, False, large, profile
    )
    loaded, summary, voided, problems = _phase(
        pg_admin, sizes, services, per_service, True, large, profile
    )
    share = loaded / quiet
    rows = [
        ("quiet", f"{quiet:,.0f}", "", quiet_voided, "; ".join(quiet_problems) or "none"),
        ("hostile", f"{loaded:,.0f}", f"{share:.2f}", voided, "; ".join(problems) or "none"),
    ]
    markdown = (
        f"Two `ledgerq serve` on one PostgreSQL database and a `ledgerq node`, a token "
        f"configured. Workload: {services} services × {per_service} ordered intkey batches "
        "(one list per service, services spread over both gateways), from the first POST to "
        "the last batch final, on fresh processes and database each run. *Hostile*: "
        f"{slow} connections dribbling header lines (one every {sizes.dribble_s:g} s, cut "
        f"off by the header timeout), {long_polls} long-polls of {poll_ids} of the "
        f"workload's ids (`wait={sizes.poll_wait_s:g}`), {large_posts} clients posting a "
        f"{sizes.large_bytes / 2**20:.0f} MiB BatchList over and over (verified to its last "
        "batch, whose signature is broken: `400`), "
        + ("a client without the token trying every route" if prowler else "no prowler")
        + ". Goal: hostile ≥ 0.8 of quiet, no claim voided, every batch committed once "
        "and in order.\n\n"
        + report.table(["run", "batches/s", "share of quiet", "claims voided", "problems"], rows)
        + "\n"
    )
    # Printed, not written: the requests by outcome and the CPU of each phase.
    click.echo(f"Hostile requests by outcome: {summary}.\n\n{quiet_summary.capitalize()}.\n")
    targets = []
    if attack_seconds > 0:
        table, missed = _attacks(pg_admin, attack_seconds)
        targets.append(
            report.Target(
                "attacks",
                "missed: " + "; ".join(missed) if missed else "met on the gateway and the node",
                "no" if missed else "yes",
            )
        )
        markdown += (
            "\n**Attacks without a token** (issue 38): a `ledgerq serve` on PostgreSQL with "
            "two tenants' scoped tokens, and its `ledgerq node`, each attacked in turn by "
            f"{_attacks_mod.BOMB_SENDERS} senders posting a gzip of 1 GiB of zeros (about "
            "1 MB) to `/health` about once a second each, then by "
            f"{_attacks_mod.IDLE_SOCKETS:,} sockets from {_attacks_mod.ATTACKER} that never "
            f"send a byte (each reopened {_attacks_mod.REOPEN_S:g} s after the server closes "
            f"it), the attacker in a process of its own. Measured for {attack_seconds:g} s "
            "each, one request at a time from 127.0.0.1: the probe (`/health` on the "
            "gateway, `/status` on the node) and a valid one-batch POST (tenant a's on the "
            "gateway). Targets: probe p99 ≤ 50 ms, POST p99 ≤ 2 × unloaded. Per-address caps "
            "at their defaults here.\n\n" + table + "\n"
        )
        # The verdict is in the page's table of targets; here, on the console.
        click.echo("Targets missed: " + "; ".join(missed) if missed else "Every target met.")
    click.echo(markdown)
    if write:
        report.write_section("hostile", markdown, targets=targets)

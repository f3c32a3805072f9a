"""``ledgerq bench soak``: steady load for a bounded time, with instance kills and 503 bursts.

Two ``ledgerq serve`` instances share one PostgreSQL database and submit to
``ledgerq node`` through the fault-injecting proxy of the end-to-end tests
(``tests/e2e/fault_proxy.py``). The benchmark posts ordered intkey batches
(``set`` then ``inc``s per service) at a steady rate to either instance;
every ``--kill-every`` seconds one instance is SIGKILLed and restarted a few
seconds later, every ``--burst-every`` seconds the proxy answers every POST
to the node with 503 for ``--burst-seconds``. The resident memory of every
process (node, each gateway instance, the benchmark with its proxy) is
sampled from ``/proc``: RSS and its anonymous part (the heap) apart, since
the node's RSS also counts the pages of its LMDB store that it reads through
a memory map (file pages, the page cache).

At the end the load stops, the run waits for every accepted batch, and
checks the invariants of the HA issue that can be seen from outside: every
accepted batch COMMITTED (none INVALID, none missing), each service's
batches committed in creation order (the node's event sequence), no batch
executed twice (one final event per id, and each key's value equals its
number of ``inc``s), no service left locked. Memory: each process's median
over the last quarter of the run may exceed the median over the second
quarter (after warm-up) by at most ``--memory-bound-mib``, checked twice:
on the heap (anonymous memory) and on the whole RSS.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import shutil
import statistics
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import click

from bench import report
from bench._harness import (
    DEFAULT_PG,
    EventWatcher,
    Proc,
    create_database,
    drop_database,
    gateway_proc,
    node_proc,
    read_keys,
)
from bench._systems import _high_availability
from ledgerq.codec import Signer, encode_batch_list
from ledgerq.codec.intkey import make_intkey_batch

IMG = report.ROOT / "docs" / "img"


@dataclass
class Soak:
    """What happened during the run (times in seconds since its start)."""

    services: int
    signer: Signer = field(default_factory=Signer.generate)
    accepted: dict[str, float] = field(default_factory=dict)
    order: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    kills: list[float] = field(default_factory=list)
    bursts: list[tuple[float, float]] = field(default_factory=list)
    memory: dict[str, list[tuple[float, float]]] = field(default_factory=lambda: defaultdict(list))
    #: The anonymous part of each RSS sample (the heap), same times.
    heap: dict[str, list[tuple[float, float]]] = field(default_factory=lambda: defaultdict(list))
    post_retries: int = 0
    settle_s: float = 0.0
    single_instance: bool = False

    def __post_init__(self) -> None:
        self.tag = Signer.generate().public_key[-6:]

    def key(self, s: int) -> str:
        return f"s{self.tag}{s:05d}"

    def next_batch(self, s: int) -> tuple[str, str, bytes]:
        service = f"svc{s:05d}"
        n = len(self.order[service])
        op = ("set", self.key(s), 0) if n == 0 else ("inc", self.key(s), 1)
        b = make_intkey_batch(self.signer, [op])
        self.order[service].append(b.header_signature)
        return service, b.header_signature, encode_batch_list([b])


async def _post(
    session: aiohttp.ClientSession, urls: list[str], service: str, body: bytes, soak: Soak
) -> None:
    """POST until one instance accepts; a duplicate answer counts as accepted."""
    for attempt in range(10_000):
        url = urls[attempt % len(urls)]
        try:
            async with session.post(
                f"{url}/batches",
                params={"service_id": service},
                data=body,
                headers={"Content-Type": "application/octet-stream"},
            ) as resp:
                if resp.status in (202, 409):
                    return
        except (aiohttp.ClientError, TimeoutError):
            pass
        soak.post_retries += 1
        await asyncio.sleep(0.05)
    raise RuntimeError(f"no gateway instance accepted a batch of {service}")


async def _load(
    soak: Soak, urls: list[str], rate: float, until: float, t0: float, slots: int
) -> None:
    sem = asyncio.Semaphore(slots)
    tasks: set[asyncio.Task[None]] = set()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:

        async def one(s: int) -> None:
            async with sem:
                service, bid, body = soak.next_batch(s)
                await _post(session, urls, service, body, soak)
                soak.accepted[bid] = time.monotonic() - t0

        # One service at a time in turn, so a service's batches are posted in order.
        per_service: dict[int, asyncio.Task[None] | None] = defaultdict(lambda: None)
        sent = 0
        while time.monotonic() < until:
            due = int((time.monotonic() - t0) * rate)
            while sent < due:
                s = sent % soak.services
                prev = per_service[s]
                if prev is not None and not prev.done():
                    await prev
                task = asyncio.create_task(one(s))
                per_service[s] = task
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                sent += 1
            await asyncio.sleep(0.02)
        await asyncio.gather(*tasks)


def proc_memory(pid: int) -> tuple[float, float]:
    """RSS and its anonymous part (the heap), MiB, from ``/proc/PID/status``.

    The rest of RSS is file pages mapped into the process (its code, and the
    node's LMDB store read through a memory map): the page cache, which the
    kernel may drop, not memory the process allocated.
    """
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        fields[name] = value.strip()
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["RssAnon"].split()[0]) / 1024


async def _sample_memory(soak: Soak, procs: dict[str, Proc], t0: float, every: float) -> None:
    while True:
        now = time.monotonic() - t0
        pids = [("benchmark + proxy", os.getpid())]
        pids += [(name, proc.pid) for name, proc in procs.items() if proc.process is not None]
        for name, pid in pids:
            with contextlib.suppress(OSError, ValueError, KeyError, IndexError):
                rss, anon = proc_memory(pid)
                soak.memory[name].append((now, rss))
                soak.heap[name].append((now, anon))
        await asyncio.sleep(every)


async def _chaos(
    soak: Soak,
    gateways: list[Proc],
    urls: list[str],
    busy: dict[str, bool],
    t0: float,
    until: float,
    kill_every: float,
    burst_every: float,
    burst_s: float,
) -> None:
    next_kill, next_burst, victim = t0 + kill_every, t0 + burst_every, 0
    burst_until = 0.0
    while time.monotonic() < until:
        now = time.monotonic()
        if now >= next_kill:
            g = gateways[victim % len(gateways)]
            soak.kills.append(now - t0)
            await g.kill()
            await asyncio.sleep(3.0)
            urls[victim % len(gateways)] = await g.start()
            victim += 1
            next_kill = now + kill_every
        if now >= next_burst:
            burst_until = now + burst_s
            soak.bursts.append((now - t0, now - t0 + burst_s))
            next_burst = now + burst_every
        busy["on"] = now < burst_until
        await asyncio.sleep(0.05)
    busy["on"] = False


@dataclass
class Outcome:
    accepted: int
    committed: int
    invalid: int
    missing: int
    out_of_order: int
    executed_twice: int
    wrong_keys: int
    locked_services: int
    memory_growth: dict[str, float]
    heap_growth: dict[str, float]
    windows: list[tuple[float, int, float, float]]  # start s, commits, p50 ms, p99 ms


async def _run(
    minutes: float,
    services: int,
    rate: float,
    kill_every: float,
    burst_every: float,
    burst_s: float,
    pg: str,
    workdir: Path,
    settle_timeout_s: float = 120.0,
    gateway_env: dict[str, str] | None = None,
    node_window: int = 5_000,
) -> tuple[Soak, Outcome]:
    from tests.e2e.fault_proxy import Fault, FaultProxy

    # Streams the proxy relays break when an instance is killed; expected, not news.
    logging.getLogger("aiohttp.server").setLevel(logging.CRITICAL)

    soak = Soak(services)
    busy = {"on": False}

    def policy(method: str, path: str, n: int) -> Fault:
        return Fault.BUSY_503 if busy["on"] and path == "/batches" else Fault.PASS

    db = create_database(pg, "bench_soak")
    window = str(node_window)
    node = node_proc(workdir, extra=("--dedupe-window", window, "--keep-logs", window))
    procs: dict[str, Proc] = {"node": node}
    gateways: list[Proc] = []
    proxy: FaultProxy | None = None
    try:
        node_url = await node.start()
        proxy = FaultProxy(node_url, policy)
        ledger = f"sawtooth+{await proxy.start()}"
        gateways = [
            gateway_proc(workdir, db, ledger, name=f"gateway{i}", env=gateway_env or {})
            for i in range(2)
        ]
        urls = [await gateways[0].start()]
        if not await _high_availability(urls[0]):
            # Instances sharing no claims would both submit every service: run one.
            gateways = gateways[:1]
            soak.single_instance = True
        urls += [await g.start() for g in gateways[1:]]
        procs.update({f"gateway{i}": g for i, g in enumerate(gateways)})
        async with EventWatcher(node_url) as watcher:
            t0 = time.monotonic()
            until = t0 + minutes * 60
            sampler = asyncio.create_task(_sample_memory(soak, procs, t0, 2.0))
            chaos = asyncio.create_task(
                _chaos(soak, gateways, urls, busy, t0, until, kill_every, burst_every, burst_s)
            )
            with report.progress() as bar:
                task = bar.add_task("soak (seconds)", total=int(minutes * 60))
                loader = asyncio.create_task(_load(soak, urls, rate, until, t0, 64))
                while not loader.done():
                    bar.update(task, completed=min(int(time.monotonic() - t0), int(minutes * 60)))
                    await asyncio.sleep(1.0)
                await loader
            await chaos
            all_ids = list(soak.accepted)
            drained = await watcher.wait_for(all_ids, 300)
            sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampler
            locked, settle_s = await _settle(urls, settle_timeout_s)
            soak.settle_s = settle_s
            # Read the keys only once everything is final, or late commits look like errors.
            drained = await watcher.wait_for(all_ids, 30) or drained
            keys = await read_keys(
                node_url, [(f"svc{s:05d}", soak.key(s)) for s in range(services)]
            )
            outcome = _outcome(soak, watcher, t0, keys, locked)
            if not drained:
                report.console.print("[red]not every accepted batch reached a final status")
    finally:
        for g in gateways:
            await g.stop()
        if proxy is not None:
            await proxy.close()
        await node.stop()
        drop_database(pg, db)
    return soak, outcome


async def _settle(urls: list[str], timeout_s: float) -> tuple[int, float]:
    """Until no instance reports a locked service: (locked services left, seconds waited).

    The node may have committed everything before the gateway has seen it (an
    in-flight batch of a killed instance is recovered after the claim expires).
    """
    start = time.monotonic()
    while True:
        locked = max([await _locked_services(u) for u in urls])
        waited = time.monotonic() - start
        if locked == 0 or waited >= timeout_s:
            return locked, waited
        await asyncio.sleep(0.5)


async def _locked_services(url: str) -> int:
    """Services the gateway still reports with a queue or a batch in flight; -1 if unknown."""
    locked, after = 0, ""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        while True:
            params = {"limit": "1000", **({"after": after} if after else {})}
            async with session.get(f"{url}/services", params=params) as resp:
                if resp.status != 200:
                    return -1
                rows = (await resp.json())["data"]
            locked += sum(1 for r in rows if r.get("queue_depth") or r.get("in_flight_batch_id"))
            if len(rows) < 1000:
                return locked
            after = rows[-1]["service_id"]


def _outcome(
    soak: Soak, watcher: EventWatcher, t0: float, keys: dict[str, int | None], locked: int
) -> Outcome:
    events = watcher.events
    statuses = [events[b][0][1] if b in events else "missing" for b in soak.accepted]
    out_of_order = 0
    wrong = 0
    for service, ids in soak.order.items():
        seqs = [watcher.seq[i] for i in ids if i in watcher.seq]
        out_of_order += sum(1 for a, b in itertools.pairwise(seqs) if b < a)
        done = sum(1 for i in ids if i in events)
        if keys.get(service) != done - 1:
            wrong += 1
    windows: dict[int, list[float]] = defaultdict(list)
    for bid, accepted in soak.accepted.items():
        if bid in events:
            at = events[bid][0][0] - t0
            windows[int(at // 10)].append((at - accepted) * 1000)
    series = [
        (w * 10.0, len(v), report.percentile(v, 50), report.percentile(v, 99))
        for w, v in sorted(windows.items())
    ]
    growth, heap_growth = _growth(soak.memory), _growth(soak.heap)
    return Outcome(
        accepted=len(soak.accepted),
        committed=statuses.count("COMMITTED"),
        invalid=statuses.count("INVALID"),
        missing=statuses.count("missing"),
        out_of_order=out_of_order,
        executed_twice=sum(1 for b in soak.accepted if len(events.get(b, [])) > 1),
        wrong_keys=wrong,
        locked_services=locked,
        memory_growth=growth,
        heap_growth=heap_growth,
        windows=series,
    )


def _growth(series: dict[str, list[tuple[float, float]]]) -> dict[str, float]:
    """Per process: median of the last quarter's samples minus the second quarter's."""
    growth = {}
    for name, samples in series.items():
        n = len(samples)
        if n >= 8:
            second = [m for _, m in samples[n // 4 : n // 2]]
            last = [m for _, m in samples[3 * n // 4 :]]
            growth[name] = statistics.median(last) - statistics.median(second)
    return growth


def _plots(soak: Soak, outcome: Outcome) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    IMG.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(3, 1, figsize=(10, 10), sharex=True)
    xs = [w for w, *_ in outcome.windows]
    axes[0].plot(xs, [n / 10 for _, n, _, _ in outcome.windows])
    axes[0].set(ylabel="batches committed / s")
    axes[1].plot(xs, [p for _, _, p, _ in outcome.windows], label="p50")
    axes[1].plot(xs, [p for _, _, _, p in outcome.windows], label="p99")
    axes[1].set(ylabel="accepted → committed ms", yscale="log")
    axes[1].legend()
    for name, samples in soak.memory.items():
        axes[2].plot([t for t, _ in samples], [m for _, m in samples], label=name)
    axes[2].set(ylabel="RSS MiB", xlabel="s")
    axes[2].legend()
    for ax in axes:
        for k in soak.kills:
            ax.axvline(k, color="red", linestyle=":", linewidth=0.8)
        for a, b in soak.bursts:
            ax.axvspan(a, b, color="orange", alpha=0.2)
    fig.suptitle("soak: instance SIGKILLs (red dotted), ledger 503 bursts (orange)")
    fig.tight_layout()
    fig.savefig(IMG / "soak.png", dpi=90)
    plt.close(fig)
    return ["soak.png"]


@click.command("soak")
@click.option("--minutes", default=20.0, show_default=True, help="Length of the loaded phase.")
@click.option("--services", default=200, show_default=True)
@click.option("--rate", default=100.0, show_default=True, help="Batches posted per second.")
@click.option("--kill-every", default=120.0, show_default=True, help="Seconds between kills.")
@click.option("--burst-every", default=90.0, show_default=True, help="Seconds between bursts.")
@click.option("--burst-seconds", default=5.0, show_default=True, help="Length of a 503 burst.")
@click.option(
    "--memory-bound-mib",
    default=64.0,
    show_default=True,
    help="Allowed RSS growth per process, last quarter vs second quarter (medians).",
)
@click.option(
    "--node-window",
    default=5_000,
    show_default=True,
    help="The node's in-memory windows (--dedupe-window, --keep-logs): small enough to "
    "fill before the second quarter, so the memory bound sees growth beyond them.",
)
@click.option("--pg", default=DEFAULT_PG, show_default=True, help="PostgreSQL admin URL.")
@click.option("--write/--no-write", default=True, help="Write figures to docs/BENCHMARKS.md.")
def command(
    minutes: float,
    services: int,
    rate: float,
    kill_every: float,
    burst_every: float,
    burst_seconds: float,
    memory_bound_mib: float,
    node_window: int,
    pg: str,
    write: bool,
) -> None:
    """Steady load with instance kills and ledger 503 bursts; memory and invariants."""
    workdir = Path(tempfile.mkdtemp(prefix="ledgerq-soak-"))
    load_before = os.getloadavg()[0]
    try:
        soak, outcome = asyncio.run(
            _run(
                minutes,
                services,
                rate,
                kill_every,
                burst_every,
                burst_seconds,
                pg,
                workdir,
                node_window=node_window,
            )
        )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    checks = [
        ("every accepted batch COMMITTED", outcome.committed == outcome.accepted),
        ("no batch INVALID", outcome.invalid == 0),
        ("per-service commit order = creation order", outcome.out_of_order == 0),
        ("no batch executed twice", outcome.executed_twice == 0 and outcome.wrong_keys == 0),
        ("no service left locked", outcome.locked_services == 0),
        (
            f"heap (anonymous memory) growth ≤ {memory_bound_mib:.0f} MiB per process",
            all(g <= memory_bound_mib for g in outcome.heap_growth.values()),
        ),
        (
            f"RSS growth ≤ {memory_bound_mib:.0f} MiB per process (mapped file pages included)",
            all(g <= memory_bound_mib for g in outcome.memory_growth.values()),
        ),
    ]
    lines = [
        f"accepted {outcome.accepted:,}, committed {outcome.committed:,}, INVALID "
        f"{outcome.invalid}, missing {outcome.missing}, out of order {outcome.out_of_order}, "
        f"executed twice {outcome.executed_twice}, wrong keys {outcome.wrong_keys}, "
        f"locked services {outcome.locked_services}; {len(soak.kills)} kills, "
        f"{len(soak.bursts)} 503 bursts, {soak.post_retries} client re-POSTs; "
        f"services settled {soak.settle_s:.1f} s after the last commit",
    ]
    report.console.print(*lines)
    for name, ok in checks:
        report.console.print(f"{'[green]PASS' if ok else '[red]FAIL'}[/] {name}")
    commits = [n / 10 for _, n, _, _ in outcome.windows]
    summary = report.table(
        ["figure", "value"],
        [
            [
                "batches/s (10 s windows): median / min",
                f"{statistics.median(commits or [0]):.0f} / {min(commits or [0]):.0f}",
            ],
            [
                "latency p50 / p99 ms (median window)",
                f"{statistics.median([p for *_, p, _ in outcome.windows] or [0]):.0f} / "
                f"{statistics.median([p for *_, p in outcome.windows] or [0]):.0f}",
            ],
            [
                "RSS growth (MiB): all / heap",
                "; ".join(
                    f"{name} {g:+.1f} / {outcome.heap_growth.get(name, float('nan')):+.1f}"
                    for name, g in sorted(outcome.memory_growth.items())
                ),
            ],
        ],
    )
    if not write:
        return
    images = _plots(soak, outcome)
    instances = (
        "one `ledgerq serve` instance (it reported no high availability)"
        if soak.single_instance
        else "two `ledgerq serve` instances"
    )
    failed = [name for name, ok in checks if not ok]
    verdict = report.Target(
        "soak",
        f"{minutes:g} min, {outcome.committed:,} committed: "
        + ("every invariant holds" if not failed else "failed: " + ", ".join(failed)),
        "no" if failed else "yes",
    )
    report.write_section(
        "soak",
        "\n".join(
            [
                f"{minutes:g} min, {services} services, {rate:g} batches/s posted, "
                f"{instances} "
                f"on PostgreSQL, one SIGKILLed every {kill_every:g} s "
                f"(restarted 3 s later), ledger 503 for {burst_seconds:g} s every "
                f"{burst_every:g} s (fault proxy between gateways and node); the node's "
                f"in-memory windows at {node_window:,} batches (`--dedupe-window`, "
                "`--keep-logs`), full before the second quarter (the defaults, 100,000, are "
                "measured over 1,000,000 batches by `bench node_history`). Machine load "
                f"average (1 min) before/after: {load_before:.1f}/{os.getloadavg()[0]:.1f}.",
                "",
                (
                    f"{lines[0]}. Invariants: all {len(checks)} PASS ("
                    + "; ".join(n for n, _ in checks)
                    + ")."
                    if not failed
                    else f"{lines[0]}.\n\n"
                    + report.table(
                        ["invariant", "result"],
                        [[n, "PASS" if ok else "FAIL"] for n, ok in checks],
                    )
                ),
                "",
                summary,
                "",
                *(f"![{name}](img/{name})" for name in images),
            ]
        ),
        targets=[verdict],
    )

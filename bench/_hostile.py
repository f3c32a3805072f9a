"""Hostile clients against running gateways, while ordered batches flow.

Used by ``tests/acceptance/test_hostile_clients.py`` (small sizes) and
``ledgerq bench hostile`` (the issue's sizes). Every hostile request is
counted by how it ended; :meth:`HostileReport.unclear` lists any that got
neither a clear answer (JSON with a status the gateway documents for it) nor
a cut-off by a timeout.

* **slow** connections send a request line, then one header line every
  ``dribble_s``, never finishing: the gateway must answer ``408`` (or close)
  after its header timeout; each then reconnects.
* **long-polls** ask ``/batch_statuses`` for ``poll_ids`` batches of the
  workload with ``wait``: answered ``200`` when final or the wait is over,
  ``429`` beyond the gateway's ``max_waiters``. A poll answered at once
  (the batches are not posted yet, or already final) waits a second before
  asking again, as a polite client would.
Long-polls and large posts carry the token when one is given (abusive
clients, not anonymous ones).

* **large posts**: ``large_posts`` clients each post the same BatchList of
  about ``large_bytes`` again and again, its last batch's signature broken:
  every post costs the gateway a full decode and verification and ends in
  ``400 bad_batch_signature``; nothing is stored.
* **prowler**: a client without the token tries every route with junk; every
  answer must be JSON (401 when a token is configured, else whatever the
  route answers, never a plain-text error).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import io
import multiprocessing
import os
import random
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import aiohttp

from bench._cluster import Workload, wait_all_final
from ledgerq.codec import Signer, decode_batch_list, encode_batch_list
from ledgerq.codec.build import make_batch
from ledgerq.codec.intkey import make_intkey_batch, make_intkey_transaction

ROUTES = (
    ("GET", "/tracking/batches"),
    ("GET", "/tracking/batches/" + "0" * 128),
    ("GET", "/batches"),
    ("GET", "/blocks?limit=5"),
    ("GET", "/state/" + "0" * 70),
    ("POST", "/batches"),
    ("GET", "/batch_statuses?id=" + "0" * 128),
    ("POST", "/batch_statuses"),
    ("GET", "/services"),
    ("GET", "/instances"),
    ("GET", "/metrics"),
    ("GET", "/dashboard/data"),
    ("GET", "/health"),
    ("GET", "/ready"),
    ("GET", "/openapi.json"),
    ("DELETE", "/batches"),
    ("GET", "/no/such/route"),
)


@dataclass(frozen=True)
class HostileSizes:
    slow: int = 50
    dribble_s: float = 0.5
    long_polls: int = 200
    poll_ids: int = 100
    poll_wait_s: float = 20.0
    large_posts: int = 3
    #: Whether the client without the token tries every route.
    prowler: bool = True
    #: Just under the gateway's default max_body_bytes (10 MiB).
    large_bytes: int = 10 * 1024 * 1024 - 1024


@dataclass
class HostileReport:
    #: kind → outcome → count (outcome: an HTTP status, "cut off", or an error).
    outcomes: dict[str, collections.Counter[str]] = field(
        default_factory=lambda: collections.defaultdict(collections.Counter)
    )

    #: Every long-poll answer: (wall-clock time it came, seconds it took).
    poll_log: list[tuple[float, float]] = field(default_factory=list)

    def polls_between(self, began: float, ended: float) -> tuple[int, int]:
        """Long-poll answers that came between two wall-clock times, and how
        many of them within a second of asking (nothing to wait for)."""
        within = [took for at, took in self.poll_log if began <= at <= ended]
        return len(within), sum(1 for took in within if took < 1.0)

    def count(self, kind: str, outcome: str) -> None:
        self.outcomes[kind][outcome] += 1

    #: What each kind may end with.
    CLEAR: ClassVar[dict[str, set[str]]] = {
        "slow": {"408", "cut off"},
        "long-poll": {"200", "429"},
        "large post": {"400 bad_batch_signature", "503"},
        "prowler": {"json"},
    }

    def unclear(self) -> dict[str, dict[str, int]]:
        return {
            kind: {o: n for o, n in outcomes.items() if o not in self.CLEAR.get(kind, set())}
            for kind, outcomes in self.outcomes.items()
            if any(o not in self.CLEAR.get(kind, set()) for o in outcomes)
        }

    def summary(self) -> str:
        return "; ".join(
            f"{kind}: " + ", ".join(f"{o} ×{n}" for o, n in sorted(outcomes.items()))
            for kind, outcomes in sorted(self.outcomes.items())
        )


def broken_list(target_bytes: int) -> bytes:
    """A BatchList of about ``target_bytes`` of single-transaction intkey
    batches whose last batch's signature is wrong (verified to the end, then
    refused)."""
    signer = Signer.generate()
    first = make_intkey_batch(signer, [("set", "h0", 0)]).serialized
    count = max(2, target_bytes // (len(first) + 8))
    batches = [first] + [
        make_intkey_batch(signer, [("set", f"h{i}", i)]).serialized for i in range(1, count)
    ]
    while len(encode_batch_list(batches)) > target_bytes and len(batches) > 2:
        del batches[-len(batches) // 100 - 1 :]
    last = bytearray(batches[-1])
    # The batch's header_signature is the hex string after its header: flip
    # one hex digit of it (still 128 lowercase hex, no longer a signature).
    signature = make_signature_offset(bytes(last))
    last[signature] = ord("0") if last[signature] != ord("0") else ord("1")
    batches[-1] = bytes(last)
    return encode_batch_list(batches)


def make_signature_offset(serialized_batch: bytes) -> int:
    """Offset of the first hex digit of a serialized Batch's header_signature."""
    from ledgerq.codec import batch_pb2

    batch = batch_pb2.Batch.FromString(serialized_batch)
    return serialized_batch.index(batch.header_signature.encode()) + 5


class HostileLoad:
    """Runs every hostile client against ``urls`` until :meth:`stop`."""

    def __init__(
        self,
        urls: Sequence[str],
        sizes: HostileSizes,
        poll_ids: Sequence[str],
        *,
        large_body: bytes | None = None,
        token: str | None = None,
        held_ids: Sequence[str] = (),
    ) -> None:
        self.urls = list(urls)
        self.sizes = sizes
        self.poll_ids = list(poll_ids)
        #: Asked for by every long-poll besides its sample of ``poll_ids``: a
        #: batch the ledger holds keeps each long-poll parked.
        self.held_ids = list(held_ids)
        self.large_body = large_body
        #: Long-polls and large posts carry it (abusive, not anonymous); the
        #: prowler never does.
        self.auth = {} if token is None else {"Authorization": f"Bearer {token}"}
        self.report = HostileReport()
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._large_tasks: list[asyncio.Task[None]] = []
        self._session: aiohttp.ClientSession | None = None
        #: Set once every slow connection and long-poll has been opened once.
        self.started = asyncio.Event()
        #: Every long-poll answer: (wall-clock time it came, seconds it took).
        self.poll_log: list[tuple[float, float]] = []
        self._opened = 0

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(limit=0, force_close=False)
        self._session = aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout(total=120)
        )
        s = self.sizes
        rng = random.Random(7)
        for i in range(s.slow):
            self._spawn(self._slow(self.urls[i % len(self.urls)]))
        for i in range(s.long_polls):
            ids = self.held_ids + rng.sample(self.poll_ids, min(s.poll_ids, len(self.poll_ids)))
            self._spawn(self._long_poll(self.urls[i % len(self.urls)], ids))
        if self.large_body is not None:
            for i in range(s.large_posts):
                self._spawn(self._large(self.urls[i % len(self.urls)]))
                self._large_tasks.append(self._tasks[-1])
        if s.prowler:
            self._spawn(self._prowl())
        if s.slow + s.long_polls == 0:
            self.started.set()  # nothing to open and settle

    def _spawn(self, coro: object) -> None:
        self._tasks.append(asyncio.ensure_future(coro))  # type: ignore[arg-type]

    def _opened_one(self) -> None:
        self._opened += 1
        if self._opened >= self.sizes.slow + self.sizes.long_polls:
            self.started.set()

    async def stop(self, grace_s: float = 120.0) -> HostileReport:
        """Stop every client; large posts under way get ``grace_s`` to be answered."""
        self._stop.set()
        if self._large_tasks:
            await asyncio.wait(self._large_tasks, timeout=grace_s)
        for t in self._tasks:
            t.cancel()
        results = await asyncio.gather(*self._tasks, return_exceptions=True)
        assert self._session is not None
        await self._session.close()
        for r in results:
            if isinstance(r, BaseException) and not isinstance(r, asyncio.CancelledError):
                self.report.count("driver", f"crashed: {r!r}")
        return self.report

    async def _slow(self, url: str) -> None:
        host, port = url.removeprefix("http://").rsplit(":", 1)
        first = True
        while not self._stop.is_set():
            try:
                reader, writer = await asyncio.open_connection(host, int(port))
            except OSError as exc:
                self.report.count("slow", f"connect failed: {exc}")
                await asyncio.sleep(1)
                continue
            if first:
                first = False
                self._opened_one()
            try:
                writer.write(b"GET /services HTTP/1.1\r\nHost: " + host.encode() + b"\r\n")
                n = 0
                while True:
                    try:
                        answer = await asyncio.wait_for(reader.read(64), self.sizes.dribble_s)
                    except TimeoutError:
                        n += 1
                        writer.write(b"X-Dribble-%d: x\r\n" % n)
                        continue
                    if answer.startswith(b"HTTP/1.1 408 "):
                        self.report.count("slow", "408")
                    elif answer == b"":
                        self.report.count("slow", "cut off")
                    else:
                        self.report.count("slow", f"answered {answer[:12]!r}")
                    break
            except (ConnectionError, OSError):
                self.report.count("slow", "cut off")
            finally:
                writer.close()

    async def _long_poll(self, url: str, ids: list[str]) -> None:
        assert self._session is not None
        loop = asyncio.get_running_loop()
        first = True
        while not self._stop.is_set():
            began = loop.time()
            try:
                async with self._session.get(
                    f"{url}/batch_statuses",
                    params={"id": ",".join(ids), "wait": f"{self.sizes.poll_wait_s:g}"},
                    headers=self.auth,
                ) as r:
                    if first:
                        first = False
                        self._opened_one()
                    await r.read()
                    outcome = str(r.status)
                    if r.content_type != "application/json":
                        outcome += " not json"
            except (aiohttp.ClientError, TimeoutError) as exc:
                outcome = f"failed: {type(exc).__name__}"
            self.report.count("long-poll", outcome)
            self.poll_log.append((time.time(), loop.time() - began))
            if outcome == "429" or loop.time() - began < 1.0:
                await asyncio.sleep(1.0)

    async def _large(self, url: str) -> None:
        assert self._session is not None and self.large_body is not None
        while not self._stop.is_set():
            try:
                async with self._session.post(
                    f"{url}/batches?service_id=hostile-large",
                    data=io.BytesIO(self.large_body),
                    headers={"Content-Type": "application/octet-stream", **self.auth},
                ) as r:
                    body = await r.json(content_type=None)
                    outcome = str(r.status)
                    if r.status == 400:
                        outcome += f" {body['error'].get('rule')}"
            except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                outcome = f"failed: {type(exc).__name__}"
            self.report.count("large post", outcome)

    async def _prowl(self) -> None:
        assert self._session is not None
        while not self._stop.is_set():
            for url in self.urls:
                for method, path in ROUTES:
                    try:
                        async with self._session.request(
                            method, url + path, data=b"junk", headers={"Content-Type": "x/y"}
                        ) as r:
                            await r.read()
                            ok = r.content_type == "application/json" or (
                                r.status == 200 and path in ("/metrics", "/openapi.json")
                            )
                            self.report.count("prowler", "json" if ok else f"{r.status} text")
                    except (aiohttp.ClientError, TimeoutError) as exc:
                        self.report.count("prowler", f"failed: {type(exc).__name__}")
            await asyncio.sleep(0.5)


async def post_workload(urls: Sequence[str], workload: Workload, token: str | None) -> float:
    """Each service's batches as one ordered list, services spread over
    ``urls``; returns the seconds it took."""
    return await post_batches(urls, workload.batches, token)


async def post_batches(
    urls: Sequence[str], batches: Mapping[str, Sequence[tuple[str, bytes]]], token: str | None
) -> float:
    """Per service id, its ``(batch id, BatchList)`` pairs as one ordered list,
    services spread over ``urls``; returns the seconds it took."""
    began = time.monotonic()
    headers = {"Content-Type": "application/octet-stream"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as http:
        for n, (service_id, made) in enumerate(batches.items()):
            body = encode_batch_list(
                [decode_batch_list(b, verify=False)[0].serialized for _, b in made]
            )
            url = urls[n % len(urls)]
            async with http.post(
                f"{url}/batches?service_id={service_id}", data=body, headers=headers
            ) as r:
                if r.status != 202:
                    raise RuntimeError(
                        f"POST of {service_id} answered {r.status}: {await r.text()}"
                    )
    return time.monotonic() - began


Made = dict[str, list[tuple[str, bytes]]]


def held_and_release(signer: Signer) -> tuple[Made, Made]:
    """A batch the ledger holds until the other is posted, each the one batch
    of a service of its own, in :attr:`Workload.batches`' shape (``svc-held``
    sets ``kheld`` to 0 and depends on ``svc-release``'s ``set krelease 0``).

    Posted first, the held batch keeps every long-poll that asks for it
    parked, whatever the pace of the workload; posting the release then lets
    both commit."""
    release_tx = make_intkey_transaction(signer, "set", "krelease", 0)
    held_tx = make_intkey_transaction(
        signer, "set", "kheld", 0, dependencies=(release_tx.header_signature,)
    )
    release, held = make_batch(signer, [release_tx]), make_batch(signer, [held_tx])
    return (
        {"svc-held": [(held.header_signature, encode_batch_list([held.serialized]))]},
        {"svc-release": [(release.header_signature, encode_batch_list([release.serialized]))]},
    )


_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat_fields(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode(errors="replace")
    except OSError:
        return None
    return raw.rpartition(")")[2].split()


def descendants(roots: Iterable[int]) -> set[int]:
    """``roots`` and every live process below them (Linux ``/proc``)."""
    children: dict[int, list[int]] = collections.defaultdict(list)
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat_fields(int(entry))
            if fields is not None:
                children[int(fields[1])].append(int(entry))
    out: set[int] = set()
    todo = list(roots)
    while todo:
        pid = todo.pop()
        if pid not in out:
            out.add(pid)
            todo.extend(children.get(pid, ()))
    return out


def cpu_of(pids: Iterable[int]) -> dict[int, float]:
    """CPU seconds (user + system) each live process of ``pids`` has used."""
    out: dict[int, float] = {}
    for pid in pids:
        fields = _stat_fields(pid)
        if fields is not None:
            out[pid] = (int(fields[11]) + int(fields[12])) / _CLK_TCK
    return out


class CpuProbe:
    """CPU seconds used by groups of processes between :meth:`start` and
    :meth:`stop`: each role names a function giving its processes' ids (a
    process that appears meanwhile counts in full, one that ended is lost)."""

    def __init__(
        self,
        roles: dict[str, Callable[[], Iterable[int]]],
        *,
        on_start: Callable[[], None] = lambda: None,
        on_stop: Callable[[], None] = lambda: None,
    ) -> None:
        self.roles = roles
        self._on_start = on_start
        self._on_stop = on_stop
        self._at_start: dict[str, dict[int, float]] = {}

    def start(self) -> None:
        self._at_start = {role: cpu_of(pids()) for role, pids in self.roles.items()}
        self._on_start()

    def stop(self) -> dict[str, float]:
        self._on_stop()
        used: dict[str, float] = {}
        for role, pids in self.roles.items():
            before = self._at_start.get(role, {})
            now = cpu_of(pids())
            used[role] = sum(cpu - before.get(pid, 0.0) for pid, cpu in now.items())
        return used


@dataclass
class FlowResult:
    elapsed_s: float
    batches: int
    report: HostileReport | None
    #: Wall-clock times of the first POST and of the last batch final.
    began: float = 0.0
    ended: float = 0.0
    #: Seconds from the first POST to the last answered.
    posting_s: float = 0.0
    #: CPU seconds per role during the flow (when a probe was given).
    cpu_s: dict[str, float] = field(default_factory=dict)

    def cpu_summary(self) -> str:
        """CPU per role during the flow: seconds, and ms per batch."""
        return ", ".join(
            f"{role} {s:.2f} s ({1000 * s / self.batches:.2f} ms/batch)"
            for role, s in self.cpu_s.items()
        )

    def poll_timeline(self) -> str:
        """Long-poll answers in each second of the flow: waited/at once."""
        if self.report is None:
            return ""
        seconds = int(self.ended - self.began) + 1
        waited, at_once = [0] * seconds, [0] * seconds
        for at, took in self.report.poll_log:
            if self.began <= at <= self.ended:
                k = int(at - self.began)
                (at_once if took < 1.0 else waited)[k] += 1
        return " ".join(f"{w}/{a}" for w, a in zip(waited, at_once, strict=True))

    @property
    def batches_per_s(self) -> float:
        return self.batches / self.elapsed_s


def _run_load(
    urls: Sequence[str],
    sizes: HostileSizes,
    poll_ids: Sequence[str],
    large_body: bytes | None,
    token: str | None,
    held_ids: Sequence[str],
    started: Any,
    stop: Any,
    out: Any,
) -> None:
    """The body of :class:`LoadProcess`: run the load until told to stop."""
    # The load stands for clients on other machines: on this one, the
    # gateways, the node and PostgreSQL come first.
    with contextlib.suppress(OSError):
        os.nice(LOAD_NICENESS)

    async def main() -> None:
        load = HostileLoad(
            urls, sizes, poll_ids, large_body=large_body, token=token, held_ids=held_ids
        )
        await load.start()
        await load.started.wait()
        started.set()
        await asyncio.to_thread(stop.wait)
        report = await load.stop()
        out.put(
            (
                {kind: dict(outcomes) for kind, outcomes in report.outcomes.items()},
                load.poll_log,
            )
        )

    asyncio.run(main())


#: How much lower the load generator's scheduling priority is.
LOAD_NICENESS = 5


class LoadProcess:
    """A :class:`HostileLoad` in a process of its own (so the clients' own CPU
    does not slow the workload's poster, and yields to the servers)."""

    def __init__(
        self,
        urls: Sequence[str],
        sizes: HostileSizes,
        poll_ids: Sequence[str],
        *,
        large_body: bytes | None = None,
        token: str | None = None,
        held_ids: Sequence[str] = (),
    ) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._started = ctx.Event()
        self._stop = ctx.Event()
        self._out: Any = ctx.Queue()
        self._proc = ctx.Process(
            target=_run_load,
            args=(
                list(urls),
                sizes,
                list(poll_ids),
                large_body,
                token,
                list(held_ids),
                self._started,
                self._stop,
                self._out,
            ),
            daemon=True,
        )

    @property
    def pid(self) -> int:
        assert self._proc.pid is not None, "start it first"
        return self._proc.pid

    async def start(self, timeout_s: float) -> None:
        self._proc.start()
        if not await asyncio.to_thread(self._started.wait, timeout_s):
            self._proc.kill()
            raise RuntimeError(f"the hostile load did not open within {timeout_s} s")

    async def stop(self, timeout_s: float = 300) -> HostileReport:
        self._stop.set()
        try:
            outcomes, polls = await asyncio.to_thread(self._out.get, True, timeout_s)
        finally:
            await asyncio.to_thread(self._proc.join, 30)
            if self._proc.is_alive():
                self._proc.kill()
        report = HostileReport(poll_log=polls)
        for kind, counts in outcomes.items():
            report.outcomes[kind].update(counts)
        return report


async def flow(
    urls: Sequence[str],
    pg_url: str,
    workload: Workload,
    *,
    load: LoadProcess | None = None,
    token: str | None = None,
    timeout_s: float = 300,
    probe: CpuProbe | None = None,
) -> FlowResult:
    """Post ``workload`` and wait until every batch is final, under ``load``
    (started first and settled: every slow connection and long-poll open);
    ``probe``: the CPU each role used during the flow."""
    if load is not None:
        await load.start(timeout_s)
        if probe is not None:
            probe.roles.setdefault("load", lambda: descendants([load.pid]))
    loop = asyncio.get_running_loop()
    if probe is not None:
        await asyncio.to_thread(probe.start)
    began, wall_began = loop.time(), time.time()
    posting_s = await post_workload(urls, workload, token)
    total = len(workload.all_ids())
    counts = await asyncio.to_thread(wait_all_final, pg_url, total, timeout_s)
    elapsed = loop.time() - began
    wall_ended = time.time()
    cpu_s = await asyncio.to_thread(probe.stop) if probe is not None else {}
    report = await load.stop() if load is not None else None
    final = sum(counts.get(s, 0) for s in ("Committed", "Valid", "Invalid"))
    if final < total:
        raise RuntimeError(f"only {final} of {total} batches final within {timeout_s} s: {counts}")
    return FlowResult(elapsed, total, report, wall_began, wall_ended, posting_s, cpu_s)


def claims_voided(logs: Sequence[str]) -> int:
    """Claims a gateway voided because their holder let them expire."""
    return sum(log.count("voided claim") for log in logs)

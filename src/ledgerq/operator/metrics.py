"""Prometheus metrics of a gateway (and of a node), one registry per app instance.

Every :class:`GatewayMetrics` owns a private ``CollectorRegistry``, so several
gateways in one process (tests) never share a series. What is measured:

* Counted as it happens, through :class:`InstrumentedLedger` (a proxy around
  the gateway's ledger client) and the API's acceptance hook:
  ``ledgerq_batches_accepted_total``; ``ledgerq_submission_attempts_total``
  by ledger response (``accepted``, ``busy_429``, ``busy_503``,
  ``unreachable``, ``rejected_4xx`` (judged), ``unjudged_4xx``, ``ambiguous``);
  ``ledgerq_monitor_polls_total`` (status reads, ``ok``/``error``);
  ``ledgerq_ledger_statuses_total`` by the status the ledger reported; latency histograms
  ``ledgerq_stage_latency_seconds{stage=queued|submit|ledger}`` (accepted →
  first POST, one POST, first POST → final status) and
  ``ledgerq_end_to_end_latency_seconds`` (accepted → final status). The
  follower's state at each scrape: ``ledgerq_follow_parked_requests`` (status
  reads parked at the ledger), ``ledgerq_follow_parked_limit``
  (``monitor.max_parked``), ``ledgerq_follow_waiting_for_slot``,
  ``ledgerq_followed_batches``, ``ledgerq_follow_asked_batches_total``,
  ``ledgerq_follow_scans_total``. A batch
  accepted by another process (a worker of ``serve --workers``, or another
  instance under high availability) is timed from the acceptance time its
  record holds when this process's submitter takes it. These
  event series are counted in plain numbers on the event loop (no lock per
  event) and built into families only when scraped; what they expose is
  what ``prometheus_client``'s ``Counter`` and ``Histogram`` would
  (``_total``, buckets, ``_sum``, ``_count``, ``_created``).
* Read from the store when ``/metrics`` is scraped: ``ledgerq_batches`` by
  status (every status, 0 when no batch has it), ``ledgerq_queue_depth`` (all services), and
  ``ledgerq_service_queue_depth{service_id}`` for the ``top_services``
  deepest services plus one ``service_id="other"`` series summing the rest,
  so label cardinality stays at most ``top_services + 1`` however many
  services exist; ``ledgerq_services``, ``ledgerq_services_in_flight``.
* Read from the claim manager at every exposition: ``ledgerq_services_claimed``
  (high availability; 0 otherwise).

With ``serve --workers N`` every worker counts its own events; the worker
that answers ``/metrics`` adds the other workers' counters, histograms and
per-process gauges (:func:`merge_expositions`, fed by ``peers``), and its own
store-derived gauges stand for all (every worker reads the same store).

It also keeps, for the dashboard, per-second counts of accepted and final
batches over the last :data:`THROUGHPUT_WINDOW_S` seconds and the ids of the
most recently accepted batches. With ``--workers`` the worker that answers
``/dashboard/data`` adds the others' (:meth:`GatewayMetrics.dashboard_part`,
fed by ``peer_dashboards``): behind one port a client's requests, and so
its batches, are spread over the workers.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple, Protocol

from prometheus_client import CollectorRegistry, Gauge, generate_latest
from prometheus_client import metrics as prometheus_metrics
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from ledgerq.clock import Clock, now_ms
from ledgerq.ledgers.base import (
    Accepted,
    Ambiguous,
    Busy,
    CommitEvent,
    LedgerBatchStatus,
    LedgerClient,
    Rejected,
    SubmitResult,
    Unjudged,
    Unreachable,
)
from ledgerq.model import BatchStatus, BatchStatusName, TrackingBatch
from ledgerq.store.base import NO_STATUS

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
THROUGHPUT_WINDOW_S = 600
#: Series read from the store at a scrape: the same from every worker.
STORE_FAMILIES = frozenset(
    {
        "ledgerq_batches",
        "ledgerq_queue_depth",
        "ledgerq_service_queue_depth",
        "ledgerq_service_in_flight",
        "ledgerq_services",
        "ledgerq_services_in_flight",
    }
)
RECENT_BATCHES = 200
#: The values of ``ledgerq_batches``'s ``status`` label, each always exposed.
_STATUSES: tuple[str, ...] = (NO_STATUS, *(name.value for name in BatchStatusName))
#: Services read per query at a scrape (the store's largest page).
_SERVICES_PAGE = 10_000
#: Batches followed for latency at once; beyond it the oldest are forgotten.
MAX_TRACKED = 200_000
_LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    300.0,
)  # fmt: skip


class PipelineStats(Protocol):
    """What the metrics read of the producer (``ledgerq.pipeline.producer.Producer``)."""

    taken_with_final: int
    taken_freed: int


class FollowerStats(Protocol):
    """What the metrics read of the follower (``ledgerq.follow.follower.Follower``)."""

    parked: int
    scans: int
    asked: int
    followed: dict[str, Any]

    @property
    def waiting_for_slot(self) -> int: ...

    @property
    def settings(self) -> Any: ...


class ClaimedServices(Protocol):
    """What the metrics read of the claim manager (``ledgerq.claims.ClaimManager``)."""

    def claimed_services(self, now: int | None = None) -> frozenset[str]: ...


class MetricsStore(Protocol):
    async def status_counts(self) -> dict[str, int]: ...

    async def list_services(
        self, *, limit: int = 1000, after: str | None = None
    ) -> Sequence[Any]: ...


def response_label(result: SubmitResult) -> str:
    """A bounded label for what the ledger answered to one POST."""
    match result:
        case Accepted():
            return "accepted"
        case Busy(status=status):
            return f"busy_{status}" if status in (429, 503) else "busy"
        case Unreachable():
            return "unreachable"
        case Rejected(status=status):
            return "rejected_4xx" if 400 <= status < 500 else "rejected"
        case Unjudged():
            return "unjudged_4xx"
        case Ambiguous():
            return "ambiguous"
    return "other"


class _Window:
    """Counts per whole second over a sliding window."""

    def __init__(self, seconds: int) -> None:
        self.seconds = seconds
        self._buckets: deque[list[int]] = deque()  # [second, count]

    def add(self, now_s: int, n: int = 1) -> None:
        if self._buckets and self._buckets[-1][0] == now_s:
            self._buckets[-1][1] += n
        else:
            self._buckets.append([now_s, n])
        while self._buckets and self._buckets[0][0] <= now_s - self.seconds:
            self._buckets.popleft()

    def series(self, now_s: int, seconds: int) -> list[int]:
        """Counts of the ``seconds`` seconds ending with ``now_s`` (oldest first)."""
        counts = {s: c for s, c in self._buckets}
        return [counts.get(s, 0) for s in range(now_s - seconds + 1, now_s + 1)]


class GatewayMetrics:
    def __init__(self, *, top_services: int = 20, clock: Clock = now_ms) -> None:
        self.top_services = top_services
        self.clock = clock
        r = self.registry = CollectorRegistry(auto_describe=True)
        # The event series are plain numbers, turned into families only when
        # scraped (:class:`_EventCollector`): ``prometheus_client`` takes a lock
        # per ``inc``/``observe``, several times per batch on the hot path.
        #: Batches accepted by this process (``ledgerq_batches_accepted_total``).
        self.accepted_total = 0
        self._accepted_created = time.time()
        self._attempts_by: dict[str, _Count] = {}
        self._polls_ok = _Count()
        self._polls_error = _Count()
        self._reported_by: dict[str, _Count] = {}
        self._stage_submit = _Histogram()
        self._stage_queued = _Histogram()
        self._stage_ledger = _Histogram()
        self._e2e = _Histogram()
        r.register(_EventCollector(self))
        self.batches = Gauge(
            "ledgerq_batches", "Tracked batches by status.", ["status"], registry=r
        )
        self.depth = Gauge("ledgerq_queue_depth", "Non-final batches, all services.", registry=r)
        self.service_depth = Gauge(
            "ledgerq_service_queue_depth",
            "Non-final batches of the deepest services; service_id=other sums the rest.",
            ["service_id"],
            registry=r,
        )
        self.service_in_flight = Gauge(
            "ledgerq_service_in_flight",
            "Batches in flight (taken, or pending at the ledger) of the deepest services: "
            "one at most under the serial strategy, up to the pipeline depth under the "
            "pipelined one; service_id=other sums the rest.",
            ["service_id"],
            registry=r,
        )
        self.services = Gauge("ledgerq_services", "Services with tracked batches.", registry=r)
        self.in_flight = Gauge(
            "ledgerq_services_in_flight", "Services with a batch being submitted.", registry=r
        )
        #: The claim manager (high availability), read at each exposition:
        #: a worker's own exposition, added up by another worker's /metrics
        #: (``serve --workers``), is made without a refresh of its own.
        self.claims: ClaimedServices | None = None
        r.register(_ClaimsCollector(self))
        self._created: dict[str, int] = {}
        self._posted: dict[str, int] = {}
        self._accepted_window = _Window(THROUGHPUT_WINDOW_S)
        self._final_window = _Window(THROUGHPUT_WINDOW_S)
        self.recent: deque[tuple[str, str]] = deque(maxlen=RECENT_BATCHES)
        self._node_added = False
        #: The other workers' own expositions (``serve --workers``), or None.
        self.peers: Callable[[], Awaitable[list[bytes]]] | None = None
        #: The other workers' :meth:`dashboard_part` for (seconds, until_s), or None.
        self.peer_dashboards: Callable[[int, int], Awaitable[list[dict[str, Any]]]] | None = None

    # -- events ---------------------------------------------------------------

    def batches_accepted(self, batches: Iterable[TrackingBatch]) -> None:
        now = self.clock()
        n = 0
        for b in batches:
            n += 1
            _remember(self._created, b.batch_id, b.created_at or now)
            self.recent.append((b.batch_id, b.service_id))
        self.accepted_total += n
        self._accepted_window.add(now // 1000, n)

    def batch_taken(self, batch: TrackingBatch) -> None:
        """A submission of this process takes ``batch``: one accepted by
        another process (another worker or instance) is timed from its
        acceptance (``created_at``) too, for ``queued`` and end-to-end. Not
        one attempted before (a resubmission): its first POST was elsewhere."""
        if batch.attempts == 0 and batch.created_at and batch.batch_id not in self._created:
            _remember(self._created, batch.batch_id, batch.created_at)

    def posting(self, batch_id: str) -> None:
        """A POST of the batch starts: its first ends the ``queued`` stage and
        starts the ``ledger`` one, before the answer (the final status may
        come, from an event stream, before the POST is answered)."""
        if batch_id not in self._posted:
            now = self.clock()
            _remember(self._posted, batch_id, now)
            created = self._created.get(batch_id)
            if created is not None:
                self._stage_queued.observe(max(0, now - created) / 1000)

    def posted(self, batch_id: str, result: SubmitResult, seconds: float) -> None:
        """A POST of the batch (announced by :meth:`posting`) was answered."""
        label = response_label(result)
        attempts = self._attempts_by.get(label)
        if attempts is None:
            attempts = self._attempts_by[label] = _Count()
        attempts.value += 1
        self._stage_submit.observe(seconds)

    def polled(self, ok: bool) -> None:
        """One status read of the ledger answered (``ok``) or failed."""
        (self._polls_ok if ok else self._polls_error).value += 1

    def status_reported(self, batch_id: str, status: BatchStatus) -> None:
        name = status.name.value
        reported = self._reported_by.get(name)
        if reported is None:
            reported = self._reported_by[name] = _Count()
        reported.value += 1
        if not status.is_final:
            return
        now = self.clock()
        self._final_window.add(now // 1000)
        posted = self._posted.pop(batch_id, None)
        if posted is not None:
            self._stage_ledger.observe(max(0, now - posted) / 1000)
        created = self._created.pop(batch_id, None)
        if created is not None:
            self._e2e.observe(max(0, now - created) / 1000)

    def throughput(self, seconds: int = 300) -> dict[str, Any]:
        """Per-second accepted and final batch counts of the last ``seconds`` (oldest first)."""
        seconds = max(1, min(seconds, THROUGHPUT_WINDOW_S))
        now_s = self.clock() // 1000
        return {
            "seconds": seconds,
            "until": now_s * 1000,
            "accepted": self._accepted_window.series(now_s, seconds),
            "final": self._final_window.series(now_s, seconds),
        }

    def dashboard_part(self, seconds: int, until_s: int) -> dict[str, Any]:
        """This process's share of a dashboard answer another worker makes:
        its per-second counts of the ``seconds`` ending with ``until_s`` (the
        asking worker's clock, so the series line up) and its recently
        accepted batches, oldest first."""
        seconds = max(1, min(seconds, THROUGHPUT_WINDOW_S))
        return {
            "accepted": self._accepted_window.series(until_s, seconds),
            "final": self._final_window.series(until_s, seconds),
            "recent": [list(pair) for pair in self.recent],
        }

    # -- scrape ---------------------------------------------------------------

    async def refresh(self, store: MetricsStore) -> None:
        """Read the store's gauges (statuses, queue depths)."""
        counts = await store.status_counts()
        self.batches.clear()
        # Every status has its series, 0 when no batch has it: a series that
        # vanished when its batches moved on would read as "no data", not 0.
        for name in _STATUSES:
            self.batches.labels(name).set(counts.get(name, 0))
        for name, n in counts.items():
            if name not in _STATUSES:
                self.batches.labels(name).set(n)
        depths: list[tuple[int, str]] = []
        flying: dict[str, int] = {}
        in_flight = 0
        after: str | None = None
        while True:
            page = await store.list_services(limit=_SERVICES_PAGE, after=after)
            for s in page:
                depths.append((s.queue_depth, s.service_id))
                flying[s.service_id] = s.in_flight
                in_flight += s.in_flight_batch_id is not None
            if len(page) < _SERVICES_PAGE:
                break
            after = page[-1].service_id
        depths.sort(key=lambda d: (-d[0], d[1]))
        self.depth.set(sum(d for d, _ in depths))
        self.services.set(len(depths))
        self.in_flight.set(in_flight)
        self.service_depth.clear()
        self.service_in_flight.clear()
        for depth, service_id in depths[: self.top_services]:
            self.service_depth.labels(service_id).set(depth)
            self.service_in_flight.labels(service_id).set(flying[service_id])
        rest = depths[self.top_services :]
        self.service_depth.labels("other").set(sum(d for d, _ in rest))
        self.service_in_flight.labels("other").set(sum(flying[s] for _, s in rest))

    def watch_pipeline(
        self, pipeline: PipelineStats, follower: FollowerStats, claims: ClaimedServices | None
    ) -> None:
        """Expose the producer's takes, the follower's parked reads and
        followed batches, and the claims held, at every scrape."""
        self.claims = claims
        self.registry.register(_FollowerCollector(follower))
        self.registry.register(_TakesCollector(pipeline))

    def add_node(self, node: Any) -> None:
        """Also expose an in-process node's ``ledgerq_node_*`` counters (once)."""
        if not self._node_added:
            self.registry.register(_NodeCollector(node))
            self._node_added = True

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    async def scrape(self) -> bytes:
        """This process's exposition, plus the other workers' when there are any."""
        own = self.exposition()
        if self.peers is None:
            return own
        return merge_expositions(own, await self.peers(), only_own=STORE_FAMILIES)

    def instrument(self, ledger: LedgerClient) -> InstrumentedLedger:
        return InstrumentedLedger(ledger, self)


def merge_expositions(
    own: bytes, peers: Sequence[bytes], *, only_own: frozenset[str] = frozenset()
) -> bytes:
    """Sum Prometheus text expositions sample by sample (same name, same labels).

    Families in ``only_own`` are taken from ``own`` alone; ``*_created``
    samples keep the earliest value. Families appear in the order first seen.
    """
    families: dict[str, tuple[list[str], dict[str, float]]] = {}
    for n, text in enumerate([own, *peers]):
        family = ""
        for line in text.decode().splitlines():
            if line.startswith("# HELP ") or line.startswith("# TYPE "):
                family = line.split(" ", 3)[2]
                if family not in families:
                    families[family] = ([], {})
                head = families[family][0]
                if len(head) < 2 and line not in head:
                    head.append(line)
                continue
            if not line or line.startswith("#") or (n and family in only_own):
                continue
            key, _, value = line.rpartition(" ")
            try:
                number = float(value)
            except ValueError:
                continue
            samples = families.setdefault(family, ([], {}))[1]
            if key in samples:
                earliest = key.split("{", 1)[0].endswith("_created")
                samples[key] = min(samples[key], number) if earliest else samples[key] + number
            else:
                samples[key] = number
    out: list[str] = []
    for head, samples in families.values():
        out += head
        out += [f"{key} {_number(v)}" for key, v in samples.items()]
    return ("\n".join(out) + "\n").encode()


def _number(value: float) -> str:
    if value != value:
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def _remember(table: dict[str, int], key: str, value: int) -> None:
    if len(table) >= MAX_TRACKED:
        del table[next(iter(table))]
    table[key] = value


class _Count:
    """One counter series: its value and when it was first counted (``_created``)."""

    __slots__ = ("created", "value")

    def __init__(self) -> None:
        self.value = 0
        self.created = time.time()


_BOUNDS = (*_LATENCY_BUCKETS, float("inf"))
#: The ``le`` labels, written as ``prometheus_client`` writes them.
_LE: tuple[str, ...] = tuple(floatToGoString(b) for b in _BOUNDS)  # type: ignore[no-untyped-call]


class _Histogram:
    """One histogram series over :data:`_LATENCY_BUCKETS`, as ``prometheus_client`` keeps it.

    A value goes to the first bucket whose bound is at least the value
    (``le``); the buckets are made cumulative only when scraped.
    """

    __slots__ = ("buckets", "created", "sum")

    def __init__(self) -> None:
        self.buckets = [0] * len(_BOUNDS)
        self.sum = 0.0
        self.created = time.time()

    def observe(self, value: float) -> None:
        self.buckets[bisect_left(_BOUNDS, value)] += 1
        self.sum += value


class _EventCollector(Collector):
    """The event series of a :class:`GatewayMetrics`, built at each scrape.

    The families, their samples and their order are those
    ``prometheus_client``'s ``Counter`` and ``Histogram`` give: labelled
    series in the order first counted, ``_created`` unless disabled.
    """

    def __init__(self, metrics: GatewayMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterable[Metric]:
        m = self.metrics
        # prometheus_client's own switch (PROMETHEUS_DISABLE_CREATED_SERIES,
        # disable_created_metrics()); a private name, so read with a default.
        created = bool(getattr(prometheus_metrics, "_use_created", True))
        yield _counter(
            "ledgerq_batches_accepted",
            "Batches accepted by POST /batches.",
            None,
            {"": _Total(m.accepted_total, m._accepted_created)},
            created,
        )
        yield _counter(
            "ledgerq_submission_attempts",
            "POSTs of a batch to the ledger, by the ledger's response.",
            "response",
            m._attempts_by,
            created,
        )
        yield _counter(
            "ledgerq_monitor_polls",
            "Batch status reads of the ledger.",
            "result",
            {"ok": m._polls_ok, "error": m._polls_error},
            created,
        )
        yield _counter(
            "ledgerq_ledger_statuses",
            "Batch statuses reported by the ledger (polls and events).",
            "status",
            m._reported_by,
            created,
        )
        yield _histogram(
            "ledgerq_stage_latency_seconds",
            "Per-stage latency: queued (accepted to first POST), submit (one POST), "
            "ledger (first POST to final status).",
            "stage",
            {"submit": m._stage_submit, "queued": m._stage_queued, "ledger": m._stage_ledger},
            created,
        )
        yield _histogram(
            "ledgerq_end_to_end_latency_seconds",
            "From acceptance by POST /batches to a final status on the ledger.",
            None,
            {"": m._e2e},
            created,
        )


class _Total(NamedTuple):
    value: int
    created: float


def _counter(
    name: str,
    doc: str,
    label: str | None,
    series: Mapping[str, _Count | _Total],
    created: bool,
) -> Metric:
    family = Metric(name, doc, "counter")
    for value, count in series.items():
        labels = {} if label is None else {label: value}
        family.add_sample(name + "_total", labels, count.value)
        if created:
            family.add_sample(name + "_created", labels, count.created)
    return family


def _histogram(
    name: str, doc: str, label: str | None, series: Mapping[str, _Histogram], created: bool
) -> Metric:
    family = Metric(name, doc, "histogram")
    for value, h in series.items():
        labels = {} if label is None else {label: value}
        acc = 0
        for le, n in zip(_LE, h.buckets, strict=True):
            acc += n
            family.add_sample(name + "_bucket", {**labels, "le": le}, acc)
        family.add_sample(name + "_count", labels, acc)
        family.add_sample(name + "_sum", labels, h.sum)
        if created:
            family.add_sample(name + "_created", labels, h.created)
    return family


class InstrumentedLedger:
    """A :class:`~ledgerq.ledgers.base.LedgerClient` that counts and times what it forwards."""

    def __init__(self, inner: LedgerClient, metrics: GatewayMetrics) -> None:
        self.inner = inner
        self.metrics = metrics
        self.description = inner.description

    async def submit(self, service_id: str, batch_id: str, serialized_batch: bytes) -> SubmitResult:
        self.metrics.posting(batch_id)
        started = time.monotonic()
        result = await self.inner.submit(service_id, batch_id, serialized_batch)
        self.metrics.posted(batch_id, result, time.monotonic() - started)
        return result

    async def transaction_committed(self, transaction_id: str) -> bool:
        return await self.inner.transaction_committed(transaction_id)

    async def batch_statuses(
        self, service_id: str, batch_ids: Sequence[str], *, wait_s: float = 0.0
    ) -> tuple[LedgerBatchStatus, ...]:
        try:
            statuses = await self.inner.batch_statuses(service_id, batch_ids, wait_s=wait_s)
        except Exception:
            self.metrics.polled(False)
            raise
        self.metrics.polled(True)
        for s in statuses:
            self.metrics.status_reported(s.batch_id, s.status)
        return statuses

    def events(self) -> AsyncIterator[CommitEvent] | None:
        stream = self.inner.events()
        return None if stream is None else self._events(stream)

    def triggers(self) -> AsyncIterator[None] | None:
        return self.inner.triggers()

    async def _events(self, stream: AsyncIterator[CommitEvent]) -> AsyncIterator[CommitEvent]:
        async for event in stream:
            self.metrics.status_reported(event.batch_id, event.status)
            yield event

    async def close(self) -> None:
        await self.inner.close()

    def __getattr__(self, name: str) -> Any:
        # Client-specific extras (the node client's handle, say) stay reachable.
        return getattr(self.inner, name)


class _FollowerCollector(Collector):
    def __init__(self, follower: FollowerStats) -> None:
        self.follower = follower

    def collect(self) -> Iterable[Metric]:
        f = self.follower
        yield GaugeMetricFamily(
            "ledgerq_follow_parked_requests",
            "Status reads parked at the ledger right now (one per pending batch).",
            value=f.parked,
        )
        yield GaugeMetricFamily(
            "ledgerq_follow_parked_limit",
            "Most status reads parked at once (monitor.max_parked).",
            value=f.settings.max_parked,
        )
        yield GaugeMetricFamily(
            "ledgerq_follow_waiting_for_slot",
            "Pending batches waiting for a parked read (the limit is reached) or backing off.",
            value=f.waiting_for_slot,
        )
        yield GaugeMetricFamily(
            "ledgerq_followed_batches",
            "Batches the follower follows (pending, or being asked about).",
            value=len(f.followed),
        )
        yield CounterMetricFamily(
            "ledgerq_follow_asked_batches",
            "Batches asked about without wait (ambiguous, orphaned, adopted).",
            value=f.asked,
        )
        yield CounterMetricFamily(
            "ledgerq_follow_scans", "Safety-net scans of the in-flight batches.", value=f.scans
        )


class _ClaimsCollector(Collector):
    def __init__(self, metrics: GatewayMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterable[Metric]:
        claims = self.metrics.claims
        yield GaugeMetricFamily(
            "ledgerq_services_claimed",
            "Services this instance has claimed.",
            value=0 if claims is None else len(claims.claimed_services()),
        )


class _TakesCollector(Collector):
    def __init__(self, pipeline: PipelineStats) -> None:
        self.pipeline = pipeline

    def collect(self) -> Iterable[Metric]:
        s = self.pipeline
        family = CounterMetricFamily(
            "ledgerq_batches_taken_with_final",
            "Batches recorded taken in the transaction of a final status: a serial "
            "service's next batch (next), or batches a parallel final status freed (freed).",
            labels=["how"],
        )
        family.add_metric(["next"], s.taken_with_final - s.taken_freed)
        family.add_metric(["freed"], s.taken_freed)
        yield family


class _NodeCollector(Collector):
    def __init__(self, node: Any) -> None:
        self.node = node

    def collect(self) -> Iterable[Metric]:
        ledger = self.node.ledger
        yield CounterMetricFamily(
            "ledgerq_node_transactions_committed",
            "Transactions (Sawtooth batches) the node's ordering machine has executed, "
            "COMMITTED or INVALID alike; rate() gives transactions/s.",
            value=ledger.committed,
        )
        yield CounterMetricFamily(
            "ledgerq_node_transactions_submitted",
            "Transactions acknowledged by the node.",
            value=ledger.submissions,
        )
        yield GaugeMetricFamily(
            "ledgerq_node_transactions_pending",
            "Transactions acknowledged but not yet committed.",
            value=ledger.uncommitted,
        )
        yield CounterMetricFamily(
            "ledgerq_node_final_statuses",
            "Batches that reached COMMITTED or INVALID (event stream sequence).",
            value=ledger.event_seq,
        )


def node_registry(node: Any) -> CollectorRegistry:
    """A registry of its own reading ``node``'s counters at scrape time."""
    registry = CollectorRegistry(auto_describe=True)
    registry.register(_NodeCollector(node))
    return registry

"""``serve --workers``: how many workers a configuration gets, what each is
told, and the bus they talk over (wake-ups, who is alive)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from ledgerq.config import load_settings
from ledgerq.errors import ConfigError
from ledgerq.gateway.bus import WorkerBus, WorkerInfo, socket_pairs
from ledgerq.gateway.workers import (
    Supervisor,
    WorkerSpec,
    listening_socket,
    resolve_workers,
    worker_instance_id,
)

PG = "postgresql://ledgerq@db.example/ledgerq"


def _settings(tmp_path: Path, **flags: object) -> object:
    return load_settings(flags, environ={}, cwd=tmp_path)


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ({"db": "sqlite:///x.sqlite3"}, os.cpu_count() or 1),
        ({"db": "sqlite:///x.sqlite3", "workers": 3}, 3),
        ({"db": PG, "ledger": "sawtooth+http://n:8008"}, os.cpu_count() or 1),
        ({"db": PG, "ledger": "sawtooth+http://n:8008", "workers": 4}, 4),
        # One process by nature: the default falls back to one worker.
        ({"db": "memory://"}, 1),
        ({"db": PG, "ledger": "node"}, 1),
        ({"db": "memory://", "workers": 1}, 1),
    ],
)
def test_the_number_of_workers(tmp_path: Path, flags: dict[str, object], expected: int) -> None:
    assert resolve_workers(load_settings(flags, environ={}, cwd=tmp_path)) == expected


@pytest.mark.parametrize(
    ("flags", "reason"),
    [
        ({"db": "memory://", "workers": 2}, "memory:// store lives in one process"),
        ({"db": PG, "ledger": "node", "workers": 2}, "ledgerq node"),
    ],
)
def test_more_workers_than_the_setup_allows_are_refused(
    tmp_path: Path, flags: dict[str, object], reason: str
) -> None:
    with pytest.raises(ConfigError, match=reason):
        resolve_workers(load_settings(flags, environ={}, cwd=tmp_path))


def test_the_workers_setting_is_validated(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="LEDGERQ_WORKERS"):
        load_settings(environ={"LEDGERQ_WORKERS": "-1"}, cwd=tmp_path)


def test_a_configured_instance_id_is_made_unique_per_worker_and_restart() -> None:
    assert worker_instance_id("", 1, 0) == ""  # generated per process
    assert worker_instance_id("gw", 0, 0) == "gw-0"
    assert worker_instance_id("gw", 1, 2) == "gw-1.2"
    assert len(worker_instance_id("x" * 128, 7, 3)) == 128


def test_a_spec_survives_the_trip_to_the_worker(tmp_path: Path) -> None:
    settings = load_settings({"db": PG, "workers": 2}, environ={}, cwd=tmp_path)
    spec = WorkerSpec(
        values=dict(settings.values),
        sources=dict(settings.sources),
        config_file=None,
        index=1,
        count=2,
        role="gateway",
        restarts=0,
        port=8080,
        inbox_fd=5,
        outbox_fds=[6],
        lifeline_fd=7,
        supervisor_pid=1,
    )
    again = WorkerSpec.from_json(spec.to_json())
    assert again == spec
    assert again.settings().values == settings.values
    assert again.settings().sources["workers"] == "flag"


def test_workers_share_one_port(tmp_path: Path) -> None:
    placeholder = listening_socket("127.0.0.1", 0, listen=False)
    port = placeholder.getsockname()[1]
    first = listening_socket("127.0.0.1", port, listen=True)
    second = listening_socket("127.0.0.1", port, listen=True)
    try:
        assert first.getsockname()[1] == second.getsockname()[1] == port
    finally:
        for s in (placeholder, first, second):
            s.close()


def test_a_port_another_gateway_listens_on_is_refused(tmp_path: Path) -> None:
    # Another `serve --workers N`: its placeholder and a listening worker,
    # both with SO_REUSEPORT, which our workers could otherwise join.
    placeholder = listening_socket("127.0.0.1", 0, listen=False)
    port = placeholder.getsockname()[1]
    worker = listening_socket("127.0.0.1", port, listen=True)
    try:
        settings = load_settings({"bind": f"127.0.0.1:{port}"}, environ={}, cwd=tmp_path)
        refused = f"127.0.0.1:{port}: Address already in use: another process listens there"
        with pytest.raises(ConfigError, match=refused):
            Supervisor(settings, 2, worker_module="ledgerq.commands.worker")
    finally:
        worker.close()
        placeholder.close()
    # Once it is gone the port is ours; our own placeholder does not count.
    supervisor = Supervisor(settings, 2, worker_module="ledgerq.commands.worker")
    try:
        assert supervisor.port == port
    finally:
        supervisor.close()
        supervisor.close()  # once: a second call gives back nothing again


def _info(index: int, role: str = "gateway") -> WorkerInfo:
    return WorkerInfo(
        index=index,
        count=2,
        pid=1000 + index,
        role=role,
        instance_id=None,
        started_at=0,
        restarts=0,
    )


def _buses(*, relay: bool) -> tuple[WorkerBus, WorkerBus]:
    (in0, out0), (in1, out1) = socket_pairs(2)
    return (
        WorkerBus(_info(0), in0, [out1], relay_wakeups=relay),
        WorkerBus(_info(1, "ingest"), in1, [out0], relay_wakeups=relay),
    )


async def test_wake_ups_and_hellos_cross_the_bus() -> None:
    zero, one = _buses(relay=True)
    woken: asyncio.Queue[str] = asyncio.Queue()
    zero.on_wake(woken.put_nowait)
    one.count_accepted(lambda: 42)
    tasks = [asyncio.create_task(b.run()) for b in (zero, one)]
    try:
        one.publish("svc-a")
        one.publish_many([f"svc-{i}" for i in range(3_000)])
        got = [await asyncio.wait_for(woken.get(), 10) for _ in range(3_001)]
        assert got[0] == "svc-a" and got[-1] == "svc-2999"
        # Hellos: each knows the other, with its count of accepted batches.
        await asyncio.wait_for(zero.heard.wait(), 10)  # the first hello is sent at once
        listed = zero.workers()
        assert [(w.index, w.role) for w in listed] == [(0, "gateway"), (1, "ingest")]
        assert listed[1].accepted == 42
    finally:
        for b in (zero, one):
            b.stop()
        await asyncio.gather(*tasks)


async def test_without_relay_only_hellos_are_sent() -> None:
    zero, one = _buses(relay=False)
    one.publish("svc-a")
    assert one.sent == 0
    one.publish_many(["svc-b"])
    assert one.sent == 0
    zero.close()
    one.close()


async def test_a_full_inbox_drops_messages_instead_of_blocking() -> None:
    zero, one = _buses(relay=True)
    # Nobody reads worker 0's inbox: sends fill it, then are dropped.
    for i in range(100_000):
        one.publish(f"svc-{i}")
        if one.dropped:
            break
    assert one.dropped > 0
    zero.close()
    one.close()


def test_expositions_add_up_sample_by_sample() -> None:
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

    from ledgerq.operator.metrics import merge_expositions

    def worker(accepted: int, posted: int, latency: float, depth: int) -> bytes:
        r = CollectorRegistry()
        Counter("x_accepted", "Accepted.", registry=r).inc(accepted)
        c = Counter("x_attempts", "Attempts.", ["response"], registry=r)
        if posted:
            c.labels("accepted").inc(posted)
        Histogram("x_latency", "Latency.", buckets=(0.1, 1.0), registry=r).observe(latency)
        Gauge("x_depth", "Store depth.", registry=r).set(depth)
        return generate_latest(r)

    merged = merge_expositions(
        worker(3, 0, 0.05, 7), [worker(4, 5, 0.5, 6)], only_own=frozenset({"x_depth"})
    ).decode()
    lines = merged.splitlines()
    assert "x_accepted_total 7.0" in lines
    assert 'x_attempts_total{response="accepted"} 5.0' in lines
    assert 'x_latency_bucket{le="0.1"} 1.0' in lines
    assert 'x_latency_bucket{le="+Inf"} 2.0' in lines
    assert "x_latency_count 2.0" in lines
    assert "x_depth 7.0" in lines  # the store's figure, once
    assert lines.count("# TYPE x_accepted_total counter") == 1
    assert merge_expositions(b"a 1\n", []) == b"a 1.0\n"


def test_claims_held_add_up_as_every_worker_holds_them_now() -> None:
    # A worker's exposition reaches another worker's /metrics without a
    # scrape (a refresh) of its own: its claims are read as it makes it, not
    # as they were the last time the kernel routed /metrics to it.
    from ledgerq.operator.metrics import GatewayMetrics, merge_expositions

    class Claims:
        def __init__(self, *services: str) -> None:
            self.services = frozenset(services)

        def claimed_services(self, now: int | None = None) -> frozenset[str]:
            return self.services

    own, peer = GatewayMetrics(), GatewayMetrics()
    assert "ledgerq_services_claimed 0.0" in own.exposition().decode().splitlines()
    own.claims, peer.claims = Claims("a"), Claims("b", "c")
    merged = merge_expositions(own.exposition(), [peer.exposition()]).decode()
    assert "ledgerq_services_claimed 3.0" in merged.splitlines()
    peer.claims = Claims("b", "c", "d", "e")  # a rebalance since
    merged = merge_expositions(own.exposition(), [peer.exposition()]).decode()
    assert "ledgerq_services_claimed 5.0" in merged.splitlines()

"""The gateway under high availability: only claimed services are monitored,
services taken over have their in-flight batch checked at once, and the API
shows instances and claimants."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp.test_utils import TestClient, TestServer

from ledgerq.claims import ClaimInfo, InstanceInfo
from ledgerq.follow.in_flight import StoreMonitorSource
from ledgerq.ingest.api import GatewayApi
from ledgerq.model import BatchStatusName, Delayed, Pending, TrackingBatch

T0 = 1_700_000_000_000


def _batch(
    service: str, n: int, *, submitted: bool, status: Any = None, at: int = T0
) -> TrackingBatch:
    return TrackingBatch(
        service_id=service,
        batch_header=f"{service}-{n}",
        data_change_id=None,
        signer_public_key="02" + "ab" * 32,
        trace=False,
        serialized_batch=b"",
        submitted=submitted,
        created_at=at,
        batch_status=status,
        seq=n,
        last_attempt_at=at if submitted else None,
    )


class FakeInFlight:
    def __init__(self, batches: Iterable[TrackingBatch]) -> None:
        self.batches = list(batches)

    async def list_in_flight(self, *, limit: int = 10_000) -> list[TrackingBatch]:
        return [b for b in self.batches if b.status_name is BatchStatusName.PENDING or b.submitted][
            :limit
        ]


async def test_monitor_follows_only_claimed_services() -> None:
    store = FakeInFlight(
        [
            _batch("mine", 1, submitted=True, status=Pending()),
            _batch("theirs", 2, submitted=True, status=Pending()),
            _batch("taken", 3, submitted=True),  # left in flight by the previous holder
            _batch("taken", 4, submitted=False),
            # Taken for resubmission after Delayed, then its submitter died.
            _batch("resent", 6, submitted=True, status=Delayed()),
            _batch("theirs", 5, submitted=True),
        ]
    )
    claimed = {"mine"}
    source = StoreMonitorSource(store, services=lambda: claimed)
    first = await source.monitored_batches(limit=100)
    assert [b.batch_id for b in first] == ["mine-1"]
    # A service taken over: its batch left in flight is followed (asked) at once.
    claimed.update({"taken", "resent"})
    adopted = await source.monitored_batches(limit=100)
    assert [b.batch_id for b in adopted] == ["mine-1", "taken-3", "resent-6"]


@dataclass(frozen=True)
class Service:
    service_id: str
    queue_depth: int = 1
    head_batch_id: str | None = None
    in_flight_batch_id: str | None = None
    total: int = 1
    in_flight: int = 0
    next_batch_id: str | None = None
    blocker_batch_id: str | None = None
    blocker_kind: str | None = None
    blocker_on: str | None = None
    paused: bool = False
    paused_by: str | None = None
    paused_at: int | None = None
    halted_batch_id: str | None = None
    halted_reason: str | None = None
    halted_at: int | None = None
    next_waits_for: str | None = None


class FakeApiStore:
    async def list_services(self, *, limit: int = 1000, after: str | None = None) -> list[Service]:
        return [Service("a", in_flight_batch_id="b1"), Service("b"), Service("c")]


class FakeClaims:
    async def list_instances(self, now: int | None = None) -> list[InstanceInfo]:
        return [InstanceInfo("gw-1", T0, T0 + 5, "127.0.0.1:8080", 2, True)]

    async def claims_for(self, service_ids: Sequence[str]) -> dict[str, ClaimInfo]:
        return {
            "a": ClaimInfo("a", "gw-1", 3, T0 + 5_000, T0 + 30_000, T0, None),
            "b": ClaimInfo("b", None, 1, None, None, None, T0),
        }


class LongIdClaims(FakeClaims):
    async def list_instances(self, now: int | None = None) -> list[InstanceInfo]:
        long = InstanceInfo(
            "gw-2.example.com-48213-9f3e2a1c", T0, T0, "gw-2.example.com:8080", 0, False
        )
        return [*await super().list_instances(now), long]


async def _get(api: GatewayApi, path: str) -> Any:
    async with TestClient(TestServer(api.app())) as client:
        resp = await client.get(path)
        assert resp.status == 200
        return await resp.json()


async def test_services_show_claimant_and_why_a_service_waits() -> None:
    api = GatewayApi(FakeApiStore(), claims=FakeClaims())  # type: ignore[arg-type]
    body = await _get(api, "/services")
    by_id = {s["service_id"]: s for s in body["data"]}
    assert by_id["a"]["claimant"] == "gw-1"
    assert by_id["a"]["claim_epoch"] == 3
    assert by_id["a"]["claim_expiry_1"] == T0 + 5_000
    assert "b1" in by_id["a"]["lock_reason"]
    assert by_id["b"]["claimant"] is None
    assert by_id["b"]["lock_reason"] == "no gateway instance holds a claim on it yet"
    assert by_id["c"]["claimant"] is None


async def test_instances_list_the_gateways_sharing_the_database() -> None:
    api = GatewayApi(FakeApiStore(), claims=FakeClaims())  # type: ignore[arg-type]
    body = await _get(api, "/instances")
    assert body["high_availability"] is True
    assert body["data"] == [
        {
            "instance_id": "gw-1",
            "started_at": T0,
            "last_renewal": T0 + 5,
            "address": "127.0.0.1:8080",
            "claims": 2,
            "live": True,
        }
    ]
    assert body["ledger"] == "the ledger"
    single = GatewayApi(FakeApiStore(), ledger_name="http://127.0.0.1:8008")  # type: ignore[arg-type]
    assert await _get(single, "/instances") == {
        "data": [],
        "high_availability": False,
        "ledger": "http://127.0.0.1:8008",
    }


async def test_cli_shows_instances_and_claimants() -> None:
    import asyncio

    from click.testing import CliRunner

    from ledgerq.cli import cli

    api = GatewayApi(FakeApiStore(), claims=LongIdClaims())  # type: ignore[arg-type]
    async with TestClient(TestServer(api.app(), host="127.0.0.1", port=0)) as client:
        url = str(client.make_url(""))
        runner = CliRunner()
        shown = await asyncio.to_thread(runner.invoke, cli, ["instances", "--url", url])
        assert shown.exit_code == 0, shown.output
        # Whole, though the output is no terminal (80 columns by default).
        assert "gw-2.example.com-48213-9f3e2a1c" in shown.output
        assert "gw-2.example.com:8080" in shown.output
        assert "yes" in shown.output
        listed = await asyncio.to_thread(runner.invoke, cli, ["services", "--url", url])
        assert listed.exit_code == 0, listed.output
        assert "no gateway instance holds a claim" in listed.output
        assert "gw-1" in listed.output
        raw = await asyncio.to_thread(runner.invoke, cli, ["instances", "--url", url, "--json"])
        assert '"high_availability": true' in raw.output
    down = await asyncio.to_thread(
        CliRunner().invoke, cli, ["instances", "--url", "http://127.0.0.1:1"]
    )
    assert down.exit_code != 0
    assert "cannot reach the gateway" in down.output


async def test_a_take_over_asks_across_services_only_where_the_status_route_allows() -> None:
    from ledgerq.gateway.takeover import statuses_span_services
    from ledgerq.ledgers import http_ledger_client
    from ledgerq.operator import GatewayMetrics

    sawtooth = http_ledger_client("sawtooth+http://127.0.0.1:8008")
    splinter = http_ledger_client("splinter+http://127.0.0.1:8085")
    try:
        assert statuses_span_services(sawtooth)
        # Splinter's status route is per scabbard service: one read each.
        assert not statuses_span_services(splinter)
        # Seen through the gateway's wrappers too.
        wrapped = GatewayMetrics().instrument(sawtooth)
        assert statuses_span_services(wrapped)
        assert not statuses_span_services(object())
    finally:
        await sawtooth.close()
        await splinter.close()


async def test_cli_shows_the_workers_behind_the_port() -> None:
    # operations.md: `ledgerq instances` lists the workers of serve --workers
    # with their pid, role, restarts and batches accepted.
    from click.testing import CliRunner

    from ledgerq.cli import cli
    from ledgerq.gateway.bus import WorkerInfo

    def workers() -> list[WorkerInfo]:
        return [
            WorkerInfo(0, 2, 4101, "gateway", "gw-0", T0, 0, accepted=120),
            WorkerInfo(1, 2, 4177, "gateway", "gw-1.2", T0, 2, accepted=95),
        ]

    for claims in (FakeClaims(), None):
        api = GatewayApi(FakeApiStore(), claims=claims)  # type: ignore[arg-type]
        api.workers = workers
        async with TestClient(TestServer(api.app(), host="127.0.0.1", port=0)) as client:
            url = str(client.make_url(""))
            shown = await asyncio.to_thread(CliRunner().invoke, cli, ["instances", "--url", url])
        assert shown.exit_code == 0, shown.output
        lines = shown.output.splitlines()
        assert any("4101" in r and "gw-0" in r and "120" in r for r in lines), shown.output
        assert any("4177" in r and "gw-1.2" in r and "95" in r for r in lines), shown.output

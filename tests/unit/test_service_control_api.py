"""Operator control of a service over REST (``ledgerq.ingest.control``).

A real gateway app on 127.0.0.1 (``tests.operator_fakes.running_gateway``:
SQLite store, the gateway's middlewares) and a real HTTP client: pause,
resume, skip past a halt, cancel queued batches, one service's state and
history; every refusal a precise 4xx.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from ledgerq.ingest.api import GatewayApi
from ledgerq.model import (
    DEPENDENCY,
    BatchStatusName,
    BatchWrite,
    Committed,
    Invalid,
    InvalidTransaction,
    SubmissionError,
)
from ledgerq.store import open_store
from ledgerq.store.base import BatchTrackingStore
from tests.operator_fakes import batch_list, running_gateway

OCTET = {"Content-Type": "application/octet-stream"}
SVC = "acme::orders"


async def post_batches(
    http: aiohttp.ClientSession, url: str, n: int, service: str = SVC
) -> list[str]:
    body, ids = batch_list(n, service.replace(":", "-"))
    async with http.post(
        f"{url}/batches", params={"service_id": service}, data=body, headers=OCTET
    ) as r:
        assert r.status == 202, await r.text()
    return ids


async def act(
    http: aiohttp.ClientSession, url: str, action: str, body: Any = None, service: str = SVC
) -> tuple[int, dict[str, Any]]:
    async with http.post(f"{url}/services/{service}/{action}", json=body) as r:
        return r.status, await r.json()


async def service(
    http: aiohttp.ClientSession, url: str, service: str = SVC, **params: str
) -> tuple[int, dict[str, Any]]:
    async with http.get(f"{url}/services/{service}", params=params) as r:
        return r.status, await r.json()


async def halt_at(store: BatchTrackingStore, batch_id: str, reason: str) -> None:
    """Record ``batch_id`` taken, then judged Invalid with a halt (``on_invalid = halt``)."""
    batch = await store.get_batch(batch_id, SVC)
    assert batch is not None
    invalid = Invalid(
        tuple(InvalidTransaction(t.transaction_header, reason) for t in batch.transactions)
    )
    for write in (
        BatchWrite(SVC, batch_id, attempt=True),
        BatchWrite(SVC, batch_id, invalid, halt=reason),
    ):
        assert await store.apply_writes([write]) == [None]


@pytest.fixture
async def gateway() -> AsyncIterator[tuple[str, Any, aiohttp.ClientSession]]:
    async with running_gateway(pipeline=False) as (url, gw):
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
            yield url, gw, http


async def test_pause_and_resume_are_recorded_and_refused_when_they_mean_nothing(
    gateway: tuple[str, Any, aiohttp.ClientSession],
) -> None:
    url, _gw, http = gateway
    await post_batches(http, url, 2)
    status, doc = await act(http, url, "pause")
    assert status == 200
    paused = doc["data"]
    assert (paused["action"], paused["actor"], paused["service_id"]) == ("pause", "anonymous", SVC)
    assert paused["detail"] is None and paused["batch_ids"] == []
    status, doc = await act(http, url, "pause")
    assert (status, doc["data"]["detail"]) == (200, "already paused")
    status, doc = await act(http, url, "resume")
    assert status == 200
    status, doc = await act(http, url, "resume")
    assert status == 409
    assert doc["error"]["rule"] == "refused"
    assert doc["error"]["message"] == f"service {SVC!r} is not paused"
    status, doc = await service(http, url)
    assert status == 200
    assert doc["data"]["service_id"] == SVC
    assert doc["data"]["queue_depth"] == 2
    history = doc["data"]["history"]
    assert [h["action"] for h in history] == ["resume", "pause", "pause"]  # newest first
    assert history[-1] == paused


async def test_an_unknown_service_is_a_404_for_every_route(
    gateway: tuple[str, Any, aiohttp.ClientSession],
) -> None:
    url, _gw, http = gateway
    await post_batches(http, url, 1)
    bodies: dict[str, Any] = {"skip": {"batch_id": "ab" * 64}, "cancel": {"batch_ids": ["ab" * 64]}}
    for action in ("pause", "resume", "skip", "cancel"):
        status, doc = await act(http, url, action, bodies.get(action), service="acme::nothing")
        assert status == 404, action
        assert doc["error"]["rule"] == "unknown_service"
        assert "'acme::nothing'" in doc["error"]["message"]
    status, doc = await service(http, url, "acme::nothing")
    assert (status, doc["error"]["rule"]) == (404, "unknown_service")
    # A path that cannot name a service is refused before any handler runs.
    async with http.post(f"{url}/services/-bad!/pause") as r:
        assert r.status == 400
        assert (await r.json())["error"]["title"] == "Invalid Service Id"


async def test_skip_resumes_a_halted_service_past_the_batch_it_names(
    gateway: tuple[str, Any, aiohttp.ClientSession],
) -> None:
    url, gw, http = gateway
    first, second = await post_batches(http, url, 2)
    status, doc = await act(http, url, "skip", {"batch_id": first})
    assert status == 409
    assert "is not halted" in doc["error"]["message"]
    await halt_at(gw.store, first, "no such key")
    status, doc = await act(http, url, "skip", {"batch_id": second})
    assert status == 409
    assert doc["error"]["message"].startswith(f"service {SVC!r} is halted at batch {first}")
    status, doc = await act(http, url, "resume")
    assert status == 409
    assert "resume it past that batch (skip)" in doc["error"]["message"]
    status, doc = await act(http, url, "skip", {"batch_id": first})
    assert status == 200
    assert doc["data"]["batch_ids"] == [first]
    assert doc["data"]["detail"] == f"resumed past invalid batch {first}"
    assert SVC not in await gw.store.service_controls([SVC])
    # A batch the ledger judged INVALID reads Invalid (not Cancelled).
    async with http.get(f"{url}/batch_statuses", params={"id": first}) as r:
        [entry] = (await r.json())["data"]
    assert (entry["status"], entry["ledgerq_status"]) == ("INVALID", "Invalid")
    _status, doc = await service(http, url)
    assert [h["action"] for h in doc["data"]["history"]] == ["skip", "halt"]
    assert doc["data"]["history"][1]["actor"] == "gateway"


async def test_cancel_makes_queued_batches_final_all_or_none(
    gateway: tuple[str, Any, aiohttp.ClientSession],
) -> None:
    url, gw, http = gateway
    taken, queued, also = await post_batches(http, url, 3)
    assert await gw.store.apply_writes([BatchWrite(SVC, taken, attempt=True)]) == [None]
    status, doc = await act(http, url, "cancel", {"batch_ids": [queued, taken]})
    assert status == 409
    assert f"batch {taken} of service {SVC!r} is in flight" in doc["error"]["message"]
    got = await gw.store.get_batch(queued, SVC)
    assert got is not None and got.batch_status is None  # none of them
    status, doc = await act(http, url, "cancel", {"batch_ids": [queued, "cd" * 64]})
    assert (status, doc["error"]["rule"]) == (404, "unknown_batch")
    status, doc = await act(http, url, "cancel", {"batch_ids": [queued, also, queued]})
    assert status == 200
    action = doc["data"]
    assert action["batch_ids"] == [queued, also]
    assert action["detail"].startswith("cancelled by anonymous at ")
    async with http.get(f"{url}/batch_statuses", params={"id": f"{queued},{also}"}) as r:
        statuses = (await r.json())["data"]
    for entry in statuses:
        # Sawtooth's shape: INVALID, the message saying who and when; ledgerq's own: Cancelled.
        assert (entry["status"], entry["ledgerq_status"]) == ("INVALID", "Cancelled")
        assert [t["message"] for t in entry["invalid_transactions"]] == [action["detail"]]
    async with http.get(f"{url}/tracking/batches", params={"service_id": SVC}) as r:
        listed = {b["id"]: b["status"] for b in (await r.json())["data"]}
    assert listed == {taken: None, queued: "Cancelled", also: "Cancelled"}
    async with http.get(f"{url}/tracking/batches/{queued}") as r:
        one = (await r.json())["data"]
    assert (one["status"], one["error"]["type"]) == ("Cancelled", "cancelled")
    status, doc = await act(http, url, "cancel", {"batch_ids": [queued]})
    assert status == 409
    assert "final" in doc["error"]["message"]


@pytest.mark.parametrize(
    ("action", "body", "says"),
    [
        ("skip", None, "the body must be a JSON object"),
        ("skip", [], "the body must be a JSON object"),
        ("skip", {}, "batch_id is missing"),
        ("skip", {"batch_id": "ab" * 64, "why": "x"}, "unknown field 'why'"),
        ("skip", {"batch_ids": ["ab" * 64]}, "unknown field 'batch_ids'"),
        ("skip", {"batch_id": "AB" * 64}, "batch_id must be a batch id"),
        ("skip", {"batch_id": 7}, "batch_id must be a batch id"),
        ("cancel", {"batch_ids": []}, "non-empty list"),
        ("cancel", {"batch_ids": "ab" * 64}, "non-empty list"),
        ("cancel", {"batch_ids": ["dc:x"]}, "each of batch_ids must be a batch id"),
        ("cancel", {"batch_id": "ab" * 64}, "unknown field 'batch_id'"),
        ("cancel", {"batch_ids": [f"{i:0128x}" for i in range(1001)]}, "name at most 1000"),
    ],
)
async def test_a_malformed_body_is_a_400_naming_the_problem(
    gateway: tuple[str, Any, aiohttp.ClientSession], action: str, body: Any, says: str
) -> None:
    url, _gw, http = gateway
    await post_batches(http, url, 1)
    status, doc = await act(http, url, action, body)
    assert status == 400
    assert doc["error"]["rule"] == "bad_body"
    assert says in doc["error"]["message"]


async def test_a_body_that_is_not_json_is_refused(
    gateway: tuple[str, Any, aiohttp.ClientSession],
) -> None:
    url, _gw, http = gateway
    await post_batches(http, url, 1)
    path = f"{url}/services/{SVC}/cancel"
    async with http.post(path, data=b"{", headers={"Content-Type": "application/json"}) as r:
        assert r.status == 400
        assert (await r.json())["error"]["message"] == "the body is not JSON"
    async with http.post(path, data=b"batch_ids=x", headers=OCTET) as r:
        assert r.status == 415


async def test_the_history_is_paged_newest_first(
    gateway: tuple[str, Any, aiohttp.ClientSession],
) -> None:
    url, _gw, http = gateway
    await post_batches(http, url, 1)
    for action in ("pause", "resume", "pause", "resume", "pause"):
        status, _doc = await act(http, url, action)
        assert status == 200
    seen: list[str] = []
    next_link: str | None = f"{url}/services/{SVC}?limit=2"
    while next_link:
        async with http.get(next_link) as r:
            assert r.status == 200
            doc = await r.json()
        seen += [h["action"] for h in doc["data"]["history"]]
        assert doc["paging"]["limit"] == 2
        next_link = doc["paging"]["next"]
    assert seen == ["pause", "resume", "pause", "resume", "pause"]
    for bad in ({"limit": "0"}, {"limit": "1001"}, {"before": "x"}, {"before": "0"}):
        status, doc = await service(http, url, **bad)
        assert status == 400, bad
        assert next(iter(bad)) in doc["error"]["message"]


async def test_a_service_named_with_reserved_characters_is_reached() -> None:
    """``#none`` (batches posted without a service) is ``%23none`` in a path."""
    async with running_gateway(pipeline=False) as (url, _gw):
        async with aiohttp.ClientSession() as http:
            body, _ids = batch_list(1, "none")
            async with http.post(f"{url}/batches", data=body, headers=OCTET) as r:
                assert r.status == 202
            async with http.post(f"{url}/services/%23none/pause") as r:
                assert r.status == 200
                assert (await r.json())["data"]["service_id"] == "#none"
            for _ in range(2):
                async with http.post(f"{url}/services/%23none/pause") as r:
                    assert r.status == 200
            async with http.get(f"{url}/services/%23none?limit=2") as r:
                doc = await r.json()
            assert doc["paging"]["next"].endswith(
                "/services/%23none?limit=2&before=" + str(doc["data"]["history"][-1]["id"])
            )


async def test_each_action_that_lands_is_told_to_the_gateway_and_no_other() -> None:
    store = await open_store("memory://")
    told: list[str] = []

    async def on_control(service_id: str) -> None:
        told.append(service_id)

    api = GatewayApi(store, on_control=on_control)
    runner = web.AppRunner(api.app())
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        async with aiohttp.ClientSession() as http:
            await post_batches(http, url, 1)
            assert (await act(http, url, "resume"))[0] == 409
            assert (await act(http, url, "pause", service="acme::nothing"))[0] == 404
            assert told == []
            assert (await act(http, url, "pause"))[0] == 200
            assert (await act(http, url, "resume"))[0] == 200
            assert told == [SVC, SVC]
    finally:
        await runner.cleanup()
        await store.close()


async def test_a_resume_takes_effect_at_once_in_the_process_that_made_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The producer stopped a paused service (its take was refused); a
    resume made here reaches it at once, not at its next poll (ten minutes
    here)."""
    async with running_gateway({"submitter.poll_timeout_s": 600}) as (url, gw):
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
            [first] = await post_batches(http, url, 1)
            assert await statuses(http, url, [first], wait=10) == ["COMMITTED"]
            # Paused on another instance: this producer learns it when the
            # store refuses its take, and reads the service's controls.
            await gw.store.control_service(SVC, "pause", actor="elsewhere")
            read = gw.store.service_controls
            learned = asyncio.Event()

            async def watched(ids: Any = None) -> Any:
                controls = await read(ids)
                if ids is not None and SVC in controls and controls[SVC].paused:
                    learned.set()
                return controls

            monkeypatch.setattr(gw.store, "service_controls", watched)
            later = await post_batches(http, url, 2)
            await asyncio.wait_for(learned.wait(), 10)
            assert (await act(http, url, "resume"))[0] == 200
            assert await statuses(http, url, later, wait=10) == ["COMMITTED"] * 2
            assert gw.ledger.sent == [first, *later]


async def statuses(
    http: aiohttp.ClientSession, url: str, ids: list[str], *, wait: int = 0
) -> list[str]:
    params = {"id": ",".join(ids), "wait": str(wait)}
    async with http.get(f"{url}/batch_statuses", params=params) as r:
        return [e["status"] for e in (await r.json())["data"]]


ADMIN = "admin-token-0123456789abcdef"
ACME = "acme-token-0123456789abcdef"
OPS = "ops-token-0123456789abcdef"
AUDIT = "audit-token-0123456789abcdef"
TOKENS = [
    {"name": "acme", "token": ACME, "services": ["acme::*"]},
    {"name": "acme-ops", "token": OPS, "services": ["acme::*"], "access": "operate"},
    {"name": "audit", "token": AUDIT, "services": ["*"], "access": "read"},
]


async def test_only_operate_tokens_act_and_only_on_their_services() -> None:
    flags = {"auth.token": ADMIN, "auth.tokens": TOKENS}
    async with running_gateway(flags, pipeline=False) as (url, _gw):
        acme = aiohttp.ClientSession(headers={"Authorization": f"Bearer {ACME}"})
        ops = aiohttp.ClientSession(headers={"Authorization": f"Bearer {OPS}"})
        audit = aiohttp.ClientSession(headers={"Authorization": f"Bearer {AUDIT}"})
        admin = aiohttp.ClientSession(headers={"Authorization": f"Bearer {ADMIN}"})
        anyone = aiohttp.ClientSession()
        async with acme, ops, audit, admin, anyone:
            await post_batches(acme, url, 1)
            await post_batches(admin, url, 1, service="globex::ledger")
            # Posting batches is no operating, nor is reading.
            for http in (acme, audit):
                status, doc = await act(http, url, "pause")
                assert status == 403
                assert "may not pause, resume, skip or cancel" in doc["error"]["message"]
                assert "access operate" in doc["error"]["message"]
            status, doc = await act(anyone, url, "pause")
            assert status == 401
            status, doc = await act(ops, url, "pause", service="globex::ledger")
            assert (status, doc["error"]["rule"]) == (403, "out_of_scope")
            assert "'globex::ledger'" in doc["error"]["message"]
            status, doc = await act(ops, url, "pause")
            assert (status, doc["data"]["actor"]) == (200, "acme-ops")
            status, doc = await act(admin, url, "resume")
            assert (status, doc["data"]["actor"]) == (200, "auth.token")
            # operate reads its services (an operator acts on what it sees), posts nothing.
            status, doc = await service(ops, url)
            assert status == 200
            assert [(h["action"], h["actor"]) for h in doc["data"]["history"]] == [
                ("resume", "auth.token"),
                ("pause", "acme-ops"),
            ]
            status, doc = await service(ops, url, "globex::ledger")
            assert (status, doc["error"]["rule"]) == (403, "out_of_scope")
            async with ops.get(f"{url}/services") as r:
                assert [s["service_id"] for s in (await r.json())["data"]] == [SVC]
            body, _ids = batch_list(1, "more")
            async with ops.post(
                f"{url}/batches", params={"service_id": SVC}, data=body, headers=OCTET
            ) as r:
                assert r.status == 403
            # The history needs read access: a read-only token sees it.
            status, doc = await service(audit, url)
            assert status == 200 and len(doc["data"]["history"]) == 2


async def test_services_say_what_stops_a_service_and_why(
    gateway: tuple[str, Any, aiohttp.ClientSession],
) -> None:
    url, gw, http = gateway
    first, second = await post_batches(http, url, 2)
    await post_batches(http, url, 1, service="acme::other")

    async def listed() -> dict[str, dict[str, Any]]:
        async with http.get(f"{url}/services") as r:
            assert r.status == 200
            by_id = {s["service_id"]: s for s in (await r.json())["data"]}
        _status, doc = await service(http, url)
        one = {k: v for k, v in doc["data"].items() if k not in ("history", "queued")}
        assert one == by_id[SVC]  # GET /services/{id} says what /services says
        assert by_id["acme::other"]["lock_reason"] is None
        return by_id

    s = (await listed())[SVC]
    assert (s["paused"], s["halted"], s["waits_for"], s["lock_reason"]) == (None,) * 4
    await halt_at(gw.store, first, "no such key")
    s = (await listed())[SVC]
    assert s["halted"] == {"batch_id": first, "reason": "no such key", "at": s["halted"]["at"]}
    [halt] = await gw.store.service_actions(SVC)
    assert s["halted"]["at"] == halt.at
    assert s["lock_reason"] == f"halted at batch {first}: no such key"
    assert (await act(http, url, "pause"))[0] == 200
    s = (await listed())[SVC]
    assert s["paused"] == {"by": "anonymous", "at": s["paused"]["at"]}
    assert isinstance(s["paused"]["at"], int)
    assert s["lock_reason"] == f"halted at batch {first}: no such key"  # the halt first
    assert (await act(http, url, "skip", {"batch_id": first}))[0] == 200
    s = (await listed())[SVC]
    assert (s["halted"], s["lock_reason"]) == (None, "paused by anonymous")
    assert (await act(http, url, "resume"))[0] == 200
    waits = f"waits for transaction {'ab' * 64}, not seen on the ledger"
    error = SubmissionError(DEPENDENCY, waits)
    assert await gw.store.apply_writes([BatchWrite(SVC, second, None, (), error)]) == [None]
    s = (await listed())[SVC]
    assert (s["paused"], s["halted"]) == (None, None)
    assert (s["next_batch_id"], s["waits_for"], s["lock_reason"]) == (second, waits, waits)


async def test_the_service_lists_the_batches_a_cancel_may_name(
    gateway: tuple[str, Any, aiohttp.ClientSession],
) -> None:
    url, gw, http = gateway
    taken, delayed, queued, done = await post_batches(http, url, 4)
    for write in (
        BatchWrite(SVC, taken, attempt=True),
        BatchWrite(SVC, delayed, BatchStatusName.DELAYED, attempt=True),
        BatchWrite(SVC, done, Committed()),
    ):
        assert await gw.store.apply_writes([write]) == [None]
    status, doc = await service(http, url)
    assert status == 200
    assert doc["data"]["queued"] == [delayed, queued]  # in acceptance order
    status, _doc = await act(http, url, "cancel", {"batch_ids": doc["data"]["queued"]})
    assert status == 200
    assert (await service(http, url))[1]["data"]["queued"] == []

"""The gateway under the parallel strategy: independent batches of a service with the
ledger together, conflicting ones one after the other; `/services` says what
is in flight and what holds the next batch."""

from __future__ import annotations

import asyncio

import aiohttp

from ledgerq.codec import Signer, encode_batch_list
from ledgerq.codec.intkey import make_address, make_intkey_batch
from ledgerq.model import Committed
from tests.ledger_fakes import ScriptedLedger
from tests.operator_fakes import running_gateway

OCTET = {"Content-Type": "application/octet-stream"}
SIGNER = Signer.generate()


async def post(http: aiohttp.ClientSession, url: str, service: str, *batches: object) -> None:
    async with http.post(
        f"{url}/batches",
        params={"service_id": service},
        data=encode_batch_list(batches),  # type: ignore[arg-type]
        headers=OCTET,
    ) as r:
        assert r.status == 202, await r.text()


async def until(condition: object, timeout_s: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition():  # type: ignore[operator]
        assert loop.time() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


async def services(http: aiohttp.ClientSession, url: str) -> dict[str, dict[str, object]]:
    async with http.get(f"{url}/services") as r:
        assert r.status == 200
        return {s["service_id"]: s for s in (await r.json())["data"]}


async def test_independent_batches_go_together_and_conflicting_ones_wait() -> None:
    ledger = ScriptedLedger()  # accepts and keeps everything pending until told
    names = ["a", "b", "c"]
    first = [make_intkey_batch(SIGNER, [("set", n, 0)]) for n in names]
    second = make_intkey_batch(SIGNER, [("inc", "a", 1)])
    ids = [b.header_signature for b in first]
    flags = {"queuer.strategy_by_service": "par::*=parallel", "submitter.poll_timeout_s": 0.05}
    async with (
        running_gateway(flags, ledger) as (url, _gateway),
        aiohttp.ClientSession() as http,
    ):
        await post(http, url, "par::1", *first, second)
        await post(
            http, url, "ser::1", *(make_intkey_batch(SIGNER, [("set", n, 0)]) for n in names)
        )
        # The three sets of the parallel service are with the ledger together.
        await until(lambda: set(ids) <= set(ledger.sent))
        await until(lambda: len(ledger.sent) == 4)  # and one batch of the serial service
        await asyncio.sleep(0.2)
        assert second.header_signature not in ledger.sent
        assert len(ledger.sent) == 4
        listed = await services(http, url)
        par, ser = listed["par::1"], listed["ser::1"]
        assert (par["strategy"], par["in_flight"]) == ("parallel", 3)
        assert par["next_batch_id"] == second.header_signature
        assert par["blocked_by"] == {"batch_id": ids[0], "kind": "writes", "on": make_address("a")}
        assert f"waits for batch {ids[0]}" in str(par["lock_reason"])
        assert (ser["strategy"], ser["in_flight"]) == ("serial", 1)
        assert "with the submitter or the ledger" in str(ser["lock_reason"])
        # Once the batch it conflicts with is committed, the held one goes.
        ledger.statuses[ids[0]] = Committed()
        await until(lambda: second.header_signature in ledger.sent)
        assert ledger.sent.count(second.header_signature) == 1

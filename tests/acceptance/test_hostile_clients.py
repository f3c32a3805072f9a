"""Hostile clients against two real ``ledgerq serve`` on PostgreSQL and a
``ledgerq node``, while ordered batches keep flowing: slow connections
dribbling headers, parked long-polls of 100 ids, several 10 MiB posts at
once (verified to their last batch, then refused), a client without the
token trying every route.

The long-polls also ask for a batch the ledger holds on a dependency until
the workload is final, so they stay parked whatever the workload's pace and
the gateways' parking lots fill (429) on every run.

Every hostile request gets its clear answer or is cut off by a timeout; no
claim lapses (no gateway voids another's claim: the loop, and with it claim
renewal, never stalls behind the load); every batch is committed exactly
once, per service in order. Sizes are small enough for CI; ``ledgerq bench
hostile`` runs the issue's sizes and measures throughput.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import psycopg
import pytest

from bench._cluster import (
    Cluster,
    Workload,
    check_invariants,
    install_fence_audit,
    wait_all_final,
)
from bench._hostile import (
    HostileSizes,
    LoadProcess,
    broken_list,
    claims_voided,
    flow,
    held_and_release,
    post_batches,
)
from ledgerq.store import open_store

pytestmark = [pytest.mark.slow]

TOKEN = "hostile-test-token-0123456789"
SIZES = HostileSizes(slow=50, long_polls=200, poll_ids=100, poll_wait_s=10, large_posts=3)
#: Timeouts short enough that slow clients are cut off within the run.
GATEWAY_ENV = {
    "LEDGERQ_AUTH_TOKEN": TOKEN,
    "LEDGERQ_HTTP_HEADER_TIMEOUT_S": "2",
    "LEDGERQ_HTTP_KEEPALIVE_S": "5",
    # Fewer slots than long-polls: some are told 429.
    "LEDGERQ_MAX_WAITERS": "80",
}
#: Default claim timing (renew every second, expire after five): a lapse
#: means a gateway's event loop stalled for seconds.
CLAIMS_ENV = {
    "LEDGERQ_MONITOR_POLL_INTERVAL_S": "0.2",
    "LEDGERQ_SUBMITTER_POLL_TIMEOUT_S": "0.2",
}


FINAL = ("Committed", "Valid", "Invalid")


def _status(pg_url: str, batch_id: str) -> str | None:
    with psycopg.connect(pg_url) as conn:
        row = conn.execute("SELECT status FROM batches WHERE batch_id = %s", (batch_id,)).fetchone()
    assert row is not None, f"batch {batch_id} is not tracked"
    return None if row[0] is None else str(row[0])


async def _migrate(url: str) -> None:
    store = await open_store(url)
    await store.close()


@pytest.mark.pg
def test_hostile_clients_get_clear_answers_while_ordered_batches_flow(
    pg_url: str, tmp_path: Path
) -> None:
    asyncio.run(_migrate(pg_url))
    install_fence_audit(pg_url)  # check_invariants looks for fenced-off writes
    cluster = Cluster(tmp_path, pg_url, env={**CLAIMS_ENV, **GATEWAY_ENV})
    workload = Workload(services=10, batches_per_service=10)
    large = broken_list(SIZES.large_bytes)
    held, release = held_and_release(workload.signer)
    try:
        cluster.start_node()
        a = cluster.start_gateway("a")
        b = cluster.start_gateway("b")
        urls = [a.url, b.url]

        async def run() -> dict[str, dict[str, int]]:
            await post_batches(urls, held, TOKEN)
            held_id = held["svc-held"][0][0]
            load = LoadProcess(
                urls, SIZES, workload.all_ids(), large_body=large, token=TOKEN, held_ids=[held_id]
            )
            # Batches flow under the load until every one is final.
            result = await flow(urls, pg_url, workload, load=load, token=TOKEN, timeout_s=240)
            report = result.report
            assert report is not None
            print(f"{result.batches_per_s:.1f} batches/s under load; {report.summary()}")
            assert report.outcomes["slow"]["408"] > 0
            assert report.outcomes["large post"]["400 bad_batch_signature"] > 0
            assert report.outcomes["long-poll"]["429"] > 0
            assert report.outcomes["prowler"]["json"] > 0
            # The held batch was pending all along; the release lets both commit.
            assert _status(pg_url, held_id) not in FINAL
            await post_batches(urls, release, TOKEN)
            return report.unclear()

        unclear = asyncio.run(run())
        assert not unclear, unclear
        workload.batches.update(held)
        workload.batches.update(release)
        wait_all_final(pg_url, len(workload.all_ids()), 60)
        problems = check_invariants(pg_url, cluster.ledger.url, workload)
        assert not problems, problems
        logs = [g.log_path.read_text(errors="replace") for g in (a, b)]
        assert claims_voided(logs) == 0, "\n".join(g.tail(30) for g in (a, b))
        assert a.alive and b.alive
    finally:
        cluster.close()

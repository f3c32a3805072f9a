"""A few seconds of the soak run, for real: `ledgerq serve` (two instances once they
report high availability), the node behind the fault proxy, an instance killed and
restarted, 503 bursts."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.soak import _run

#: Short claim and recovery timings, so a killed instance's work moves in seconds.
FAST = {
    "LEDGERQ_CLAIMS_RENEW_INTERVAL_MS": "300",
    "LEDGERQ_CLAIMS_TTL_MS": "1000",
    "LEDGERQ_CLAIMS_SLOW_TTL_MS": "3000",
    "LEDGERQ_CLAIMS_GRACE_MS": "500",
    "LEDGERQ_MONITOR_POLL_INTERVAL_S": "0.2",
}


@pytest.mark.pg
@pytest.mark.slow
async def test_a_short_soak_keeps_every_invariant(tmp_path: Path, pg_admin_url: str) -> None:
    soak, out = await _run(
        minutes=0.2,
        services=4,
        rate=20,
        kill_every=5,
        burst_every=3,
        burst_s=1,
        pg=pg_admin_url,
        workdir=tmp_path,
        settle_timeout_s=30,
        gateway_env=FAST,
    )
    assert soak.kills and soak.bursts
    assert out.accepted > 100
    assert (out.committed, out.invalid, out.missing) == (out.accepted, 0, 0)
    assert (out.out_of_order, out.executed_twice, out.wrong_keys, out.locked_services) == (
        0,
        0,
        0,
        0,
    )
    assert set(out.memory_growth) >= {"node", "gateway0"}

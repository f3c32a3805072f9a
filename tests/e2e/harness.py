"""Processes and workloads for the end-to-end tests: `ledgerq node` and `ledgerq serve`
as real subprocesses on loopback, and ordered intkey workloads."""

from __future__ import annotations

import asyncio
import base64
import os
import re
import signal
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import cbor2

from ledgerq.codec import Signer, encode_batch_list
from ledgerq.codec.intkey import make_address, make_intkey_batch

LEDGERQ = str(Path(sys.executable).with_name("ledgerq"))
_LISTENING = re.compile(rb"listening on (http://[0-9A-Za-z.\[\]-]+:[0-9]+)")


@dataclass
class Proc:
    """A ledgerq subprocess whose stderr is drained into a log file."""

    args: list[str]
    log_path: Path
    env: Mapping[str, str] = field(default_factory=dict)
    url: str = ""
    process: asyncio.subprocess.Process | None = None
    _drain: asyncio.Task[None] | None = None

    async def start(self, timeout_s: float = 30.0) -> str:
        self.process = await asyncio.create_subprocess_exec(
            LEDGERQ,
            *self.args,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            env={**os.environ, **self.env},
        )
        found: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._drain = asyncio.create_task(self._drain_stderr(found))
        try:
            self.url = await asyncio.wait_for(asyncio.shield(found), timeout_s)
        except TimeoutError:
            await self.kill()
            raise AssertionError(
                f"{self.args[0]} did not start; log:\n{self.log_path.read_text()[-3000:]}"
            ) from None
        return self.url

    async def _drain_stderr(self, found: asyncio.Future[str]) -> None:
        assert self.process is not None and self.process.stderr is not None
        with self.log_path.open("ab") as log:
            async for line in self.process.stderr:
                log.write(line)
                if not found.done():
                    m = _LISTENING.search(line)
                    if m:
                        found.set_result(m.group(1).decode())
        if not found.done():
            found.set_exception(AssertionError("process exited before listening"))

    async def kill(self) -> None:
        """SIGKILL: no clean shutdown."""
        await self._end(signal.SIGKILL)

    async def stop(self) -> None:
        """SIGTERM and wait: a clean shutdown."""
        await self._end(signal.SIGTERM)

    async def _end(self, sig: int) -> None:
        if self.process is None:
            return
        if self.process.returncode is None:
            self.process.send_signal(sig)
        await asyncio.wait_for(self.process.wait(), 30)
        if self._drain is not None:
            await asyncio.wait_for(self._drain, 30)
        self.process = None


def node_proc(
    tmp: Path, *, ephemeral: bool = False, commit_delay_ms: int = 0, port: int = 0
) -> Proc:
    args = ["node", "--bind", f"127.0.0.1:{port}", "--data-dir", str(tmp / "node"), "--shards", "2"]
    if ephemeral:
        args.append("--ephemeral")
    if commit_delay_ms:
        args += ["--commit-delay-ms", str(commit_delay_ms)]
    return Proc(args, tmp / "node.log")


#: Fast timings so faults resolve within a test's bounds.
FAST_GATEWAY_ENV = {
    "LEDGERQ_DELAY_WINDOW_MS": "300",
    "LEDGERQ_SUBMITTER_MAX_RETRIES": "2",
    "LEDGERQ_SUBMITTER_BACKOFF_INITIAL_MS": "10",
    "LEDGERQ_SUBMITTER_BACKOFF_MAX_MS": "100",
    "LEDGERQ_SUBMITTER_POLL_TIMEOUT_S": "0.2",
    "LEDGERQ_LEDGER_TIMEOUT_SUBMIT_S": "1.0",
    "LEDGERQ_MONITOR_POLL_INTERVAL_S": "0.2",
    "LEDGERQ_MONITOR_WAIT_S": "0.5",
    "LEDGERQ_LOG_LEVEL": "INFO",
    # One process: these tests stop, kill and restart the gateway itself.
    "LEDGERQ_WORKERS": "1",
}


def gateway_proc(
    tmp: Path, db: str, ledger: str, *, port: int = 0, extra: Sequence[str] = ()
) -> Proc:
    args = ["serve", "--db", db, "--ledger", ledger, "--bind", f"127.0.0.1:{port}", *extra]
    return Proc(args, tmp / "gateway.log", env={**FAST_GATEWAY_ENV, "LEDGERQ_CONFIG": ""})


@dataclass
class Workload:
    """``services`` × ``per_service`` intkey batches: ``set name 0`` then ``inc name 1``s.

    Executed in order, each service's name ends at ``per_service - 1``; any
    reorder makes a batch INVALID (an ``inc`` before the ``set``, or a second
    ``set``), any double execution shows in the final value.
    """

    services: int
    per_service: int
    signer: Signer = field(default_factory=Signer.generate)

    def __post_init__(self) -> None:
        self.batches: dict[str, list[tuple[str, bytes]]] = {}
        for s in range(self.services):
            service = self.service_id(s)
            name = self.name(s)
            out = []
            for n in range(self.per_service):
                op = ("set", name, 0) if n == 0 else ("inc", name, 1)
                b = make_intkey_batch(self.signer, [op])
                out.append((b.header_signature, b.serialized))
            self.batches[service] = out

    @staticmethod
    def service_id(s: int) -> str:
        return f"circ{s:04d}::svc{s % 97:02d}"

    @staticmethod
    def name(s: int) -> str:
        return f"k{s:05d}"

    def all_ids(self) -> list[str]:
        return [bid for bs in self.batches.values() for bid, _ in bs]

    async def post(self, session: aiohttp.ClientSession, gateway: str, waves: int = 2) -> None:
        """POST each service's batches in ``waves`` BatchLists, services interleaved."""
        per_wave = -(-self.per_service // waves)
        for w in range(waves):
            sends = []
            for service, bs in self.batches.items():
                chunk = bs[w * per_wave : (w + 1) * per_wave]
                if chunk:
                    sends.append(_post(session, gateway, service, [b for _, b in chunk]))
            await asyncio.gather(*sends)


async def _post(
    session: aiohttp.ClientSession, gateway: str, service: str, batches: Sequence[bytes]
) -> None:
    async with session.post(
        f"{gateway}/batches",
        params={"service_id": service},
        data=encode_batch_list(batches),
        headers={"Content-Type": "application/octet-stream"},
    ) as resp:
        body = await resp.text()
        assert resp.status == 202, (resp.status, body)


async def wait_all_final(
    session: aiohttp.ClientSession, gateway: str, workload: Workload, timeout_s: float
) -> dict[str, str]:
    """Ask the gateway until every batch is final; returns id → Sawtooth status."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    final: dict[str, str] = {}
    while True:
        for service, bs in workload.batches.items():
            ids = [bid for bid, _ in bs if bid not in final]
            if not ids:
                continue
            async with session.get(
                f"{gateway}/batch_statuses",
                params={"id": ",".join(ids), "service_id": service, "wait": "1"},
            ) as resp:
                assert resp.status == 200, await resp.text()
                for entry in (await resp.json())["data"]:
                    if entry["status"] in ("COMMITTED", "INVALID"):
                        final[entry["id"]] = entry["status"]
        if len(final) == workload.services * workload.per_service:
            return final
        if loop.time() > deadline:
            return final


async def check_ledger(session: aiohttp.ClientSession, node: str, workload: Workload) -> None:
    """Per-service fingerprints increase in creation order; values show exactly-once."""
    for s, (service, bs) in enumerate(workload.batches.items()):
        prints = []
        for bid, _ in bs:
            async with session.get(f"{node}/fingerprints/{bid}") as resp:
                assert resp.status == 200, (service, bid, await resp.text())
                batch_no, _, tx_no = (await resp.json())["fingerprint"].partition(".")
                prints.append((int(batch_no), int(tx_no)))
        assert prints == sorted(prints), f"{service} was ordered out of creation order: {prints}"
        address = make_address(workload.name(s))
        async with session.get(f"{node}/state/{address}") as resp:
            assert resp.status == 200, await resp.text()
            value = cbor2.loads(base64.b64decode((await resp.json())["data"]))
        assert value == {workload.name(s): workload.per_service - 1}, (service, value)


async def check_no_service_locked(session: aiohttp.ClientSession, gateway: str) -> None:
    async with session.get(f"{gateway}/services") as resp:
        services = (await resp.json())["data"]
    stuck = [s for s in services if s["queue_depth"] or s["in_flight_batch_id"]]
    assert not stuck, stuck


async def resubmitted(session: aiohttp.ClientSession, gateway: str) -> int:
    """How many tracked batches were submitted more than once (resent after a fault)."""
    count = 0
    next_url: str | None = f"{gateway}/tracking/batches?limit=1000"
    while next_url:
        async with session.get(next_url) as resp:
            page = await resp.json()
        count += sum(1 for b in page["data"] if b["attempts"] > 1)
        next_url = page["paging"]["next"]
    return count

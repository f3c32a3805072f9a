"""Two attacks that need no token, measured on a gateway and on a node:
gzip bombs and idle sockets from one address (issue 38's targets).

* **gzip bombs** — two senders, each posting a gzip of 1 GiB of zeros
  (about 1 MB) to ``/health`` (a route that reads no body) about once a
  second, on a new connection each time;
* **idle sockets** — 2,048 connections from 127.0.0.2 that never send a
  byte, each reopened 5 s after the server closes it (an idle limit, a cap,
  an idle connection closed to make room).

Each runs in a process of its own (:class:`Attack`) while this one measures,
one request at a time from 127.0.0.1: the probe route (``/health`` on the
gateway, ``/status`` on the node) and a valid POST (a tenant's one-batch
list on the gateway, a batch on the node). Figures are latencies in ms.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import multiprocessing
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import aiohttp

from ledgerq.codec import Signer, encode_batch_list
from ledgerq.codec.intkey import make_intkey_batch

IDLE_SOCKETS = 2_048
ATTACKER = "127.0.0.2"
REOPEN_S = 5.0
BOMB_SENDERS = 2
BOMB_EVERY_S = 1.0


def gzip_bomb(inflated: int = 1 << 30) -> bytes:
    """A gzip stream of ``inflated`` zero bytes."""
    deflater = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    chunk = bytes(1 << 20)
    parts = [deflater.compress(chunk) for _ in range(inflated // len(chunk))]
    parts.append(deflater.flush())
    return b"".join(parts)


@functools.lru_cache(maxsize=1)
def _bomb() -> bytes:
    """The bomb, made once (deflating 1 GiB takes seconds of CPU)."""
    return gzip_bomb()


async def _bomber(port: int, bomb: bytes, stop: asyncio.Event) -> None:
    head = (
        f"POST /health HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Encoding: gzip\r\nContent-Length: {len(bomb)}\r\nConnection: close\r\n\r\n"
    ).encode()
    while not stop.is_set():
        began = time.monotonic()
        with contextlib.suppress(OSError, asyncio.TimeoutError):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(head + bomb)
            await asyncio.wait_for(writer.drain(), 30)
            await asyncio.wait_for(reader.read(), 30)
            writer.close()
        await asyncio.sleep(max(0.0, BOMB_EVERY_S - (time.monotonic() - began)))


async def _idle_socket(port: int, stop: asyncio.Event) -> None:
    while not stop.is_set():
        try:
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", port, local_addr=(ATTACKER, 0)
            )
        except OSError:
            await asyncio.sleep(REOPEN_S)
            continue
        with contextlib.suppress(OSError):
            await reader.read()  # until the server closes it (idle limit, cap)
        writer.close()
        await asyncio.sleep(REOPEN_S)


def _attack_main(kind: str, port: int, seconds: float, bomb: bytes) -> None:
    async def run() -> None:
        stop = asyncio.Event()
        asyncio.get_running_loop().call_later(seconds, stop.set)
        if kind == "gzip":
            tasks = [_bomber(port, bomb, stop) for _ in range(BOMB_SENDERS)]
        else:
            tasks = [_idle_socket(port, stop) for _ in range(IDLE_SOCKETS)]
        await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(run())


class Attack:
    """An attack in a process of its own for ``seconds`` (``gzip`` or ``idle``)."""

    def __init__(self, kind: str, port: int, seconds: float) -> None:
        bomb = _bomb() if kind == "gzip" else b""
        self.process = multiprocessing.get_context("spawn").Process(
            target=_attack_main, args=(kind, port, seconds, bomb), daemon=True
        )

    def __enter__(self) -> Attack:
        self.process.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.process.terminate()
        self.process.join(10)


@dataclass
class Latencies:
    probe_ms: list[float]
    post_ms: list[float]

    @staticmethod
    def _pct(values: Sequence[float], q: float) -> float:
        ordered = sorted(values)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")

    def row(self) -> tuple[str, str, str, str]:
        return (
            f"{self._pct(self.probe_ms, 0.5):.1f}",
            f"{self._pct(self.probe_ms, 0.99):.1f}",
            f"{self._pct(self.post_ms, 0.5):.1f}",
            f"{self._pct(self.post_ms, 0.99):.1f}",
        )

    def post_p99(self) -> float:
        return self._pct(self.post_ms, 0.99)

    def probe_p99(self) -> float:
        return self._pct(self.probe_ms, 0.99)


async def measure(
    base: str, probe: str, post: str, token: str | None, seconds: float, *, node: bool = False
) -> Latencies:
    """Requests one at a time for ``seconds``: the probe, then a valid POST."""
    signer = Signer.generate()
    headers = {"Content-Type": "application/octet-stream"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    probes: list[float] = []
    posts: list[float] = []
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        end = time.monotonic() + seconds
        n = 0
        while time.monotonic() < end:
            began = time.perf_counter()
            async with http.get(base + probe, headers=headers) as r:
                await r.read()
                assert r.status == 200, (probe, r.status)
            probes.append((time.perf_counter() - began) * 1000)
            if n % 2 == 0:
                key = f"k{n}-{time.monotonic_ns() % 10**9}"
                body = encode_batch_list([make_intkey_batch(signer, [("set", key, n)]).serialized])
                began = time.perf_counter()
                async with http.post(base + post, data=body, headers=headers) as r:
                    await r.read()
                    assert r.status == 202, (post, r.status, await r.text())
                posts.append((time.perf_counter() - began) * 1000)
            n += 1
            await asyncio.sleep(0.01)
    return Latencies(probes, posts)

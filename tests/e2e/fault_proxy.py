"""An HTTP proxy that injects faults between the gateway and a ledger.

Every request is forwarded to ``upstream`` unless the ``policy`` says
otherwise. A policy is called per request with (method, path, n) and returns
a :class:`Fault`:

* ``PASS`` — forward and relay the answer;
* ``BUSY_503`` / ``BUSY_429`` — answer at once, nothing forwarded;
* ``SLOW`` — forward, then wait ``delay_s`` before relaying (a client with a
  shorter timeout gives up: ambiguous, and the ledger has the batch);
* ``DROP_BEFORE`` — close the connection without forwarding (the ledger
  never saw the request);
* ``DROP_AFTER`` — forward, then close the connection without answering
  (the ledger has the request, the client cannot know).
"""

from __future__ import annotations

import asyncio
import enum
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp
from aiohttp import web


class Fault(enum.Enum):
    PASS = "pass"
    BUSY_503 = "503"
    BUSY_429 = "429"
    SLOW = "slow"
    DROP_BEFORE = "drop-before"
    DROP_AFTER = "drop-after"


Policy = Callable[[str, str, int], Fault]


def always_pass(method: str, path: str, n: int) -> Fault:
    return Fault.PASS


@dataclass
class FaultProxy:
    upstream: str
    policy: Policy = always_pass
    delay_s: float = 2.0

    def __post_init__(self) -> None:
        self.counts: Counter[Fault] = Counter()
        self._n = 0
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self.url = ""

    async def start(self) -> str:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60))
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        return self.url

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    async def _forward(
        self, request: web.Request, body: bytes
    ) -> tuple[int, bytes, dict[str, str]]:
        assert self._session is not None
        headers = {
            k: v for k, v in request.headers.items() if k.lower() in ("content-type", "accept")
        }
        async with self._session.request(
            request.method, self.upstream + request.path_qs, data=body, headers=headers
        ) as resp:
            payload = await resp.read()
            out = {"Content-Type": resp.headers.get("Content-Type", "application/json")}
            if "Retry-After" in resp.headers:
                out["Retry-After"] = resp.headers["Retry-After"]
            return resp.status, payload, out

    async def _stream(self, request: web.Request) -> web.StreamResponse:
        """Relay a long-lived response (the SSE event stream) as it comes."""
        assert self._session is not None
        headers = {
            k: v for k, v in request.headers.items() if k.lower() in ("accept", "last-event-id")
        }
        async with self._session.get(
            self.upstream + request.path_qs,
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=None, sock_read=None),
        ) as upstream:
            resp = web.StreamResponse(
                status=upstream.status,
                headers={"Content-Type": upstream.headers.get("Content-Type", "text/plain")},
            )
            await resp.prepare(request)
            async for chunk in upstream.content.iter_any():
                await resp.write(chunk)
            return resp

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        if request.path == "/events":
            return await self._stream(request)
        self._n += 1
        body = await request.read()
        fault = self.policy(request.method, request.path, self._n)
        self.counts[fault] += 1
        if fault is Fault.BUSY_503:
            return web.json_response({"error": {"code": 31, "title": "Busy"}}, status=503)
        if fault is Fault.BUSY_429:
            return web.json_response(
                {"error": {"code": 31, "title": "Too Many Requests"}},
                status=429,
                headers={"Retry-After": "0"},
            )
        if fault is Fault.DROP_BEFORE:
            _drop(request)
            return web.Response(status=500)
        status, payload, headers = await self._forward(request, body)
        if fault is Fault.DROP_AFTER:
            _drop(request)
            return web.Response(status=500)
        if fault is Fault.SLOW:
            await asyncio.sleep(self.delay_s)
        return web.Response(status=status, body=payload, headers=headers)


def _drop(request: web.Request) -> None:
    if request.transport is not None:
        request.transport.close()

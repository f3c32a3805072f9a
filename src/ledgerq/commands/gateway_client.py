"""An HTTP client of the gateway's REST API, for the ``ledgerq`` client commands.

Every request has a total timeout. A gateway that cannot be reached raises
:class:`GatewayUnreachableError` (whose message says how to start one); an
answer of 4xx/5xx raises :class:`GatewayRefusedError` carrying the status
and the gateway's own error message. Large id lists are split so no URL
exceeds :data:`IDS_PER_REQUEST` ids.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from types import TracebackType
from typing import Any, Self

import aiohttp

from ledgerq import jsontext
from ledgerq.errors import LedgerqError

DEFAULT_URL = "http://127.0.0.1:8080"
#: 128-character batch ids: 50 keep a status URL near 6.5 kB, under aiohttp's 8 kB line limit.
IDS_PER_REQUEST = 50


class GatewayUnreachableError(LedgerqError):
    """No gateway answered at the URL."""


class GatewayRefusedError(LedgerqError):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class GatewayClient:
    def __init__(
        self, url: str = DEFAULT_URL, *, token: str | None = None, timeout_s: float = 30.0
    ) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._session = aiohttp.ClientSession(
            headers=headers, timeout=aiohttp.ClientTimeout(total=timeout_s, connect=5)
        )

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        await self._session.close()

    async def _request(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, str] | None = None,
        data: bytes | None = None,
        content_type: str = "application/octet-stream",
        timeout_s: float | None = None,
    ) -> Any:
        headers = {"Content-Type": content_type} if data is not None else None
        timeout = aiohttp.ClientTimeout(total=timeout_s or self.timeout_s, connect=5)
        try:
            async with self._session.request(
                method, self.url + path, params=params, data=data, headers=headers, timeout=timeout
            ) as response:
                text = await response.text()
                if response.status >= 400:
                    raise GatewayRefusedError(response.status, _message(response.status, text))
                if response.content_type == "application/json":
                    return await response.json()
                return text
        except aiohttp.ClientConnectorError as exc:
            raise GatewayUnreachableError(
                f"cannot reach the gateway at {self.url} ({exc.os_error or exc}); start one with "
                "`ledgerq serve` (or `make run` in a checkout), or point --url / LEDGERQ_URL at it"
            ) from exc
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise GatewayUnreachableError(
                f"the gateway at {self.url} did not answer {method} {path} "
                f"({type(exc).__name__}: {exc}); check that it runs and is not overloaded"
            ) from exc

    async def get(self, path: str, timeout_s: float | None = None, **params: Any) -> Any:
        query = {k: str(v) for k, v in params.items() if v is not None}
        return await self._request("GET", path, params=query, timeout_s=timeout_s)

    async def post_batches(self, body: bytes, service_id: str | None) -> dict[str, Any]:
        params = {"service_id": service_id} if service_id else None
        result: dict[str, Any] = await self._request("POST", "/batches", params=params, data=body)
        return result

    async def post_json(self, path: str, doc: Any = None) -> Any:
        """POST ``doc`` as JSON (no body when None); the gateway's JSON answer."""
        data = None if doc is None else json.dumps(doc).encode()
        return await self._request("POST", path, data=data, content_type="application/json")

    async def statuses(
        self, ids: Sequence[str], service_id: str | None, *, wait_s: float = 0
    ) -> list[dict[str, Any]]:
        """Sawtooth-shaped statuses of ``ids`` (in order), in parallel chunks."""
        chunks = [ids[i : i + IDS_PER_REQUEST] for i in range(0, len(ids), IDS_PER_REQUEST)]
        limit = asyncio.Semaphore(8)

        async def one(chunk: Sequence[str]) -> list[dict[str, Any]]:
            async with limit:
                doc = await self.get(
                    "/batch_statuses",
                    timeout_s=wait_s + self.timeout_s,
                    id=",".join(chunk),
                    service_id=service_id,
                    wait=int(wait_s) if wait_s else None,
                )
            data: list[dict[str, Any]] = doc["data"]
            return data

        out: list[dict[str, Any]] = []
        for part in await asyncio.gather(*(one(c) for c in chunks)):
            out.extend(part)
        return out


def _message(status: int, text: str) -> str:

    try:
        doc = jsontext.loads(text)
        err = doc["error"]
        return f"HTTP {status} {err.get('title', '')}: {err.get('message', '')}".strip()
    except (ValueError, KeyError, TypeError):
        return f"HTTP {status}: {text[:300]}"

"""Sawtooth's read routes, answered from a ledger in Sawtooth's shapes.

A ledger client that can answer Sawtooth's REST API reads (``rest_api.py``
of sawtooth-core: state, blocks, the chain's batches, transactions,
receipts, peers, status) offers :class:`ChainReads`: for a route of
:data:`SAWTOOTH_READS` it gives the aiohttp handler that answers it. The
gateway serves those routes with these handlers (``ledgerq.ingest.chain``).

The handler's contract: it is called with a request whose path is the
route's own (``/blocks/{block_id}``, no prefix) and whose ``match_info``
holds the route's variables; its answer is the ledger's, status, body and
all, with the links in it (``link``, ``paging.next``) on the request's own
origin, as the ledger would have built them had it been asked at that
address. Where the gateway serves the route (a base URL, a service prefix)
is the gateway's business: it rewrites the links again (:func:`rebase_links`).

* the in-process node (:mod:`ledgerq.ledgers.inprocess`): the node's own
  REST handlers, called directly;
* a Sawtooth REST API or ``ledgerq node`` (:mod:`ledgerq.ledgers.sawtooth`):
  the request forwarded over HTTP; a ledger that cannot be reached is
  Sawtooth's ``503`` code 18 (``Validator Disconnected``), one that does not
  answer in time code 17 (``Validator Timed Out``);
* Splinter's scabbard: none (it has no chain of Sawtooth blocks to show).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, runtime_checkable
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web

from ledgerq import jsontext

#: Sawtooth's read routes (sawtooth-core ``rest_api/rest_api.py``), as
#: aiohttp route paths with Sawtooth's variable names. ``POST /receipts`` is a
#: read: its ids are in the body.
SAWTOOTH_READS: tuple[tuple[str, str], ...] = (
    ("GET", "/state"),
    ("GET", "/state/{address}"),
    ("GET", "/blocks"),
    ("GET", "/blocks/{block_id}"),
    ("GET", "/batches"),
    ("GET", "/batches/{batch_id}"),
    ("GET", "/transactions"),
    ("GET", "/transactions/{transaction_id}"),
    ("GET", "/receipts"),
    ("POST", "/receipts"),
    ("GET", "/peers"),
    ("GET", "/status"),
)

ChainHandler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@runtime_checkable
class ChainReads(Protocol):
    """A ledger that answers Sawtooth's read routes."""

    def chain_handler(self, method: str, route: str) -> ChainHandler | None:
        """The handler of ``method route`` (one of :data:`SAWTOOTH_READS`),
        or ``None`` when the ledger does not answer it."""
        ...


def chain_reads(ledger: object) -> ChainReads | None:
    """``ledger`` as :class:`ChainReads` when it answers Sawtooth's reads."""
    return ledger if isinstance(ledger, ChainReads) else None


def sawtooth_error(status: int, code: int, title: str, message: str) -> web.Response:
    """An error answer in Sawtooth's shape (``exceptions.py``)."""
    return web.json_response(
        {"error": {"code": code, "title": title, "message": message}}, status=status
    )


#: Where a Sawtooth answer holds links: at the top (``link``) and in ``paging``.
_PAGING_LINKS = ("next", "previous", "first", "last")


def rebase_links(body: bytes, rebase: Callable[[str], str]) -> bytes:
    """``body`` (a Sawtooth JSON answer) with its links passed through
    ``rebase``; a body that is not a JSON object is returned as it is."""
    try:
        doc = jsontext.loads(body)
    except ValueError:
        return body
    if not isinstance(doc, dict) or not _rebase_doc(doc, rebase):
        return body
    return json.dumps(doc).encode()


def _rebase_doc(doc: dict[str, Any], rebase: Callable[[str], str]) -> bool:
    changed = False
    if isinstance(doc.get("link"), str):
        doc["link"] = rebase(doc["link"])
        changed = True
    paging = doc.get("paging")
    if isinstance(paging, dict):
        for key in _PAGING_LINKS:
            if isinstance(paging.get(key), str) and paging[key]:
                paging[key] = rebase(paging[key])
                changed = True
    return changed


def path_and_query(link: str, root: str = "") -> str:
    """What a link names below ``root`` (a path prefix): its path without
    ``root``, and its query; ``/blocks?head=…`` for
    ``http://h:8008/root/blocks?head=…``."""
    parts = urlsplit(link)
    path = parts.path
    root = root.rstrip("/")
    if root and (path == root or path.startswith(root + "/")):
        path = path[len(root) :] or "/"
    return path + (f"?{parts.query}" if parts.query else "")


#: The longest a Sawtooth read may wait (``wait`` on ``/receipts``): its REST
#: API's timeout.
MAX_READ_WAIT_S = 300.0


async def forward_read(
    session: aiohttp.ClientSession,
    base_url: str,
    request: web.Request,
    *,
    ledger: str,
    timeout_s: float,
    connect_s: float,
) -> web.Response:
    """``request`` asked of the Sawtooth REST API at ``base_url``: its method,
    path, query and (for a ``POST /receipts``) its JSON body; the answer, its
    links moved onto the request's origin. A ledger that cannot be reached
    or fails mid-answer is Sawtooth's 503 code 18, one that does not answer
    within ``timeout_s`` (plus :data:`MAX_READ_WAIT_S` for a request with
    ``wait``) code 17; ``ledger`` names it in the message."""
    base_url = base_url.rstrip("/")
    headers = {"Accept": "application/json"}
    body = None
    if request.method == "POST":
        body = await request.read()
        headers["Content-Type"] = request.headers.get("Content-Type", "")
    total = timeout_s + (MAX_READ_WAIT_S if "wait" in request.query else 0.0)
    try:
        async with session.request(
            request.method,
            base_url + str(request.rel_url),
            data=body,
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=total, connect=connect_s),
        ) as resp:
            payload = await resp.read()
            status, content_type = resp.status, resp.content_type
    except TimeoutError:
        return sawtooth_error(
            503,
            17,
            "Validator Timed Out",
            f"the ledger ({ledger}) did not answer within {total:g} s; try again later",
        )
    except (aiohttp.ClientError, OSError) as exc:
        return sawtooth_error(
            503,
            18,
            "Validator Disconnected",
            f"cannot reach the ledger ({ledger}): {exc}; try again later",
        )
    if content_type == "application/json":
        origin = str(request.url.origin())
        root = urlsplit(base_url).path
        payload = rebase_links(payload, lambda link: origin + path_and_query(link, root))
    return web.Response(status=status, body=payload, content_type=content_type)

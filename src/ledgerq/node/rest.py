"""The node's REST API: Sawtooth's shapes (``openapi.yaml``) plus an event stream.

* ``POST /batches`` (``application/octet-stream`` BatchList) → 202
  ``{"link": ".../batch_statuses?id=..."}``; 400 with
  ``{"error": {"code", "title", "message"}}`` (codes 30, 34, 35, 42); 429
  (code 31) when the pending queue is full.
* ``GET /batch_statuses?id=a,b&wait=N`` → ``{"data": [{"id", "status",
  "invalid_transactions"}], "link"}``; ``POST /batch_statuses`` (JSON list of
  ids) → ``{"data": [...]}`` alone, as Sawtooth's. Empty properties (an
  ``extended_data`` or ``message`` of ``""``) are left out, as Sawtooth's
  REST API leaves them out.
* ``GET /state/{address}`` → ``{"data": base64, "head", "link"}`` (62, 75), at
  any block of the chain (``head``, default the latest; 50 for one not in it);
  ``GET /state?address=prefix`` → ``{"data": [{"address", "data"}], "head",
  "link", "paging"}``, paged as :mod:`ledgerq.node.listing` says (100 entries
  by default, at most ``RestLimits.max_state_limit``).
* ``GET /logs/{fingerprint}`` (``B.T``) → the execution summary (``RequestLogs``).
* With a :class:`~ledgerq.node.scabbard.ScabbardServices`: the scabbard routes
  ``/scabbard/{circuit}/{service}/batches`` and ``.../batch_statuses?ids=``,
  a separate ledger per service (see :mod:`ledgerq.node.scabbard`).
* ``GET /events``: server-sent events, one per batch reaching a final status:
  ``id: <sequence>`` and ``data: {"id", "status", "invalid_transactions"}``;
  send ``Last-Event-ID`` (or ``?last_event_id=``) to resume after an event.
* ``GET /subscriptions``: Sawtooth's state-delta websocket, one message per
  commit (see :mod:`ledgerq.node.subscriptions`).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from ledgerq import jsontext
from ledgerq.codec import DEFAULT_MAX_BYTES
from ledgerq.codec.decode import decode_batch_list
from ledgerq.errors import InvalidBatchError, NodeBusyError, NodeError
from ledgerq.httpbody import read_body
from ledgerq.node.access import AccessPolicy, access_middleware
from ledgerq.node.chain_rest import Chain, add_chain_routes
from ledgerq.node.decoding import BatchDecoder
from ledgerq.node.listing import (
    RequestError,
    build_url,
    drop_empty,
    is_reverse,
    paging_controls,
    paging_invalid,
    respond,
    take,
)
from ledgerq.node.node import Node
from ledgerq.node.ordering.messages import TxFingerprint
from ledgerq.node.scabbard import ScabbardServices, scabbard_json
from ledgerq.node.streams import stream_cap_middleware
from ledgerq.node.subscriptions import add_subscriptions

log = logging.getLogger(__name__)

NODE_KEY: web.AppKey[Node] = web.AppKey("node", Node)


@dataclass(frozen=True, slots=True)
class RestLimits:
    """Caps on what one request may ask of the node."""

    max_status_ids: int = 1_000  # batch ids per status request
    max_state_limit: int = 1_000  # entries per /state page, at most
    max_event_streams: int = 64  # /events and /subscriptions open at once (ledgerq.node.streams)


_BATCH_ID = re.compile(r"[0-9a-f]{128}")
_ADDRESS = re.compile(r"[0-9a-f]{70}")
_PREFIX = re.compile(r"[0-9a-f]{0,70}")
# Whole bytes, as Sawtooth's validator checks a state namespace.
_NAMESPACE = re.compile(r"([0-9a-f]{2}){0,35}")
_HEARTBEAT_S = 15.0


#: What a body that does not parse as a BatchList is refused for.
_UNPARSED = frozenset({"empty_batch_list", "malformed_protobuf", "too_large"})


def _refused(exc: InvalidBatchError) -> web.Response:
    """The 400 for a posted BatchList that is not accepted, by the rule it broke."""
    if exc.rule == "empty_batch_list":
        return _error(400, 34, "No Batches Submitted", str(exc))
    if exc.rule == "malformed_protobuf":
        return _error(400, 35, "Protobuf Not Decodable", str(exc))
    return _error(400, 30, "Submitted Batches Invalid", str(exc))


def _error(status: int, code: int, title: str, message: str) -> web.Response:
    body = {"error": {"code": code, "title": title, "message": message}}
    return web.json_response(body, status=status)


def _parse_wait(request: web.Request) -> float | None:
    """Seconds a status request may wait, as Sawtooth's REST API reads ``wait``:
    absent or ``false`` (any case) is no wait; a number is seconds (0 to 300);
    anything else (empty, ``true``, ``yes``) is the longest wait, 300 s."""
    raw = request.query.get("wait")
    if raw is None or raw.lower() == "false":
        return None
    try:
        value = float(raw)
    except ValueError:
        return 300.0
    return max(0.0, min(value, 300.0))


def _bad_id(ids: list[str]) -> web.Response | None:
    for bid in ids:
        if not _BATCH_ID.fullmatch(bid):
            return _error(
                400,
                60,
                "Invalid Resource Id",
                f"{bid!r} is not a batch id: batch ids are 128 lowercase hex characters",
            )
    return None


@web.middleware
async def json_errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Every error as Sawtooth's JSON body: unknown routes and methods, and crashes."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        headers = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else {}
        return web.json_response(
            {
                "error": {
                    "code": exc.status,
                    "title": exc.reason,
                    "message": f"{request.method} {request.path}: {exc.reason.lower()}",
                }
            },
            status=exc.status,
            headers=headers,
        )
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("%s %s failed", request.method, request.path)
        return _error(
            500,
            10,
            "Unknown Validator Error",
            "the node failed to answer this request; its log has the details",
        )


def make_app(
    node: Node,
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    scabbard: ScabbardServices | None = None,
    access: AccessPolicy | None = None,
    bound_host: str = "",
    limits: RestLimits | None = None,
    decoder: BatchDecoder | None = None,
) -> web.Application:
    """The node's aiohttp app; ``access`` (default: loopback, no token) guards every route."""
    limits = limits or RestLimits()
    # A compressed body is inflated to at most this, off the event loop (ledgerq.httpbody).
    body_limit = max_bytes + 1024
    app = web.Application(
        client_max_size=body_limit,
        middlewares=[
            json_errors,
            access_middleware(access or AccessPolicy(), bound_host=bound_host),
            stream_cap_middleware(limits.max_event_streams),
        ],
    )
    app[NODE_KEY] = node
    if decoder is None:
        decoder = BatchDecoder(max_bytes=max_bytes, preparers=node.registry.preparers())
    verifier = decoder

    async def stop_decoder(_app: web.Application) -> None:
        await asyncio.to_thread(verifier.close)

    app.on_cleanup.append(stop_decoder)

    async def post_batches(request: web.Request) -> web.Response:
        return await submit(
            request,
            node,
            lambda ids: build_url(request, path="/batch_statuses", id=ids),
        )

    async def submit(
        request: web.Request, target: Node, link: Callable[[str], str]
    ) -> web.Response:
        if request.content_type != "application/octet-stream":
            return _error(
                400,
                42,
                "Wrong Content Type",
                "Batches must be submitted as a BatchList protobuf binary, with a "
                "'Content-Type' header of 'application/octet-stream'",
            )
        body = await read_body(request, body_limit)
        busy = target.busy()
        if busy is not None:
            # As Sawtooth orders it: the body must parse (the REST API's check),
            # then back-pressure comes before any signature is checked.
            try:
                decode_batch_list(body, max_bytes=max_bytes, verify=False)
            except InvalidBatchError as exc:
                if exc.rule in _UNPARSED:
                    return _refused(exc)
            return _error(429, 31, "Unable to Accept Batches", busy)
        try:
            # Large bodies are verified in other processes (see ledgerq.node.decoding).
            batches = await verifier.decode(body)
        except InvalidBatchError as exc:
            return _refused(exc)
        try:
            await target.submit(batches)
        except NodeBusyError as exc:
            return _error(429, 31, "Unable to Accept Batches", str(exc))
        except NodeError as exc:
            return _error(503, 18, "Validator Disconnected", str(exc))
        ids = ",".join(b.header_signature for b in batches)
        return web.json_response({"link": link(ids)}, status=202)

    async def statuses_response(request: web.Request, ids: list[str]) -> web.Response:
        if len(ids) > limits.max_status_ids:
            return _error(
                400,
                46,
                "Bad Status Request",
                f"{len(ids)} batch ids in one request; ask for at most "
                f"{limits.max_status_ids} at a time",
            )
        bad = _bad_id(ids)
        if bad is not None:
            return bad
        infos = await node.batch_statuses(ids, _parse_wait(request))
        # One status per id asked, in the order asked (a repeated id too), as Sawtooth's.
        body: dict[str, Any] = {"data": drop_empty([infos[i].to_json() for i in ids])}
        if request.method == "GET":  # a POST's ids are in no URL: no link, as Sawtooth's
            body["link"] = build_url(request)
        return web.json_response(body)

    async def get_statuses(request: web.Request) -> web.Response:
        raw = request.query.get("id")
        ids = [] if raw is None else raw.split(",")  # "id=" is one empty, malformed id
        if not ids:
            return _error(
                400,
                66,
                "Id Query Invalid or Missing",
                "Requests for batch statuses need an 'id' query parameter with a "
                "comma-separated list of at least one batch id",
            )
        return await statuses_response(request, ids)

    async def post_statuses(request: web.Request) -> web.Response:
        if request.content_type != "application/json":
            return _error(
                400,
                43,
                "Wrong Content Type",
                "Requests for batch statuses sent as a POST must have a 'Content-Type' "
                "header of 'application/json'",
            )
        try:
            ids = jsontext.loads(await read_body(request, body_limit))
        except ValueError:
            ids = None
        if not isinstance(ids, list) or not ids or not all(isinstance(i, str) for i in ids):
            return _error(
                400,
                46,
                "Bad Status Request",
                "The body must be a JSON array of batch ids (strings), with at least one id",
            )
        return await statuses_response(request, ids)

    chain = Chain(node)

    def state_head(request: web.Request) -> int | web.Response:
        """The block the state is read at (``head``, default the latest), or the
        404 (code 50) of a head that is not in the chain."""
        try:
            return chain.head(request)
        except RequestError as exc:
            return exc.response

    async def get_state_entry(request: web.Request) -> web.Response:
        address = request.match_info["address"]
        if not _ADDRESS.fullmatch(address):
            return _error(
                400,
                62,
                "Invalid State Address",
                f"{address!r} is not a state address: fetch a leaf with its full "
                "70-character lowercase hex address",
            )
        num = state_head(request)
        if isinstance(num, web.Response):
            return num
        value = await node.get_state(address, head=num)
        if value is None:
            return _error(404, 75, "State Not Found", f"There is no state data at {address}")
        head = chain.block_id(num)
        return web.json_response(
            {
                "data": base64.b64encode(value).decode(),
                "head": head,
                "link": build_url(request, head=head),
            }
        )

    async def list_state(request: web.Request) -> web.Response:
        try:
            return await state_page(request)
        except RequestError as exc:
            return exc.response

    async def state_page(request: web.Request) -> web.Response:
        controls = paging_controls(request)
        prefix = request.query.get("address", "")
        if not _NAMESPACE.fullmatch(prefix):
            return _error(
                400,
                62,
                "Invalid State Address",
                f"{prefix[:80]!r} is not an address prefix: use whole bytes of lowercase hex "
                "(an even number of characters), at most 70 characters",
            )
        num = state_head(request)
        if isinstance(num, web.Response):
            return num
        if is_reverse(request, "default"):
            return _error(
                400,
                57,
                "Invalid Sort Query",
                "this node pages state in address order only (reverse is not supported)",
            )
        start = controls.start or ""
        if not _PREFIX.fullmatch(start):
            # The store seeks to it as bytes: anything but lowercase hex is no position.
            raise paging_invalid(
                f"'start' {start[:80]!r} is not a state address: use the 'next_position' of "
                "a page (lowercase hex, at most 70 characters)"
            )
        size = controls.size(limits.max_state_limit)
        head = chain.block_id(num)
        entries = await node.list_state(prefix, start=start, limit=size + 1, head=num)
        # As Sawtooth's validator: ``start`` is an entry of the list, not a position
        # between entries; only an empty list has no wrong start.
        missed = start and (not entries or entries[0][0] != start)
        if missed and (entries or await node.list_state(prefix, limit=1, head=num)):
            raise paging_invalid(
                f"'start' {start!r} is not an address in state under {prefix!r}: use the "
                "'next_position' of a page"
            )
        page = take(
            ((a, {"address": a, "data": base64.b64encode(v).decode()}) for a, v in entries), size
        )
        return respond(request, page, controls, head)

    async def get_logs(request: web.Request) -> web.Response:
        try:
            fingerprint = TxFingerprint.parse(request.match_info["fingerprint"])
        except ValueError:
            return _error(400, 60, "Invalid Resource Id", "a fingerprint is written B.T")
        summary = await node.request_logs(fingerprint)
        if summary is None:
            return _error(404, 80, "Log Not Found", f"no execution log for {fingerprint}")
        return web.json_response(
            {
                "fingerprint": str(summary.fingerprint),
                "id": summary.tx_id,
                "success": summary.success,
                "values_read": [
                    {"address": k, "data": None if v is None else base64.b64encode(v).decode()}
                    for k, v in summary.values_read
                ],
                "values_written": [
                    {"address": k, "data": base64.b64encode(v).decode()}
                    for k, v in summary.values_written
                ],
                "log": list(summary.log),
            }
        )

    async def get_fingerprint(request: web.Request) -> web.Response:
        bid = request.match_info["batch_id"]
        bad = _bad_id([bid])
        if bad is not None:
            return bad
        fingerprint = node.fingerprint_of(bid)
        if fingerprint is None:
            return _error(404, 71, "Batch Not Found", f"batch {bid} was not ordered by this node")
        return web.json_response({"id": bid, "fingerprint": str(fingerprint)})

    async def events(request: web.Request) -> web.StreamResponse:
        raw = request.headers.get("Last-Event-ID") or request.query.get("last_event_id")
        after: int | None = None
        if raw:
            try:
                after = int(raw)
            except ValueError:
                return _error(400, 60, "Invalid Resource Id", "Last-Event-ID must be an integer")
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        await response.write(b": ledgerq node events\n\n")
        stream = node.subscribe(after).__aiter__()
        try:
            while True:
                try:
                    event = await asyncio.wait_for(stream.__anext__(), _HEARTBEAT_S)
                except TimeoutError:
                    await response.write(b": keep-alive\n\n")
                    continue
                except StopAsyncIteration:
                    break
                data = json.dumps(event.info.to_json(), separators=(",", ":"))
                await response.write(f"id: {event.seq}\ndata: {data}\n\n".encode())
        except ConnectionResetError:
            # The subscriber went away (a gateway stopped or was killed): the
            # stream ends here, not with a traceback in the node's log.
            return response
        finally:
            with contextlib.suppress(Exception):
                await stream.aclose()  # type: ignore[attr-defined]
        return response

    async def scabbard_node(request: web.Request, *, create: bool) -> Node | web.Response:
        assert scabbard is not None
        circuit, service = request.match_info["circuit"], request.match_info["service"]
        if not ScabbardServices.valid(circuit, service):
            return _error(
                404,
                71,
                "Service Not Found",
                f"no scabbard service {circuit[:80]}::{service[:80]}: names are letters, digits, "
                "'_' and '-', at most 64 characters",
            )
        try:
            found = await scabbard.get(circuit, service, create=create)
        except NodeBusyError as exc:
            return _error(429, 31, "Unable to Accept Batches", str(exc))
        if found is None:
            return _error(
                404, 71, "Service Not Found", f"no batches were ever posted to {circuit}::{service}"
            )
        return found

    async def scabbard_batches(request: web.Request) -> web.Response:
        target = await scabbard_node(request, create=True)
        if isinstance(target, web.Response):
            return target
        base = str(request.url.with_query(None)).rsplit("/", 1)[0]
        return await submit(request, target, lambda ids: f"{base}/batch_statuses?ids={ids}")

    async def scabbard_statuses(request: web.Request) -> web.Response:
        target = await scabbard_node(request, create=False)
        if isinstance(target, web.Response):
            return target
        ids = [i for i in request.query.get("ids", "").split(",") if i]
        if len(ids) > limits.max_status_ids:
            return _error(
                400, 46, "Bad Status Request", f"ask for at most {limits.max_status_ids} ids"
            )
        if not ids:
            return _error(400, 66, "Id Query Invalid or Missing", "give ?ids=a,b (batch ids)")
        bad = _bad_id(ids)
        if bad is not None:
            return bad
        infos = await target.batch_statuses(ids, _parse_wait(request))
        return web.json_response([scabbard_json(i) for i in infos.values()])

    if scabbard is not None:
        app.router.add_post("/scabbard/{circuit}/{service}/batches", scabbard_batches)
        app.router.add_get("/scabbard/{circuit}/{service}/batch_statuses", scabbard_statuses)
    app.router.add_post("/batches", post_batches)
    app.router.add_get("/batch_statuses", get_statuses)
    app.router.add_post("/batch_statuses", post_statuses)
    app.router.add_get("/state", list_state)
    app.router.add_get("/state/{address}", get_state_entry)
    app.router.add_get("/logs/{fingerprint}", get_logs)
    app.router.add_get("/fingerprints/{batch_id}", get_fingerprint)
    app.router.add_get("/events", events)
    add_chain_routes(app, node)
    add_subscriptions(app, node)
    return app

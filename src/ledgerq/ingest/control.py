"""Operator control of a service over REST, and one service's state and history.

* ``POST /services/{id}/pause`` — the service takes nothing new; what is in
  flight is followed to its end. Pausing a paused service changes nothing
  (its record says ``already paused``).
* ``POST /services/{id}/resume`` — undo a pause (``409`` unless paused).
* ``POST /services/{id}/skip`` — body ``{"batch_id": B}``: resume a service
  halted at its ``Invalid`` batch ``B`` past that batch (``409`` unless it
  is halted at ``B``).
* ``POST /services/{id}/cancel`` — body ``{"batch_ids": [...]}``: make those
  batches final, all or none (``409`` if any may be on the ledger: taken,
  pending, or final already). A cancelled batch is stored ``Invalid``
  (Sawtooth's status ``INVALID``, each transaction's message saying who
  cancelled it and when); ledgerq's own status reads ``Cancelled``.
* ``GET /services/{id}?limit=&before=`` — the service as ``/services`` shows
  it, plus ``history``: its recorded actions, newest first, ``limit`` at a
  time (``paging.next`` links the older ones); and ``queued``: the ids of its
  first :data:`QUEUED_SHOWN` batches that a cancel may name (not taken for
  submission; no status, or ``Delayed``/``Unknown``), in acceptance order.

Each action is one store transaction (:meth:`ControlStore.control_service
<ledgerq.store.base.ControlStore.control_service>`), recorded with who made
it (the token's name; ``anonymous`` when the gateway has no token), when,
and which batches; the answer is that record. The store write is the
truth: this process's producer reads it at once (``on_control``), other
instances within a poll interval, and the store refuses the takes of a
paused or halted service meanwhile.

Answers: ``404`` for a service without batches (or a batch not of it),
``409`` with the store's reason for an action its state refuses, ``400``
for a malformed body, ``415`` for a body that is not JSON, ``403`` for a
token not allowed to act on (or read) the service.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlencode

from aiohttp import web

from ledgerq import jsontext
from ledgerq.errors import (
    BatchNotFoundError,
    ControlRefusedError,
    ServiceNotFoundError,
    StoreError,
    StoreInputError,
    StoreUnavailableError,
)
from ledgerq.httpbody import read_body
from ledgerq.ingest.api import (
    _BATCH_ID,
    SCOPE,
    STORE_UNAVAILABLE,
    RepeatedParameterError,
    _base,
    _error,
    _int_param,
    _out_of_scope,
    _repeated,
    scope_of,
)
from ledgerq.ingest.guard import refuse_encoding
from ledgerq.model import BatchStatusName
from ledgerq.scopes import Scope
from ledgerq.store.base import NO_STATUS, ServiceAction

if TYPE_CHECKING:
    from ledgerq.ingest.api import GatewayApi

#: The actions, in the order the routes are added.
ACTIONS: tuple[Literal["pause", "resume", "skip", "cancel"], ...] = (
    "pause",
    "resume",
    "skip",
    "cancel",
)
#: The actor of an action when the gateway has no token.
ANONYMOUS = "anonymous"
#: Batches one cancel names at most.
MAX_CANCEL = 1000
#: The largest body of an action: room for MAX_CANCEL batch ids (132 bytes
#: each, quoted and separated) written loosely (indented, some repeated).
MAX_BODY_BYTES = 1 << 20
#: Batches listed in ``queued`` at most.
QUEUED_SHOWN = 100
#: The statuses a batch that cannot be on the ledger may have (besides none).
_UNSENT = (BatchStatusName.DELAYED, BatchStatusName.UNKNOWN)
#: History entries per page, by default and at most.
HISTORY_PAGE = 100
MAX_HISTORY_PAGE = 1000

OnControl = Callable[[str], Awaitable[None]]

_ACTIONS = "|".join(ACTIONS)
_ACTION_PATH = re.compile(r"/services/[^/]+/(?:" + _ACTIONS + ")")
_CONTROL_PATH = re.compile(r"/services/[^/]+(?:/(?:" + _ACTIONS + "))?")


def is_action_path(path: str) -> bool:
    """Whether ``path`` (decoded) is one of an action's (they need ``operate`` access)."""
    return _ACTION_PATH.fullmatch(path) is not None


def is_control_path(path: str) -> bool:
    """Whether ``path`` (decoded) is one of this module's routes."""
    return _CONTROL_PATH.fullmatch(path) is not None


def actor_of(request: web.Request) -> str:
    """Who makes a request's action: its token's name, or :data:`ANONYMOUS`."""
    scope = request.get(SCOPE)
    return scope.name if isinstance(scope, Scope) else ANONYMOUS


def action_json(a: ServiceAction) -> dict[str, Any]:
    return {
        "id": a.id,
        "service_id": a.service_id,
        "action": a.action,
        "actor": a.actor,
        "at": a.at,
        "batch_ids": list(a.batch_ids),
        "detail": a.detail,
    }


class BadBody(ValueError):
    """An action's body that does not say what it must; the message says what."""


def _batch_id(value: Any, where: str) -> str:
    if not isinstance(value, str) or not _BATCH_ID.fullmatch(value):
        shown = repr(value) if len(repr(value)) <= 140 else repr(value)[:24] + "…"
        raise BadBody(f"{where} must be a batch id (128 lowercase hex characters); got {shown}")
    return value


def _fields(doc: Any, wanted: str, example: str) -> Any:
    """The one field ``wanted`` of a JSON object (else :class:`BadBody`)."""
    if not isinstance(doc, dict):
        raise BadBody(f"the body must be a JSON object: {example}")
    unknown = sorted(set(doc) - {wanted})
    if unknown:
        raise BadBody(f"unknown field {unknown[0]!r}; the body is {example}")
    if wanted not in doc:
        raise BadBody(f"{wanted} is missing; the body is {example}")
    return doc[wanted]


def batch_ids_of(action: str, doc: Any) -> list[str]:
    """The batches an action's JSON body names (none for pause and resume)."""
    if action == "skip":
        return [_batch_id(_fields(doc, "batch_id", '{"batch_id": "<id>"}'), "batch_id")]
    if action == "cancel":
        ids = _fields(doc, "batch_ids", '{"batch_ids": ["<id>", ...]}')
        if not isinstance(ids, list) or not ids:
            raise BadBody("batch_ids must be a non-empty list of batch ids")
        ids = list(dict.fromkeys(_batch_id(i, "each of batch_ids") for i in ids))
        if len(ids) > MAX_CANCEL:
            raise BadBody(f"{len(ids)} batches in one cancel; name at most {MAX_CANCEL}")
        return ids
    return []


def _store_failed(exc: StoreError) -> web.Response:
    if isinstance(exc, StoreInputError):
        return _error(400, "Bad Request", str(exc), "store_input")
    if isinstance(exc, StoreUnavailableError):
        return _error(503, "Store Unavailable", STORE_UNAVAILABLE)
    return _error(500, "Store Error", "the store failed; nothing was changed (see the log)")


class ServiceControls:
    """The routes of this module, on a :class:`~ledgerq.ingest.api.GatewayApi`."""

    def __init__(self, api: GatewayApi, on_control: OnControl) -> None:
        self.api = api
        self.on_control = on_control

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/services/{service_id}", self.service)
        for action in ACTIONS:
            app.router.add_post(
                f"/services/{{service_id}}/{action}", functools.partial(self.act, action)
            )

    async def act(
        self, action: Literal["pause", "resume", "skip", "cancel"], request: web.Request
    ) -> web.Response:
        service_id = request.match_info["service_id"]
        scope = scope_of(request)
        if not scope.covers(service_id):
            return _out_of_scope(scope, service_id, f"{action}")
        batch_ids: Sequence[str] = ()
        if action in ("skip", "cancel"):
            body = await self._json_body(request)
            if isinstance(body, web.Response):
                return body
            try:
                batch_ids = batch_ids_of(action, body)
            except BadBody as exc:
                return _error(400, "Bad Request", str(exc), "bad_body")
        try:
            done = await self.api.store.control_service(
                service_id,
                action,
                actor=actor_of(request),
                batch_ids=batch_ids,
                now=self.api.clock(),
            )
        except ServiceNotFoundError as exc:
            return _error(404, "Not Found", str(exc), "unknown_service")
        except BatchNotFoundError as exc:
            return _error(404, "Not Found", str(exc), "unknown_batch")
        except ControlRefusedError as exc:
            return _error(409, "Refused", str(exc), "refused")
        except StoreError as exc:
            return _store_failed(exc)
        await self.on_control(service_id)
        return web.json_response({"data": action_json(done)})

    async def _json_body(self, request: web.Request) -> Any:
        """The action's JSON document (None without a body), or the answer refusing it."""
        if not request.body_exists:
            return None
        if request.content_type != "application/json":
            return _error(
                415,
                "Unsupported Media Type",
                f"send the body as application/json, not {request.content_type!r}",
            )
        refused = refuse_encoding(request)
        if refused is not None:
            return refused
        try:
            text = await read_body(request, MAX_BODY_BYTES)
        except web.HTTPRequestEntityTooLarge:
            return _error(
                413, "Request Entity Too Large", f"the body exceeds {MAX_BODY_BYTES} bytes"
            )
        try:
            return jsontext.loads(text)
        except ValueError:
            return _error(400, "Bad Request", "the body is not JSON", "bad_body")

    async def _queued(self, service_id: str) -> list[str]:
        """The first batches of the service that a cancel may name."""
        found = []
        for status in (NO_STATUS, *_UNSENT):
            listed = await self.api.store.list_batches(
                service_id=service_id, status=status, limit=QUEUED_SHOWN
            )
            found += [b for b in listed.batches if not b.submitted]
        found.sort(key=lambda b: b.seq or 0)
        return [b.batch_id for b in found[:QUEUED_SHOWN]]

    async def service(self, request: web.Request) -> web.Response:
        service_id = request.match_info["service_id"]
        try:
            limit = _int_param(request.query, "limit", 1, MAX_HISTORY_PAGE) or HISTORY_PAGE
            before = _int_param(request.query, "before", 1, 2**63 - 1)
        except RepeatedParameterError as exc:
            return _repeated(exc)
        except ValueError as exc:
            return _error(400, "Bad Query", str(exc))
        scope = scope_of(request)
        if not scope.covers(service_id):
            return _out_of_scope(scope, service_id, "read")
        listed = await self.api.store.list_services(service_id=service_id, limit=1)
        if not listed:
            return _error(
                404,
                "Not Found",
                f"no batch of service {service_id!r} is tracked; check the service id",
                "unknown_service",
            )
        [item] = await self.api.service_items(listed)
        history = await self.api.store.service_actions(service_id, limit=limit, before=before)
        next_link = None
        if len(history) == limit:
            params = {k: v for k, v in request.query.items() if k != "before"}
            params["before"] = str(history[-1].id)
            next_link = f"{_base(request)}{request.rel_url.raw_path}?{urlencode(params)}"
        item["history"] = [action_json(a) for a in history]
        item["queued"] = await self._queued(service_id)
        return web.json_response({"data": item, "paging": {"limit": limit, "next": next_link}})

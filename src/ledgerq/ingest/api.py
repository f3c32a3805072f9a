"""The gateway's REST API (aiohttp), compatible with Grid's batch endpoints
and with Sawtooth's REST API.

* ``POST /batches?service_id=S`` — body: an ``application/octet-stream``
  protobuf ``BatchList``. Every batch is decoded and verified, then all are
  stored in one transaction (all or none) in list order, which is their
  submission order within the service. ``202 {"link": "/batch_statuses?..."}``.
  A retry of batches already held — every batch of the list tracked with the
  same bytes in the same service — answers ``202`` with the same link (as
  Grid and Sawtooth do), storing nothing.
  Errors are JSON ``{"error": {"code", "title", "message", "rule"?}}``:
  400 for a malformed or unverifiable list (Sawtooth's codes 30, 34, 35; 42
  for another content type) or a bad service id, 409 when a
  batch id is tracked with another body or in another service (or a list
  mixes new and tracked batches; a data change id or transaction id is
  taken), 413 for a body over ``max_body_bytes``, 415 for a
  ``Content-Encoding`` other than identity, gzip and deflate. Without a
  service the batches go to ``default_service`` (empty: none).
* ``GET /batch_statuses?id=a,b&service_id=S&wait=N`` — Sawtooth's shape
  (``{"data": [{"id", "status", "invalid_transactions"}], "link"}``): a batch
  ledgerq still holds is ``PENDING``, one it never saw ``UNKNOWN``; with
  ``wait`` the answer waits up to N seconds (at most 300) until no batch is
  ``PENDING`` (Sawtooth's rule; :mod:`ledgerq.ingest.longpoll`).
  ``ledgerq_status`` gives the tracking status itself (``Cancelled`` for a
  batch an operator cancelled, which reads ``INVALID``), ``service_id`` the
  batch's service. ``POST /batch_statuses`` takes the ids as a JSON array.
  Bounded: at most ``max_status_ids`` distinct ids (repeats answered once),
  each a batch id or ``dc:`` id (else 400); final batches answered from a
  shared cache, the others read in one query, two reads at a time, the
  requests waiting meanwhile read together (:mod:`ledgerq.ingest.combined`);
  an unparsable ``wait`` is a 400; parked requests are capped (429).
* ``GET /tracking/batches?service_id=&status=&limit=&after=`` — tracked
  batches in acceptance order, paginated by ``seq`` (``paging.next`` links
  the next page); off Sawtooth's paths, where ``GET /batches`` is the chain's.
* ``GET /tracking/batches/{id}?service_id=S`` — one batch (a malformed id is
  a 400, as in a status request).
* Sawtooth's read routes (``/state``, ``/blocks``, the chain's ``/batches``,
  …), answered by the ledger: :mod:`ledgerq.ingest.chain`.
* ``GET /services?limit=&after=`` — in service id order, paginated by id
  (``paging.next`` links the next page): queue depth, head batch, in-flight
  batch, lock reason, the ledger's open problem for the service (what it
  last answered instead of a usable answer, since when, how often); under
  high availability also the claimant, claim epoch and expiries.
* ``GET /services/{id}`` and ``POST /services/{id}/pause|resume|skip|cancel``
  — one service, and operator control of it: :mod:`ledgerq.ingest.control`.
* ``GET /instances`` — the gateway instances sharing the database: id,
  start, last renewal, claims held, live or not (empty on a single instance);
  with ``serve --workers N``, also ``workers``: the processes behind this
  port (index, pid, role, instance id, start, restarts).
* ``GET /health`` — the process answers; ``GET /ready`` — the store answers
  and the pipeline runs (503 otherwise).

Sawtooth's routes (``POST /batches``, ``/batch_statuses`` and the read
routes) are served again under ``/services/{service_id}``, which names the
service as ``?service_id=`` does (both, differing: a 400), so that a
Sawtooth client, which only appends paths to its URL, can name one; their
errors carry Sawtooth's codes and titles (``exceptions.py``), with the
``rule`` beside them.

A query parameter given twice with different values is a 400 naming it
(which was meant cannot be told); ``id`` given twice is one list, as
``id=a,b``.

Without ``service_id`` a batch is posted to :data:`~ledgerq.model.NO_SERVICE`;
read without ``service_id``, a batch is found by its id in whichever service
tracks it (a batch id names one batch in one service).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import json
import logging
import math
import re
from collections.abc import Awaitable, Callable, Collection, Sequence
from typing import Any, Protocol
from urllib.parse import quote_plus, urlencode

from aiohttp import web
from multidict import MultiMapping

from ledgerq import jsontext
from ledgerq.claims import ClaimInfo, InstanceInfo
from ledgerq.clock import Clock, now_ms
from ledgerq.errors import (
    BatchNotFoundError,
    DuplicateBatchError,
    InvalidBatchError,
    LedgerqError,
    StoreError,
    StoreInputError,
    StoreOutageError,
    StoreUnavailableError,
)
from ledgerq.httpbody import read_body
from ledgerq.ingest.chain import SERVICE_PREFIX, ChainRoutes, service_prefix
from ledgerq.ingest.combined import CombinedReads, StatusQueueFull
from ledgerq.ingest.decoding import DEFAULT_PRIORITY, BatchListDecoder, ClientGone, Yielding
from ledgerq.ingest.errors import Handler, error_body, json_errors, sawtooth_error
from ledgerq.ingest.guard import guard_middleware, on_disconnect, refuse_encoding
from ledgerq.ingest.longpoll import Changes as Changes
from ledgerq.ingest.longpoll import FinalCache
from ledgerq.ingest.longpoll import TooManyWaitersError as TooManyWaitersError
from ledgerq.ledgers.chain import ChainReads
from ledgerq.model import (
    NO_SERVICE,
    BatchStatus,
    BatchStatusName,
    Invalid,
    TrackingBatch,
    TrackingBatchList,
)
from ledgerq.procpool import Priority
from ledgerq.scopes import FULL, Scope
from ledgerq.store.base import DATA_CHANGE_PREFIX, BatchAcceptor, ControlStore

log = logging.getLogger(__name__)

MAX_WAIT_S = 300
#: Status requests reading the store at once (the others wait their turn;
#: beyond max_waiters waiting, 429).
STATUS_READS = 2
#: Services read from the store at a time for a scoped token's /services
#: page, which skips the services it may not see.
SERVICE_SCAN = 1000
#: Request keys the security middlewares set (:mod:`ledgerq.operator.security`):
#: the caller's token scope, and the base URL links are built from.
# (aiohttp's typed RequestKey where it exists: it warns on plain string keys.)
_KEY: Any = getattr(web, "RequestKey", None)
SCOPE: Any = _KEY("ledgerq_scope", Scope) if _KEY else "ledgerq.scope"
BASE_URL: Any = _KEY("ledgerq_base_url", str) if _KEY else "ledgerq.base_url"


def scope_of(request: web.Request) -> Scope:
    """The scope of the request's token (everything when no token is configured)."""
    scope = request.get(SCOPE)
    return scope if isinstance(scope, Scope) else FULL


def _out_of_scope(scope: Scope, service_id: str, verb: str) -> web.Response:
    return _error(
        403,
        "Forbidden",
        f"the token {scope.name!r} may not {verb} service {service_id!r}; it is limited to "
        f"{', '.join(scope.services)}",
        "out_of_scope",
    )


class ServiceInfo(Protocol):
    @property
    def service_id(self) -> str: ...
    @property
    def queue_depth(self) -> int: ...
    @property
    def head_batch_id(self) -> str | None: ...
    @property
    def in_flight_batch_id(self) -> str | None: ...
    @property
    def total(self) -> int: ...
    @property
    def in_flight(self) -> int: ...
    @property
    def next_batch_id(self) -> str | None: ...
    @property
    def blocker_batch_id(self) -> str | None: ...
    @property
    def blocker_kind(self) -> str | None: ...
    @property
    def blocker_on(self) -> str | None: ...
    @property
    def paused(self) -> bool: ...
    @property
    def paused_by(self) -> str | None: ...
    @property
    def paused_at(self) -> int | None: ...
    @property
    def halted_batch_id(self) -> str | None: ...
    @property
    def halted_reason(self) -> str | None: ...
    @property
    def halted_at(self) -> int | None: ...
    @property
    def next_waits_for(self) -> str | None: ...


class ApiStore(ControlStore, Protocol):
    """The store roles the API needs (accept, read, and operator control)."""

    async def add_batches(
        self, batches: list[TrackingBatch], *, now: int | None = None
    ) -> list[TrackingBatch]: ...

    async def get_batch(self, id: str, service_id: str) -> TrackingBatch | None: ...

    async def get_batches_by_id(self, batch_ids: Collection[str]) -> list[TrackingBatch]: ...

    async def get_batch_statuses_by_id(self, batch_ids: Collection[str]) -> list[TrackingBatch]: ...

    async def get_final_batch_statuses_by_id(
        self, batch_ids: Collection[str]
    ) -> list[TrackingBatch]: ...

    async def list_batches(
        self,
        *,
        service_id: str | None = None,
        status: Any = None,
        limit: int = 100,
        after_seq: int | None = None,
    ) -> TrackingBatchList: ...

    async def list_services(
        self, *, limit: int = 1000, after: str | None = None, service_id: str | None = None
    ) -> Sequence[ServiceInfo]: ...

    async def status_counts(self) -> dict[str, int]: ...


class ClaimsView(Protocol):
    """The claim manager's read side, for ``/instances`` and ``/services``."""

    async def list_instances(self, now: int | None = None) -> list[InstanceInfo]: ...

    async def claims_for(self, service_ids: Sequence[str]) -> dict[str, ClaimInfo]: ...


def _lock_reason(s: ServiceInfo, strategy: str) -> str | None:
    """Why the service's next batch is not going to the ledger, if it is not:
    halted, paused, a batch in flight (serial), a declared dependency it waits
    for, a conflicting batch (parallel)."""
    if s.halted_batch_id is not None:
        return f"halted at batch {s.halted_batch_id}: {s.halted_reason}"
    if s.paused:
        return f"paused by {s.paused_by}" if s.paused_by else "paused"
    if strategy != "parallel":
        if s.in_flight_batch_id:
            return f"batch {s.in_flight_batch_id} is with the submitter or the ledger"
        return s.next_waits_for
    if s.next_waits_for is not None:
        return s.next_waits_for
    if s.blocker_batch_id is None:
        return None
    what = {
        "writes": f"writes {s.blocker_on!r}, which it touches",
        "reads": f"reads {s.blocker_on!r}, which it writes",
        "depends": f"holds transaction {s.blocker_on}, which it depends on",
    }.get(s.blocker_kind or "", "conflicts with it")
    return f"batch {s.next_batch_id} waits for batch {s.blocker_batch_id}, which {what}"


def _error(
    status: int,
    title: str,
    message: str,
    rule: str | None = None,
    headers: dict[str, str] | None = None,
) -> web.Response:
    return web.json_response(
        error_body(status, title, message, rule), status=status, headers=headers
    )


#: Sawtooth's error code for a posted BatchList refused by a codec rule
#: (exceptions.py): an empty list 34, one that does not parse 35, any other
#: refusal 30 (Submitted Batches Invalid: a bad signature, a header that
#: does not decode, ...).
_REFUSAL_CODES = {"empty_batch_list": 34, "malformed_protobuf": 35}

_BATCH_ID = re.compile(r"[0-9a-f]{128}")
MAX_DATA_CHANGE_ID_LENGTH = 256


def _id_problem(i: str) -> str | None:
    """Why ``i`` cannot name a batch (None if it can)."""
    if _BATCH_ID.fullmatch(i):
        return None  # the common case first: a status request checks up to max_status_ids
    shown = i if len(i) <= 140 else i[:16] + "…"
    if i.startswith(DATA_CHANGE_PREFIX):
        dc = i[len(DATA_CHANGE_PREFIX) :]
        if 1 <= len(dc) <= MAX_DATA_CHANGE_ID_LENGTH and dc.isprintable():
            return None
        return (
            f"{shown!r} is not a data change id: write dc: and 1 to "
            f"{MAX_DATA_CHANGE_ID_LENGTH} printable characters"
        )
    return (
        f"{shown!r} is not a batch id: batch ids are 128 lowercase hex characters "
        "(or dc:<data change id>)"
    )


def ids_body_limit(max_ids: int) -> int:
    """The largest ``POST /batch_statuses`` body: ``max_ids`` of the longest
    ids as JSON writes them — ``dc:`` and 256 characters, each escaped at
    worst as a surrogate pair (``\\ud83d\\ude00``: 12 bytes), quoted,
    separated by ``", "`` — in brackets."""
    longest = 2 + len(DATA_CHANGE_PREFIX) + MAX_DATA_CHANGE_ID_LENGTH * 12
    return max_ids * (longest + 2) + 2


_HEX_DIGITS = b"0123456789abcdef"


def _all_batch_ids(ids: Sequence[str]) -> bool:
    """Whether every id is a batch id (128 lowercase hex): the usual case,
    checked on the joined ids at once — what is left of them once every
    lowercase hex digit is deleted must be nothing (``bytes.translate`` in C,
    cheaper than a regular expression over them)."""
    if not all(len(i) == 128 for i in ids):
        return False
    joined = "".join(ids)
    return joined.isascii() and not joined.encode("ascii").translate(None, _HEX_DIGITS)


def _parse_wait(raw: str | None) -> float:
    """Seconds to wait, as Sawtooth's REST API reads ``wait``: absent or
    ``false`` (any case) 0; a number, those seconds (more than the most, ``inf``
    included, counts as the most); any other word (empty, ``true``, ``yes``)
    the most. A number that is no duration (``nan``, negative) is refused."""
    if raw is None:
        return 0.0
    word = raw.strip().lower()
    if word == "false":
        return 0.0
    try:
        value = float(word)  # 1e400 and inf are more than the most: they count as the most
    except ValueError:
        return float(MAX_WAIT_S)
    if math.isnan(value) or value < 0:
        raise ValueError(
            f"wait must be a number of seconds from 0 to {MAX_WAIT_S} (more counts as "
            f"{MAX_WAIT_S}), or false; got {raw!r}"
        )
    return min(value, float(MAX_WAIT_S))


#: The largest ``seq`` a store holds (a signed 64-bit integer): a larger
#: ``after`` is no page, it is a client's mistake (and no database takes it).
MAX_SEQ = 2**63 - 1


class RepeatedParameterError(ValueError):
    """A query parameter given twice with different values: which one was meant?"""


def _param(query: MultiMapping[str], name: str) -> str | None:
    """The query parameter ``name`` (None when absent); given more than once,
    the same value each time (else :class:`RepeatedParameterError` naming it:
    aiohttp's ``query.get`` would take the first and drop the others)."""
    values = query.getall(name, ())
    if not values:
        return None
    first = values[0]
    for other in values[1:]:
        if other != first:
            raise RepeatedParameterError(
                f"{name} is given {len(values)} times with different values ({first!r}, "
                f"{other!r}); give it once"
            )
    return first


def _service_param(request: web.Request) -> str | None:
    """The service a request names: by its prefix (``/services/{service_id}/...``)
    or by ``?service_id=`` (None when neither; ValueError when both, differing)."""
    given = _param(request.query, "service_id") or None
    in_path = request.match_info.get("service_id")
    if in_path is None:
        return given
    if given is not None and given != in_path:
        raise ValueError(
            f"the path names service {in_path!r} and service_id names {given!r}; name one"
        )
    return in_path


def _repeated(exc: RepeatedParameterError) -> web.Response:
    return _error(400, "Bad Query", str(exc), "repeated_parameter")


def _int_param(query: MultiMapping[str], name: str, low: int, high: int) -> int | None:
    """The integer query parameter ``name`` (None when absent or empty);
    ValueError naming it when it is not an integer from ``low`` to ``high``
    (or given twice: :func:`_param`)."""
    raw = _param(query, name)
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        value = low - 1
    if not low <= value <= high:
        raise ValueError(f"{name} must be an integer from {low} to {high}; got {raw!r}")
    return value


def _pending(ids: Sequence[str], found: dict[str, TrackingBatch]) -> list[str]:
    """The ids of tracked batches that are not final yet."""
    return [i for i in ids if i in found and not found[i].is_final]


def sawtooth_status(status: BatchStatus | None) -> str:
    if status is None:
        return "PENDING"
    if status.name in (BatchStatusName.COMMITTED, BatchStatusName.VALID):
        return "COMMITTED"
    if status.name is BatchStatusName.INVALID:
        return "INVALID"
    return "PENDING"


def status_entry(batch_id: str, batch: TrackingBatch | None) -> dict[str, Any]:
    if batch is None:
        return {"id": batch_id, "status": "UNKNOWN", "invalid_transactions": []}
    invalid = []
    if isinstance(batch.batch_status, Invalid):
        for t in batch.batch_status.transactions:
            entry = {
                "id": t.transaction_id,
                "message": t.error_message or t.external_error_message or "",
                "extended_data": base64.b64encode(t.error_data or b"").decode(),
            }
            # As Sawtooth's REST API answers: empty properties left out.
            invalid.append({k: v for k, v in entry.items() if v})
    return {
        "id": batch_id,
        "status": sawtooth_status(batch.batch_status),
        "invalid_transactions": invalid,
        "ledgerq_status": batch.tracking_status,
        "submitted": batch.submitted,
        "service_id": batch.service_id,
    }


def status_body(
    ids: Sequence[str], found: dict[str, TrackingBatch], link: str, final: FinalCache
) -> str:
    """``{"data": [status_entry(i, found.get(i)) for i in ids], "link": link}``
    as JSON, each final batch's entry encoded once and kept in ``final``
    (long-polls ask for the same batches again and again), an unknown or
    pending one's written directly (``ids`` are checked: a batch id is hex)."""
    parts = []
    services: dict[str, str] = {}
    for i in ids:
        batch = found.get(i)
        if batch is None:
            if not i.startswith(DATA_CHANGE_PREFIX):  # a checked batch id: hex, nothing to escape
                parts.append(f'{{"id": "{i}", "status": "UNKNOWN", "invalid_transactions": []}}')
            else:
                parts.append(json.dumps(status_entry(i, None)))
        elif i == batch.batch_id and final.settled(batch):
            encoded = final.encoded(i)
            if encoded is None:
                encoded = json.dumps(status_entry(i, batch))
                final.keep_encoded(i, encoded)
            parts.append(encoded)
        elif i == batch.batch_id and not isinstance(batch.batch_status, Invalid):
            name = batch.status_name
            service = services.get(batch.service_id)
            if service is None:
                service = services[batch.service_id] = json.dumps(batch.service_id)
            parts.append(
                f'{{"id": "{i}", "status": "{sawtooth_status(batch.batch_status)}", '
                f'"invalid_transactions": [], "ledgerq_status": '
                f"{'null' if name is None else json.dumps(name.value)}, "
                f'"submitted": {"true" if batch.submitted else "false"}, "service_id": {service}}}'
            )
        else:
            parts.append(json.dumps(status_entry(i, batch)))
    return '{"data": [' + ", ".join(parts) + '], "link": ' + _json_string(link) + "}"


def _json_string(text: str) -> str:
    """``json.dumps(text)``; a status link (printable ASCII, thousands of
    characters of ids) quoted as it is, without the encoder's pass over it."""
    if text.isascii() and text.isprintable() and '"' not in text and "\\" not in text:
        return '"' + text + '"'
    return json.dumps(text)


def batch_json(b: TrackingBatch) -> dict[str, Any]:
    err = b.submission_error
    return {
        "id": b.batch_id,
        "service_id": b.service_id,
        "seq": b.seq,
        "created_at": b.created_at,
        "status": b.tracking_status,
        "submitted": b.submitted,
        "attempts": b.attempts,
        "last_attempt_at": b.last_attempt_at,
        "data_change_id": b.data_change_id,
        "transaction_ids": [t.transaction_header for t in b.transactions],
        "error": None if err is None else {"type": err.error_type, "message": err.error_message},
    }


class GatewayApi:
    def __init__(
        self,
        store: ApiStore,
        *,
        on_accepted: Callable[[Sequence[TrackingBatch]], None] = lambda _b: None,
        check_service_id: Callable[[str], None] = lambda _s: None,
        is_ready: Callable[[], bool] = lambda: True,
        is_stopping: Callable[[], bool] = lambda: False,
        max_body_bytes: int = 10 * 1024 * 1024,
        changes: Changes | None = None,
        clock: Clock = now_ms,
        claims: ClaimsView | None = None,
        acceptor: BatchAcceptor | None = None,
        ledger_problem: Callable[[str], dict[str, Any] | None] = lambda _s: None,
        strategy_of: Callable[[str], str] = lambda _s: "serial",
        max_status_ids: int = 1_000,
        decode_slots: int = 2,
        decode_priority: Priority = DEFAULT_PRIORITY,
        decode_yielding: Yielding | None = None,
        pipeline_busy: Callable[[], bool] = lambda: False,
        verify_thread: bool = False,
        chain: ChainReads | None = None,
        ledger_name: str = "the ledger",
        default_service: str = "",
        on_control: Callable[[str], Awaitable[None]] | None = None,
    ) -> None:
        """``acceptor``: what stores accepted batches (default: ``store``);
        ``ledger_problem``: the ledger's open problem for a service, if any;
        ``strategy_of``: the queuer strategy of a service id (for ``/services``);
        ``max_status_ids``: distinct ids per status request; ``decode_slots``:
        large BatchLists decoded and verified at once, off the event loop
        (the others wait their turn), in processes at ``decode_priority``;
        the largest of them yield to the pipeline while ``pipeline_busy()``
        as ``decode_yielding`` says (:mod:`ledgerq.ingest.decoding`);
        ``verify_thread``: smaller ones have their signatures verified on a
        thread beside the loop; ``chain``: the ledger's answers to Sawtooth's
        read routes (:mod:`ledgerq.ingest.chain`; ``None``: a ledger without
        them, ``ledger_name`` in the 501 that says so); ``default_service``:
        the service of batches posted without one (empty: none);
        ``on_control``: told the service id after each operator action
        (:mod:`ledgerq.ingest.control`) so it takes effect now."""
        self.max_status_ids = max_status_ids
        #: Posts below the yielding size being taken in now (pipeline work).
        self.posting = 0
        self.decoder = BatchListDecoder(
            max_bytes=max_body_bytes,
            slots=decode_slots,
            priority=decode_priority,
            yielding=decode_yielding,
            busy=lambda: self.posting > 0 or pipeline_busy(),
            verify_thread=verify_thread,
        )
        self.ledger_problem = ledger_problem
        self.store = store
        self.strategy_of = strategy_of
        self.acceptor: BatchAcceptor = store if acceptor is None else acceptor
        self.claims = claims
        #: The workers of ``serve --workers N`` (set by the wiring), for /instances.
        self.workers: Callable[[], Sequence[Any]] | None = None
        self.on_accepted = on_accepted
        self.check_service_id = check_service_id
        self.is_ready = is_ready
        self.is_stopping = is_stopping
        self.max_body_bytes = max_body_bytes
        self.changes = changes or Changes()
        self.changes.reader = lambda ids: self.store.get_batch_statuses_by_id(ids)
        self.changes.final_reader = lambda ids: self.store.get_final_batch_statuses_by_id(ids)
        #: Status requests' reads: STATUS_READS at a time, combined.
        self.status_reads = CombinedReads(
            lambda ids: self.store.get_batch_statuses_by_id(ids),
            slots=STATUS_READS,
            max_queued=self.changes.max_waiters,
        )
        self.clock = clock
        self.default_service = default_service or None
        self.ledger_name = ledger_name
        self.chain = ChainRoutes(
            chain,
            base=_base,
            sees_everything=lambda request: scope_of(request).sees_everything,
            ledger=ledger_name,
        )
        self.on_control = on_control

    def set_tenants(self, tenants: int) -> None:
        """How many tenants (tokens) share the long-poll places and the status
        reads' queue (:mod:`ledgerq.ingest.fairness`)."""
        self.changes.shares.tenants = self.status_reads.shares.tenants = max(1, tenants)

    def app(self) -> web.Application:
        # One byte over the limit lets us tell "too large" from "exactly full".
        app = web.Application(
            client_max_size=self.max_body_bytes + 1,
            middlewares=[guard_middleware, json_errors, read_failures],
        )
        # Sawtooth's API, at the root and under a service's prefix.
        for prefix in ("", SERVICE_PREFIX):
            app.router.add_post(prefix + "/batches", self.post_batches)
            app.router.add_get(prefix + "/batch_statuses", self.batch_statuses)
            app.router.add_post(prefix + "/batch_statuses", self.batch_statuses)
        self.chain.add_to(app)
        # ledgerq's own tracking records, off Sawtooth's paths.
        app.router.add_get("/tracking/batches", self.list_batches)
        app.router.add_get("/tracking/batches/{batch_id}", self.get_batch)
        app.on_cleanup.append(self._stop_decoding)
        app.router.add_get("/services", self.services)
        # Imported here: the control routes build on this module.
        from ledgerq.ingest.control import ServiceControls

        ServiceControls(self, self.on_control or _nothing).add_routes(app)
        app.router.add_get("/instances", self.instances)
        app.router.add_get("/health", self.health)
        app.router.add_get("/ready", self.ready)
        return app

    async def post_batches(self, request: web.Request) -> web.Response:
        if request.content_type != "application/octet-stream":
            return sawtooth_error(
                42,
                f"send the BatchList as application/octet-stream, not {request.content_type!r}",
                "wrong_content_type",
            )
        refused = refuse_encoding(request)
        if refused is not None:
            return refused
        try:
            service_id = _service_param(request)
        except RepeatedParameterError as exc:
            return _repeated(exc)
        except ValueError as exc:
            return _error(400, "Invalid Service Id", str(exc), "conflicting_service_id")
        service_id = service_id or self.default_service
        scope = scope_of(request)
        if not scope.covers(service_id or NO_SERVICE):
            return _out_of_scope(scope, service_id or NO_SERVICE, "post into")
        try:
            body = await read_body(request, self.max_body_bytes)
        except web.HTTPRequestEntityTooLarge:
            return _too_large(self.max_body_bytes)
        if len(body) >= self.decoder.yielding.bytes:
            return await self._take_in(request, body, service_id, scope)
        self.posting += 1
        try:
            return await self._take_in(request, body, service_id, scope)
        finally:
            self.posting -= 1

    async def _take_in(
        self, request: web.Request, body: bytes, service_id: str | None, scope: Scope
    ) -> web.Response:
        """Decode, verify and store a posted body; the answer."""
        try:
            if service_id is not None:
                self.check_service_id(service_id)
            batches = await self._decode(request, body, service_id, scope.name)
        except ClientGone as exc:
            return _error(408, "Request Timeout", str(exc), "client_gone")  # read by no one
        except InvalidBatchError as exc:
            if exc.rule == "too_large":
                return _too_large(self.max_body_bytes)
            if exc.rule == "invalid_service_id":
                return _error(400, "Invalid Service Id", str(exc), exc.rule)
            return sawtooth_error(_REFUSAL_CODES.get(exc.rule, 30), str(exc), exc.rule)
        try:
            stored = await self.acceptor.add_batches(list(batches), now=self.clock())
        except DuplicateBatchError as exc:
            try:
                conflict = await self._conflict(batches, exc, scope)
            except StoreError as store_exc:
                return _store_failed(store_exc)
            if conflict is not None:
                return _error(409, "Batch Already Tracked", conflict, "duplicate_batch")
            return _status_link(request, batches, service_id)  # a retry: held already
        except StoreError as exc:
            return _store_failed(exc)
        self.on_accepted(stored)
        return _status_link(request, stored, service_id)

    async def _decode(
        self, request: web.Request, body: bytes, service_id: str | None, tenant: str = ""
    ) -> Sequence[TrackingBatch]:
        """The list's batches, decoded and verified: small bodies on the event
        loop, large ones in worker processes, ``decode_slots`` at a time
        (:mod:`ledgerq.ingest.decoding`); a post whose client leaves while it
        waits its turn is dropped (:class:`ClientGone`)."""
        left = asyncio.Event()
        stop_hearing = on_disconnect(request, left.set)
        try:
            return await self.decoder.decode(body, service_id, gone=left.is_set, tenant=tenant)
        finally:
            stop_hearing()

    async def _stop_decoding(self, _app: web.Application) -> None:
        await self.changes.aclose()
        await self.status_reads.aclose()
        await asyncio.to_thread(self.decoder.close)

    async def _conflict(
        self, batches: Sequence[TrackingBatch], refusal: DuplicateBatchError, scope: Scope
    ) -> str | None:
        """Why a refused list is not a retry of batches already held (None if it
        is). A service outside ``scope`` is not named: a scoped token learns
        only that the batch id is taken, not which tenant holds it."""
        held = {
            b.batch_id: b for b in await self.store.get_batches_by_id([b.batch_id for b in batches])
        }
        for b in batches:
            h = held.get(b.batch_id)
            if h is None:
                # Not a pure retry: a new batch beside held ones, or a data
                # change id or transaction id that another batch holds.
                if refusal.service_id is not None and not scope.covers(refusal.service_id):
                    return _taken_elsewhere(refusal.batch_id or b.batch_id, b.service_id)
                return str(refusal)
            if h.service_id != b.service_id:
                if not scope.covers(h.service_id):
                    return _taken_elsewhere(b.batch_id, b.service_id)
                return (
                    f"batch {b.batch_id} is already tracked in service {h.service_id!r}, not "
                    f"{b.service_id!r}; a batch belongs to one service"
                )
            if h.serialized_batch != b.serialized_batch:
                return (
                    f"batch {b.batch_id} is already tracked in service {b.service_id!r} with a "
                    "different body; a batch id names one batch"
                )
        return None

    async def batch_statuses(self, request: web.Request) -> web.Response:
        if request.method == "POST":
            ids_or_error = await self._posted_ids(request)
            if isinstance(ids_or_error, web.Response):
                return ids_or_error
            raw_ids = ids_or_error
        else:
            # Repeated, the ids are one list: id=a&id=b asks what id=a,b asks.
            asked = request.query.getall("id", ())
            joined = asked[0] if len(asked) == 1 else ",".join(asked)
            raw_ids = [i.strip() for i in joined.split(",")]
        # De-duplicated, in the order asked.
        ids = list(dict.fromkeys(i for i in raw_ids if i))
        if not ids:
            if request.method == "POST":
                return sawtooth_error(46, "give at least one batch id", "missing_id")
            return sawtooth_error(66, "give the batch ids as ?id=a,b", "missing_id")
        if len(ids) > self.max_status_ids:
            return sawtooth_error(
                46,
                f"{len(ids)} distinct batch ids in one request; ask for at most "
                f"{self.max_status_ids} at a time",
                "too_many_ids",
            )
        if not _all_batch_ids(ids):
            for i in ids:
                problem = _id_problem(i)
                if problem is not None:
                    return sawtooth_error(60, problem, "malformed_id")
        try:
            service_id = _service_param(request)
        except RepeatedParameterError as exc:
            return _repeated(exc)
        except ValueError as exc:
            return _error(400, "Invalid Service Id", str(exc), "conflicting_service_id")
        try:
            wait_s = _parse_wait(_param(request.query, "wait"))
        except RepeatedParameterError as exc:
            return _repeated(exc)
        except ValueError as exc:
            return _error(400, "Bad Query", str(exc), "bad_wait")
        scope = scope_of(request)
        if service_id and not scope.covers(service_id):
            return _out_of_scope(scope, service_id, "read")
        try:
            if wait_s > 0 and not self.changes.has_room(scope):
                # Refused before any read: a full parking lot costs nothing more.
                raise TooManyWaitersError
            found = await self._status_read(ids, service_id, scope)
            if wait_s > 0 and _pending(ids, found):
                await self._wait_final(request, ids, found, wait_s, service_id, scope)
        except StatusQueueFull:
            return _error(
                429,
                "Too Many Requests",
                f"{self.status_reads.queued} status requests are waiting for a read already; "
                "retry later",
                "too_many_status_requests",
                headers={"Retry-After": "1"},
            )
        except TooManyWaitersError:
            return _error(
                429,
                "Too Many Waiting",
                f"{self.changes.parked} status requests are waiting already, the limit; "
                "retry later or ask without wait",
                "too_many_waiters",
                headers={"Retry-After": "1"},
            )
        except StoreError as exc:
            return _read_failed(exc)
        # Absolute, as Sawtooth's and as the link of POST /batches.
        link = f"{_base(request)}{request.rel_url}"
        if request.method == "POST":
            # The same question as a GET: the ids, and where they were looked for.
            query = {"id": ",".join(ids)}
            prefix = service_prefix(request)
            if service_id is not None and not prefix:
                query["service_id"] = service_id
            link = f"{_base(request)}{prefix}/batch_statuses?{urlencode(query)}"
        return web.Response(
            text=status_body(ids, found, link, self.changes.final),
            content_type="application/json",
        )

    async def _posted_ids(self, request: web.Request) -> list[str] | web.Response:
        """The ids of a ``POST /batch_statuses`` (a JSON array, as Sawtooth's)."""
        if request.content_type != "application/json":
            return sawtooth_error(
                43,
                "send the batch ids as a JSON array with Content-Type application/json",
                "wrong_content_type",
            )
        refused = refuse_encoding(request)
        if refused is not None:
            return refused
        limit = ids_body_limit(self.max_status_ids)
        try:
            text = await read_body(request, limit)
        except web.HTTPRequestEntityTooLarge:
            return _error(413, "Request Entity Too Large", f"the id list exceeds {limit} bytes")
        try:
            ids = jsontext.loads(text)
        except ValueError:
            ids = None
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            return sawtooth_error(
                46, "the body must be a JSON array of batch ids (strings)", "bad_status_request"
            )
        return [i.strip() for i in ids]

    async def _status_read(
        self, ids: Sequence[str], service_id: str | None, scope: Scope
    ) -> dict[str, TrackingBatch]:
        """What a status answer says of ``ids``: batches seen final by any
        request come from the shared cache (:class:`~ledgerq.ingest.longpoll.FinalCache`),
        the others from the store, read together with other requests' ids
        (:mod:`ledgerq.ingest.combined`; :class:`StatusQueueFull` beyond
        ``max_waiters`` requests waiting for theirs)."""
        found: dict[str, TrackingBatch] = {}
        final = self.changes.final
        everything = scope.sees_everything
        rest = []
        for i in ids:
            cached = final.get(i)
            if cached is None:
                rest.append(i)
            elif (service_id is None or cached.service_id == service_id) and (
                everything or scope.covers(cached.service_id)
            ):
                found[i] = cached
            else:
                # A final batch this request may not see: read as an unknown id
                # is, so that how fast the answer comes tells nothing of it.
                rest.append(i)
        if not rest:
            return found
        read = await self._read_map(rest, service_id, scope, narrow=True)
        final.add_all(read.values())
        found.update(read)
        return found

    async def _wait_final(
        self,
        request: web.Request,
        ids: Sequence[str],
        found: dict[str, TrackingBatch],
        wait_s: float,
        service_id: str | None,
        scope: Scope,
    ) -> None:
        """Park until no batch of ``ids`` is pending or ``wait_s`` has passed
        (``found`` is updated in place by :class:`Changes`, module
        :mod:`ledgerq.ingest.longpoll`); a client that goes away ends the
        wait. A wait that runs out reads the ids not final again: the answer
        is the store's, even if a wake-up was lost."""
        with self.changes.park(service_id, scope) as waiter:
            stop_hearing = on_disconnect(request, waiter.event.set)
            try:
                self.changes.watch(
                    waiter, found, _pending(ids, found), [i for i in ids if i not in found]
                )
                done = await self.changes.wait(waiter, wait_s)
            finally:
                stop_hearing()
        if not done:
            open_ids = [i for i in ids if i not in found or not found[i].is_final]
            with contextlib.suppress(StoreError, StatusQueueFull):
                found.update(await self._status_read(open_ids, service_id, scope))

    async def _read(self, ids: Sequence[str], service_id: str | None) -> list[TrackingBatch | None]:
        found = await self._read_map(ids, service_id)
        return [found.get(i) for i in ids]

    async def _read_map(
        self,
        ids: Sequence[str],
        service_id: str | None,
        scope: Scope = FULL,
        *,
        narrow: bool = False,
    ) -> dict[str, TrackingBatch]:
        """The batches ``ids`` name (untracked ones left out): in ``service_id``
        when given, else wherever each is tracked (a batch id names one batch in
        one service), all in one query; a ``dc:`` id is looked up by itself, in
        ``service_id`` or among the batches posted without one. Batches outside
        ``scope`` are left out too (a scoped token learns nothing of them).
        ``narrow``: what a status answer needs, without the transactions."""
        found: dict[str, TrackingBatch] = {}
        batch_ids = [i for i in ids if not i.startswith(DATA_CHANGE_PREFIX)]
        if batch_ids and narrow:
            by_id = await self.status_reads.read(batch_ids, scope.name)
            for i in batch_ids:
                b = by_id.get(i)
                if b is not None and (service_id is None or b.service_id == service_id):
                    found[i] = b
        elif batch_ids:
            for b in await self.store.get_batches_by_id(batch_ids):
                if service_id is None or b.service_id == service_id:
                    found[b.batch_id] = b
        for i in ids:
            if i.startswith(DATA_CHANGE_PREFIX):
                batch = await self._get(i, service_id or NO_SERVICE)
                if batch is not None:
                    found[i] = batch
        if scope.sees_everything:
            return found
        return {i: b for i, b in found.items() if scope.covers(b.service_id)}

    async def _get(self, batch_id: str, service_id: str) -> TrackingBatch | None:
        try:
            return await self.store.get_batch(batch_id, service_id)
        except BatchNotFoundError:
            return None

    async def get_batch(self, request: web.Request) -> web.Response:
        batch_id = request.match_info["batch_id"]
        problem = _id_problem(batch_id)
        if problem is not None:
            return _error(400, "Invalid Id", problem, "malformed_id")
        try:
            given = _param(request.query, "service_id")
        except RepeatedParameterError as exc:
            return _repeated(exc)
        scope = scope_of(request)
        if given and not scope.covers(given):
            return _out_of_scope(scope, given, "read")
        (batch,) = _visible(scope, await self._read([batch_id], given))
        if batch is None:
            where = f"in service {given}" if given else "in any service"
            return _error(404, "Not Found", f"no batch {batch_id} {where}; check the id")
        return web.json_response({"data": batch_json(batch)})

    async def list_batches(self, request: web.Request) -> web.Response:
        q = request.query
        try:
            service_id = _param(q, "service_id") or None
            limit = _int_param(q, "limit", 1, 1000) or 100
            after = _int_param(q, "after", -MAX_SEQ - 1, MAX_SEQ)
            status: Any = _param(q, "status") or None
            if status is not None:
                status = "none" if status.lower() == "none" else BatchStatusName.parse(status)
        except RepeatedParameterError as exc:
            return _repeated(exc)
        except ValueError as exc:
            return _error(400, "Bad Query", str(exc))
        scope = scope_of(request)
        if service_id and not scope.covers(service_id):
            return _out_of_scope(scope, service_id, "read")
        listed = await self.store.list_batches(
            service_id=service_id, status=status, limit=limit, after_seq=after
        )
        # A scoped token's page may hold fewer than ``limit``: the paging
        # follows the store's page, not what the token sees of it.
        data = [batch_json(b) for b in listed.batches if scope.covers(b.service_id)]
        next_link = None
        if len(listed.batches) == limit and listed.batches[-1].seq is not None:
            params = {k: v for k, v in q.items() if k != "after"}
            params["after"] = str(listed.batches[-1].seq)
            next_link = f"{_base(request)}/tracking/batches?{urlencode(params)}"
        return web.json_response({"data": data, "paging": {"limit": limit, "next": next_link}})

    async def services(self, request: web.Request) -> web.Response:
        try:
            limit = _int_param(request.query, "limit", 1, 10_000) or 1000
            after = _param(request.query, "after")
        except RepeatedParameterError as exc:
            return _repeated(exc)
        except ValueError as exc:
            return _error(400, "Bad Query", str(exc))
        if after is not None and not after.isprintable():
            # No service id holds one (and PostgreSQL refuses a NUL in a query).
            return _error(
                400,
                "Bad Query",
                f"after must be the last service id of the previous page; got {after!r}",
            )
        listed, more = await self._services_page(scope_of(request), limit, after)
        data = await self.service_items(listed)
        next_link = None
        if more:
            params = {k: v for k, v in request.query.items() if k != "after"}
            params["after"] = listed[-1].service_id
            next_link = f"{_base(request)}/services?{urlencode(params)}"
        return web.json_response({"data": data, "paging": {"limit": limit, "next": next_link}})

    async def service_items(self, listed: Sequence[ServiceInfo]) -> list[dict[str, Any]]:
        """What ``/services`` says of each service (one query for their claims)."""
        claims: dict[str, ClaimInfo] = {}
        if self.claims is not None:
            claims = await self.claims.claims_for([s.service_id for s in listed])
        data = []
        for s in listed:
            strategy = self.strategy_of(s.service_id)
            blocked_by = None
            if s.blocker_batch_id is not None:
                blocked_by = {
                    "batch_id": s.blocker_batch_id,
                    "kind": s.blocker_kind,
                    "on": s.blocker_on,
                }
            item: dict[str, Any] = {
                "service_id": s.service_id,
                "queue_depth": s.queue_depth,
                "head_batch_id": s.head_batch_id,
                "in_flight_batch_id": s.in_flight_batch_id,
                "total": s.total,
                "strategy": strategy,
                "in_flight": s.in_flight,
                "next_batch_id": s.next_batch_id,
                "blocked_by": blocked_by,
                "lock_reason": _lock_reason(s, strategy),
                "paused": {"by": s.paused_by, "at": s.paused_at} if s.paused else None,
                "halted": None
                if s.halted_batch_id is None
                else {"batch_id": s.halted_batch_id, "reason": s.halted_reason, "at": s.halted_at},
                "waits_for": s.next_waits_for,
                "ledger_problem": self.ledger_problem(s.service_id),
            }
            if self.claims is not None:
                claim = claims.get(s.service_id)
                item["claimant"] = claim.claimant if claim else None
                item["claim_epoch"] = claim.epoch if claim else None
                item["claim_expiry_1"] = claim.expiry_1 if claim else None
                item["claim_expiry_2"] = claim.expiry_2 if claim else None
                if (claim is None or claim.claimant is None) and item["lock_reason"] is None:
                    item["lock_reason"] = "no gateway instance holds a claim on it yet"
            data.append(item)
        return data

    async def _services_page(
        self, scope: Scope, limit: int, after: str | None
    ) -> tuple[Sequence[ServiceInfo], bool]:
        """Up to ``limit`` services after ``after`` that ``scope`` sees, and
        whether more may follow. A scoped token's page is read on past the
        services it may not see, so that it ends on one of its own: the next
        page's ``after`` never names another tenant's service."""
        if scope.sees_everything:
            page = await self.store.list_services(limit=limit, after=after)
            return page, len(page) == limit
        step = max(limit, SERVICE_SCAN)
        listed: list[ServiceInfo] = []
        while True:
            page = await self.store.list_services(limit=step, after=after)
            listed.extend(s for s in page if scope.covers(s.service_id))
            if len(listed) >= limit or len(page) < step:
                break
            after = page[-1].service_id
        more = len(listed) > limit or (len(listed) == limit and len(page) == step)
        return listed[:limit], more

    async def instances(self, request: web.Request) -> web.Response:
        # Counts over every service (batches accepted, claims held) are the
        # whole gateway's: a token limited to some services gets null.
        everything = scope_of(request).sees_everything
        workers: dict[str, Any] = {"ledger": self.ledger_name}
        if self.workers is not None:
            workers["workers"] = _workers(self.workers())
        if not everything:
            for w in workers.get("workers", ()):
                w["accepted"] = None
        if self.claims is None:
            return web.json_response({"data": [], "high_availability": False, **workers})
        listed = await self.claims.list_instances(self.clock())
        data = [
            {
                "instance_id": i.instance_id,
                "started_at": i.started_at,
                "last_renewal": i.heartbeat_at,
                "address": i.address,
                "claims": i.claims if everything else None,
                "live": i.live,
            }
            for i in listed
        ]
        return web.json_response({"data": data, "high_availability": True, **workers})

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def ready(self, request: web.Request) -> web.Response:
        try:
            counts = await asyncio.wait_for(self.store.status_counts(), 5)
        except (LedgerqError, TimeoutError) as exc:
            # /ready is public: the cause (which may name the database's user
            # and host) goes to the log, not to the caller.
            (log.debug if isinstance(exc, StoreOutageError) else log.warning)(
                "not ready: the store does not answer: %s", exc
            )
            return web.json_response(
                {"status": "store unavailable", "error": "the store does not answer; see the log"},
                status=503,
            )
        if not self.is_ready():
            # Stopping: draining its submissions (SIGTERM), not coming up.
            status = "stopping" if self.is_stopping() else "starting"
            return web.json_response({"status": status}, status=503)
        return web.json_response({"status": "ready", "batches": counts})


#: What a client is told of a store failure: never the cause, which may name
#: the database's host, port, user or name (the log has it).
STORE_UNAVAILABLE = "the store is unavailable; retry later"


def _store_failed(exc: StoreError) -> web.Response:
    """The answer to a store refusal: ``400`` for a value it cannot hold (a
    permanent problem the codec should have caught, named), ``503`` only when
    the store is unavailable (worth a retry), ``500`` for anything else; the
    cause of a 503 or 500 goes to the log only."""
    if isinstance(exc, StoreInputError):
        log.warning("the store refused a list the codec passed: %s", exc)
        return sawtooth_error(30, str(exc), "store_input")
    if isinstance(exc, StoreUnavailableError):
        # An outage is logged once by the store, not once per request.
        (log.debug if isinstance(exc, StoreOutageError) else log.error)(
            "cannot store batches: %s", exc
        )
        return _error(503, "Store Unavailable", STORE_UNAVAILABLE)
    log.error("the store failed: %s", exc)
    return _error(500, "Store Error", "the store failed; nothing was stored (see the log)")


def _read_failed(exc: StoreError) -> web.Response:
    """The answer to a read the store could not make: ``503`` when it is
    unavailable (worth a retry), ``500`` otherwise; the cause goes to the log
    only."""
    if isinstance(exc, StoreUnavailableError):
        (log.debug if isinstance(exc, StoreOutageError) else log.error)(
            "cannot read the store: %s", exc
        )
        return _error(503, "Store Unavailable", STORE_UNAVAILABLE)
    log.error("the store failed a read: %s", exc)
    return _error(500, "Store Error", "the store failed to read; see the log")


@web.middleware
async def read_failures(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A store failure a handler lets through (the reads: listings, one
    batch, services, instances) answered as :func:`_read_failed` says, not
    as an unexplained 500 with a traceback per request."""
    try:
        return await handler(request)
    except StoreError as exc:
        return _read_failed(exc)


async def _nothing(_service_id: str) -> None:
    pass


def _workers(workers: Sequence[Any]) -> list[dict[str, Any]]:
    return [dataclasses.asdict(w) for w in workers]


def _status_link(
    request: web.Request, batches: Sequence[TrackingBatch], service_id: str | None
) -> web.Response:
    # What urlencode({"id": ",".join(ids)}) gives, without quoting a list of
    # hex ids character by character (slow for a long list): each id is
    # quoted alone (at once when it needs nothing), the commas as %2C.
    query = "id=" + "%2C".join(quote_plus(b.batch_id, safe="") for b in batches)
    prefix = service_prefix(request)
    if service_id is not None and not prefix:
        query += "&" + urlencode({"service_id": service_id})
    return web.json_response(
        {"link": f"{_base(request)}{prefix}/batch_statuses?{query}"}, status=202
    )


def _taken_elsewhere(batch_id: str, service_id: str) -> str:
    """The conflict of a batch held in a service the caller may not see, unnamed."""
    return (
        f"batch {batch_id} is already tracked in another service, not {service_id!r}; "
        "a batch belongs to one service"
    )


def _too_large(limit: int) -> web.Response:
    return _error(
        413,
        "Request Entity Too Large",
        f"the BatchList exceeds {limit} bytes; split it into several requests",
        "too_large",
    )


def _visible(scope: Scope, batches: list[TrackingBatch | None]) -> list[TrackingBatch | None]:
    """What a scoped token sees of ``batches``: outside its services, nothing
    (reported as never seen, so it learns nothing of other tenants' ids)."""
    return [b if b is not None and scope.covers(b.service_id) else None for b in batches]


def _base(request: web.Request) -> str:
    """The base of absolute links: set by the host check from configuration
    (``public_url``, trusted forwarded headers, or the checked ``Host``; empty,
    so links are relative, when nothing vouches for a host name). The bare
    API app, without the gateway's middlewares, uses the request's own."""
    base = request.get(BASE_URL)
    return base if isinstance(base, str) else f"{request.scheme}://{request.host}"

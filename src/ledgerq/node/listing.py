"""Sawtooth's list envelope, built as its REST API builds it (``route_handlers.py``).

What a Sawtooth client relies on, route by route the same:

* **Paging controls.** ``limit`` must be a positive integer (else 400, code
  53). A page holds ``limit`` items, at most :data:`MAX_LIMIT` (a larger
  ``limit`` gets full pages, no error) and :data:`DEFAULT_LIMIT` without
  ``limit``. ``start`` names the first item of the page, inclusive; a
  ``start`` that is not in the list is 400, code 54 (an empty list has no
  wrong ``start``).
* **Sorting.** ``reverse`` absent or ``false`` (any case): the list's own
  order. ``reverse`` without a value, or naming the list's sort key
  (``block_num`` for blocks, ``default`` for the others): reversed. Any other
  value names a key the list is not sorted by: 400, code 57.
* **Filters.** ``id`` is a comma-separated list of 128-hex-digit ids; one
  that is not (an empty one included) is 400, code 60.
* **The answer** ``{"data", "head", "link", "paging"}``: ``paging`` has
  ``limit`` and ``start`` as the request gave them (``null`` when absent),
  plus ``next_position`` (the first item of the next page) and ``next`` (the
  link to it) when there is more. ``link`` pins ``head``, ``start`` (the
  page's first item) and ``limit`` (the page size), so it names this page
  whatever the chain does next; ``next`` pins ``head`` too, so paging through
  a growing chain is stable. An empty page's ``link`` pins ``head`` only:
  Sawtooth's also carries ``start&limit=0``, a link its own REST API refuses
  (code 53) when followed.
* **Links** (:func:`build_url`) keep the request's query, with ``head``,
  ``start`` and ``limit`` first and the other parameters in name order, and
  honour ``Forwarded`` / ``X-Forwarded-{Proto,Host,Path}`` from a proxy.

:func:`drop_empty` removes empty-string properties, as Sawtooth does with
the batch statuses and receipts it answers.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from aiohttp import web

DEFAULT_LIMIT = 100
MAX_LIMIT = 1_000

_ID = re.compile(r"[0-9a-f]{128}")


class RequestError(Exception):
    """A request refused with Sawtooth's error body; ``response`` is the answer."""

    def __init__(self, status: int, code: int, title: str, message: str) -> None:
        super().__init__(message)
        self.response = web.json_response(
            {"error": {"code": code, "title": title, "message": message}}, status=status
        )


def invalid_id(value: str, what: str) -> RequestError:
    return RequestError(
        400,
        60,
        "Invalid Resource Id",
        f"{value[:130]!r} is not a {what} id: ids are 128 lowercase hex characters",
    )


def paging_invalid(message: str) -> RequestError:
    return RequestError(400, 54, "Invalid Paging Query", message)


def check_id(value: str, what: str) -> str:
    if not _ID.fullmatch(value):
        raise invalid_id(value, what)
    return value


def filter_ids(request: web.Request, what: str) -> list[str] | None:
    """The ``id`` filter: ``None`` without one; every id checked (code 60)."""
    raw = request.query.get("id")
    if raw is None:
        return None
    return [check_id(i, what) for i in raw.split(",")]


@dataclass(frozen=True, slots=True)
class Controls:
    """``start`` and ``limit`` as the request gave them."""

    start: str | None
    limit: int | None

    def size(self, largest: int = MAX_LIMIT) -> int:
        """Items per page."""
        return DEFAULT_LIMIT if self.limit is None else min(self.limit, largest)


def paging_controls(request: web.Request) -> Controls:
    raw = request.query.get("limit")
    limit: int | None = None
    if raw is not None:
        try:
            limit = int(raw)
        except ValueError:
            limit = 0
        if limit <= 0:
            raise RequestError(
                400,
                53,
                "Invalid Count Query",
                f"'limit' {raw[:40]!r} is not a positive, non-zero integer",
            )
    return Controls(request.query.get("start"), limit)


def is_reverse(request: web.Request, key: str) -> bool:
    """Whether ``reverse`` asks for the list backwards; 57 for a key it is not sorted by."""
    raw = request.query.get("reverse")
    if raw is None or raw.lower() == "false":
        return False
    if raw in ("", key):
        return True
    raise RequestError(
        400,
        57,
        "Invalid Sort Query",
        f"'reverse={raw[:40]}' names a sort key this list does not have: give 'reverse' "
        f"alone (or 'reverse={key}') for the list backwards, 'reverse=false' for its order",
    )


@dataclass(frozen=True, slots=True)
class Page:
    data: list[Any]
    first: str  # the id of data[0] ("" when empty)
    next: str  # the id of the item after the page ("" when none)
    size: int


def take(items: Iterable[tuple[str, Any]], size: int) -> Page:
    """The first ``size`` of ``items`` (``(id, item)`` pairs), and the id after them."""
    data: list[Any] = []
    first = ""
    for item_id, item in items:
        if len(data) == size:
            return Page(data, first, item_id, size)
        if not data:
            first = item_id
        data.append(item)
    return Page(data, first, "", size)


def page_of(items: Sequence[tuple[str, Any]], controls: Controls, size: int) -> Page:
    """A page of a list held whole (a filtered one): ``start`` must be one of its ids."""
    index = 0
    if controls.start is not None and items:
        ids = [item_id for item_id, _ in items]
        if controls.start not in ids:
            raise paging_invalid(f"'start' {controls.start[:130]!r} is not in this list")
        index = ids.index(controls.start)
    return take(items[index:], size)


def respond(
    request: web.Request,
    page: Page,
    controls: Controls,
    head: str,
    *,
    paged: bool = True,
) -> web.Response:
    """Sawtooth's paginated answer; ``paged=False``: a list answered whole (blocks by id)."""
    if page.data and paged:
        link = build_url(request, head=head, start=page.first, limit=page.size)
    else:
        link = build_url(request, head=head)
    paging: dict[str, Any] = {"limit": controls.limit, "start": controls.start}
    if page.next:
        paging["next_position"] = page.next
        paging["next"] = build_url(request, head=head, limit=controls.limit, start=page.next)
    return web.json_response({"data": page.data, "head": head, "link": link, "paging": paging})


def build_url(request: web.Request, path: str | None = None, **changes: str | int | None) -> str:
    """The request's URL with ``changes`` to its query (``None``: unchanged), as Sawtooth
    builds ``link`` and ``next``: ``head``, ``start``, ``limit`` first, then by name."""
    queries: dict[str, str] = {}
    for key in request.query:  # a repeated parameter counts once, with its first value
        queries.setdefault(key, request.query[key])
    queries.update({k: str(v) for k, v in changes.items() if v is not None})
    pairs: list[tuple[str, str]] = [
        (k, queries.pop(k)) for k in ("head", "start", "limit") if k in queries
    ]
    pairs += sorted(queries.items())
    query = "&".join(
        f"{quote(k, safe='')}={quote(v, safe=',:')}" if v != "" else quote(k, safe="")
        for k, v in pairs
    )
    scheme = _forwarded(request, "proto") or request.url.scheme
    host = _forwarded(request, "host") or request.host
    prefix = _forwarded(request, "path")
    return f"{scheme}://{host}{prefix}{path or request.path}{'?' + query if query else ''}"


def _forwarded(request: web.Request, key: str) -> str:
    """A ``Forwarded`` parameter, else its ``X-Forwarded-`` header, else ``""``."""
    match = re.search(
        rf"(?<={key}=).+?(?=[\s,;]|$)", request.headers.get("Forwarded", ""), re.IGNORECASE
    )
    if match is not None:
        value = match.group(0)
        return value[1:-1] if len(value) > 1 and value[0] == value[-1] == '"' else value
    return request.headers.get(f"X-Forwarded-{key.title()}", "")


def drop_empty(item: Any) -> Any:
    """``item`` without its empty-string properties, at every depth."""
    if isinstance(item, list):
        return [drop_empty(i) for i in item]
    if isinstance(item, dict):
        return {k: drop_empty(v) for k, v in item.items() if v != ""}
    return item

"""A cap on the node's open streams: ``GET /events`` (server-sent events) and
``GET /subscriptions`` (the state-delta websocket).

Every commit is sent to every open stream, so each costs the node work per
commit whether its client reads it or not; a client opening thousands would
slow every commit. :func:`stream_cap_middleware` lets at most
``max_streams`` be open at once, and at most a quarter of them (at least
one) from one client address; beyond, a Sawtooth-shaped ``429`` with
``Retry-After`` before anything is sent. A gateway holds one stream per
process that submits: the default leaves room for many gateways.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

#: The routes whose answers are streams kept open.
STREAM_PATHS = frozenset({"/events", "/subscriptions"})


def per_address_share(max_streams: int) -> int:
    """Streams one client address may hold: a quarter of the cap, at least one."""
    return max(1, max_streams // 4)


def stream_cap_middleware(max_streams: int) -> Callable[..., Awaitable[web.StreamResponse]]:
    """Refuse a stream beyond ``max_streams`` open, or beyond an address's share."""
    share = per_address_share(max_streams)
    open_by_address: dict[str, int] = {}

    def refused(message: str) -> web.Response:
        return web.json_response(
            {"error": {"code": 429, "title": "Too Many Streams", "message": message}},
            status=429,
            headers={"Retry-After": "5"},
        )

    @web.middleware
    async def cap(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path not in STREAM_PATHS:
            return await handler(request)
        address = request.remote or ""
        mine = open_by_address.get(address, 0)
        if sum(open_by_address.values()) >= max_streams:
            return refused(f"{max_streams} event streams are open, the node's limit; retry later")
        if mine >= share:
            return refused(
                f"{mine} event streams from your address are open, its share of the "
                f"node's {max_streams}; close one or retry later"
            )
        open_by_address[address] = mine + 1
        try:
            return await handler(request)
        finally:
            left = open_by_address[address] - 1
            if left:
                open_by_address[address] = left
            else:
                del open_by_address[address]

    return cap

"""Request bodies read with a bound on what they inflate to.

A gzip of 1 GiB of zeros is 1 MB on the wire. aiohttp's servers inflate a
compressed body as its bytes arrive, on the event loop, before a handler
reads it and after the handler answered (draining the unread rest of a
connection it keeps): a body posted to a route that never reads it still
costs its whole inflation. So ledgerq's servers (the gateway's and the
node's listening sites) run aiohttp with ``auto_decompress=False``: a body
arrives as it was sent, and a body no handler reads is discarded as it is,
never inflated. A handler that reads one calls :func:`read_body`:

* the body as sent is read first, at most ``max_bytes`` of it (aiohttp's
  ``client_max_size`` of the app bounds it too);
* ``gzip`` or ``deflate`` (``Content-Encoding``, any case) is then inflated
  on a worker thread, never on the event loop, in steps of
  :data:`STEP_BYTES` of output, and stopped as soon as the output passes
  ``max_bytes``: a bomb costs the inflating of ``max_bytes`` at most and is
  answered ``413`` (:class:`BodyTooLarge`, an
  :class:`aiohttp.web.HTTPRequestEntityTooLarge`);
* a body that does not inflate (not gzip, truncated) is a ``400`` saying so
  (:class:`aiohttp.web.HTTPBadRequest`), whose text starts with
  :data:`UNREADABLE`.

Other encodings are the caller's to refuse (the gateway answers ``415``).
On an app served without ``auto_decompress=False`` (a bare app in a test)
aiohttp has inflated the body already; it is then taken as it is.
"""

from __future__ import annotations

import asyncio
import zlib

from aiohttp import web

#: What the 400 of a body that cannot be read starts with.
UNREADABLE = "the request body cannot be read: "
#: Output inflated per step: a bomb stops within one step past the limit.
STEP_BYTES = 1 << 20
#: ``Content-Encoding`` values :func:`read_body` inflates.
INFLATED = ("gzip", "deflate")


class BodyTooLarge(web.HTTPRequestEntityTooLarge):
    """A body past its limit; ``size``: its bytes as sent, or those inflated
    when the inflating stopped."""

    def __init__(self, max_bytes: int, size: int) -> None:
        super().__init__(max_size=max_bytes, actual_size=size)
        self.size = size


def _too_large(max_bytes: int, size: int) -> BodyTooLarge:
    return BodyTooLarge(max_bytes, size)


def _unreadable(why: str) -> web.HTTPBadRequest:
    return web.HTTPBadRequest(text=UNREADABLE + why)


async def read_body(request: web.BaseRequest, max_bytes: int) -> bytes:
    """The request's body, inflated if it is gzip or deflate (module notes);
    ``HTTPRequestEntityTooLarge`` beyond ``max_bytes`` (as sent or inflated),
    ``HTTPBadRequest`` for a body that does not inflate."""
    if request.content_length is not None and request.content_length > max_bytes:
        raise _too_large(max_bytes, request.content_length)
    raw = await request.read()
    if len(raw) > max_bytes:
        raise _too_large(max_bytes, len(raw))
    encoding = request.headers.get("Content-Encoding", "").strip().lower()
    if encoding not in INFLATED or request.content.total_compressed_bytes is not None:
        # Not compressed, not ours to inflate, or inflated by aiohttp already.
        return raw
    return await asyncio.to_thread(inflate, raw, encoding, max_bytes)


def inflate(raw: bytes, encoding: str, max_bytes: int) -> bytes:
    """``raw`` inflated as ``encoding`` (gzip, or deflate: zlib-wrapped or
    raw, as aiohttp tells them apart), stopping as soon as the output passes
    ``max_bytes``. Concatenated gzip members are one body, as gzip reads them."""
    if not raw:
        return raw
    parts: list[bytes] = []
    size = 0
    rest = raw
    while True:
        if encoding == "gzip":
            wbits = 16 + zlib.MAX_WBITS
        else:
            # RFC 1950: a zlib stream's first byte names method 8; else raw deflate.
            wbits = zlib.MAX_WBITS if rest and rest[0] & 0x0F == 8 else -zlib.MAX_WBITS
        inflater = zlib.decompressobj(wbits)
        data = rest
        try:
            while not inflater.eof:
                out = inflater.decompress(data, STEP_BYTES)
                size += len(out)
                if size > max_bytes:
                    raise _too_large(max_bytes, size)
                parts.append(out)
                data = inflater.unconsumed_tail
                if not out and not data:
                    break  # all that was sent is inflated
        except zlib.error as exc:
            raise _unreadable(f"it is not valid {encoding} ({exc})") from exc
        if not inflater.eof:
            raise _unreadable(f"it ends before its {encoding} stream does")
        rest = inflater.unused_data
        if encoding != "gzip" or not rest.strip(b"\x00"):
            # Trailing zeros after a gzip member are padding, as gzip reads them.
            return b"".join(parts)

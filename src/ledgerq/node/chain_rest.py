"""Sawtooth's read endpoints over the node's chain of blocks (``openapi.yaml``).

A block holds one COMMITTED batch (see :mod:`ledgerq.node.blocks`); an
INVALID batch is in no block, as Sawtooth leaves invalid batches out of its
blocks. Everything is read
from the node's committed view (memory for what is not written yet, else the
store), never from a full scan.

Lists, answered as :mod:`ledgerq.node.listing` says (paging, ``reverse``,
``link``, ``paging.next`` with ``head`` pinned):

* ``GET /blocks``: newest first from ``head`` (default: the latest block; a
  block id, or a block number, which Sawtooth's REST API does not take);
  ``start`` is a block number as Sawtooth writes it, ``0x`` and 16 hex
  digits (``paging.next_position`` gives it), or a block id. With
  ``?id=a,b`` the blocks named, in that order, those above ``head`` left
  out, all in one answer (no paging), as Sawtooth's validator answers.
* ``GET /batches``, ``/transactions``: committed batches and transactions,
  the newest block first and in block order inside a block, the order
  Sawtooth's validator walks its chain; ``start`` is an id. With ``?id=a,b``
  the ones named that the chain holds up to ``head``, in that order, paged.
* ``GET /blocks/{id}``, ``/batches/{id}``, ``/transactions/{id}``: one item,
  404 (codes 70, 71, 72) when the chain does not hold it, 400 (code 60) for
  an id that is not 128 hex digits.
* ``GET /receipts?id=a,b`` and ``POST /receipts`` (JSON array of ids): one
  receipt per committed transaction, ``{"id", "state_changes", "events",
  "data"}`` (Sawtooth's REST API names ``transaction_id`` ``id``):
  ``state_changes`` are the ``SET`` of every address among the transaction's
  outputs that its batch wrote (the batch's final value; the node executes a
  batch as one candidate), no events, no data. 404 (code 80) if one is not
  committed. ``POST`` answers ``data`` only, as Sawtooth's.
* ``GET /status``: ``{"endpoint": "", "peers": []}``; ``GET /peers``: ``[]``:
  the node has no peers.

Errors use Sawtooth's codes: 50 (head not found), 53, 54, 57 (paging and
sorting), 60 (malformed id), 81-83 (receipts requests).
"""

from __future__ import annotations

import base64
import re
from collections.abc import Callable, Iterator
from typing import Any, cast

from aiohttp import web

from ledgerq import jsontext
from ledgerq.codec import ParsedBatch, decode_batch
from ledgerq.httpbody import read_body
from ledgerq.node.chain import header_fields
from ledgerq.node.disk import CommitRecord
from ledgerq.node.listing import (
    MAX_LIMIT,
    Controls,
    Page,
    RequestError,
    build_url,
    check_id,
    drop_empty,
    filter_ids,
    invalid_id,
    is_reverse,
    page_of,
    paging_controls,
    paging_invalid,
    respond,
    take,
)
from ledgerq.node.node import Node

_ID = re.compile(r"[0-9a-f]{128}")
# ASCII digits only: str.isdigit() also takes "²", and int() refuses it (and
# strings past 4,300 digits), which made such a head a 500.
_NUM = re.compile(r"[0-9]{1,20}")
# A block number as Sawtooth's validator writes it in paging: "0x" and hex digits.
_BLOCK_NUM = re.compile(r"0x[0-9a-fA-F]{1,16}")

Items = Iterator[tuple[str, dict[str, Any]]]


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def transaction_json(batch: ParsedBatch) -> list[dict[str, Any]]:
    return [
        {
            "header": {
                "batcher_public_key": t.header.batcher_public_key,
                "dependencies": list(t.header.dependencies),
                "family_name": t.header.family_name,
                "family_version": t.header.family_version,
                "inputs": list(t.header.inputs),
                "nonce": t.header.nonce,
                "outputs": list(t.header.outputs),
                "payload_sha512": t.header.payload_sha512,
                "signer_public_key": t.header.signer_public_key,
            },
            "header_signature": t.header_signature,
            "payload": b64(t.payload),
        }
        for t in batch.transactions
    ]


def batch_json(batch: ParsedBatch) -> dict[str, Any]:
    return {
        "header": {
            "signer_public_key": batch.signer_public_key,
            "transaction_ids": list(batch.transaction_ids),
        },
        "header_signature": batch.header_signature,
        "trace": batch.trace,
        "transactions": transaction_json(batch),
    }


def _committed(record: CommitRecord) -> ParsedBatch | None:
    if not isinstance(record.status, str) or not record.batch:
        return None
    return decode_batch(record.batch, verify=False)


def block_num_hex(num: int) -> str:
    """A block number as Sawtooth's validator writes it in ``paging``."""
    return f"0x{num:016x}"


class Chain:
    """Reads of the chain for the REST handlers."""

    def __init__(self, node: Node) -> None:
        self.node = node

    def head(self, request: web.Request) -> int:
        """The head block number the request asks for (default: the latest)."""
        raw = request.query.get("head", "")
        latest = self.node.height
        if raw in ("", "latest"):
            return latest
        if _NUM.fullmatch(raw):
            num = int(raw)
            if 0 <= num <= latest:
                return num
        elif _ID.fullmatch(raw):
            block = self.node.find_block(raw)
            if block is not None:
                return block.num
        raise RequestError(
            404, 50, "Head Not Found", f"there is no block {raw[:130]!r} in this node's chain"
        )

    def list_head(self, request: web.Request) -> int:
        """:meth:`head` for the lists, where a head that is neither a block id nor a
        block number is a malformed id (code 60), as Sawtooth's REST API checks it."""
        raw = request.query.get("head", "")
        if raw not in ("", "latest") and not (_NUM.fullmatch(raw) or _ID.fullmatch(raw)):
            raise invalid_id(raw, "block")
        return self.head(request)

    def block(self, num: int) -> CommitRecord | None:
        """The record of the batch block ``num`` holds (block 0: genesis, no batch)."""
        return self.node.committed.chain_record(num) if num >= 0 else None

    def batch_record(self, seq: int) -> CommitRecord | None:
        """The record of final status ``seq`` (a batch's or a transaction's ``block``)."""
        return self.node.committed.record(seq)

    def block_id(self, num: int) -> str:
        block = self.node.get_block(num)
        assert block is not None, f"no block {num}"
        return block.id

    def batches(self, record: CommitRecord) -> list[ParsedBatch]:
        """The batches a block holds, in block order."""
        batch = _committed(record)
        return [] if batch is None else [batch]

    def block_json(self, record: CommitRecord) -> dict[str, Any]:
        batches = self.batches(record)
        header = header_fields(record.header)
        return {
            "header": {
                # Sawtooth's REST API writes this uint64 as protobuf's JSON does: a string.
                "block_num": str(header.block_num),
                "previous_block_id": header.previous_block_id,
                "signer_public_key": header.signer_public_key,
                "batch_ids": list(header.batch_ids),
                "consensus": b64(header.consensus),
                "state_root_hash": header.state_root_hash,
            },
            "header_signature": record.signature,
            "batches": [batch_json(b) for b in batches],
        }

    def nums(self, head: int, first: int | None, reverse: bool) -> Iterator[int]:
        """Block numbers in list order up to ``head``, from ``first`` if given."""
        if reverse:
            return iter(range(first or 0, head + 1))
        return iter(range(head if first is None else first, -1, -1))


def _skip_to(items: Items, start: str | None) -> Items:
    """``items`` from the one with id ``start`` on (all of them if ``start`` is None)."""
    found = start is None
    for item_id, item in items:
        found = found or item_id == start
        if found:
            yield item_id, item


def add_chain_routes(app: web.Application, node: Node) -> None:
    chain = Chain(node)

    def guarded(
        handler: Callable[[web.Request], web.Response],
    ) -> Callable[[web.Request], Any]:
        async def run(request: web.Request) -> web.Response:
            try:
                return handler(request)
            except RequestError as exc:
                return exc.response

        return run

    def chain_page(
        request: web.Request,
        controls: Controls,
        head: int,
        items: Callable[[int | None, bool], Items],
        block_of: Callable[[str], int | None],
    ) -> web.Response:
        """A page of a list walked block by block: ``items(first_block, reverse)``
        lists from that block on; ``block_of(id)`` is the block holding an item."""
        reverse = is_reverse(request, "default")
        first: int | None = None
        if controls.start is not None:
            first = block_of(controls.start)
            if first is None or first > head:
                if next(items(None, reverse), None) is None:
                    first = None  # an empty list has no wrong start
                else:
                    raise paging_invalid(
                        f"'start' {controls.start[:130]!r} is in no block of this chain up "
                        "to its head"
                    )
        listed = _skip_to(items(first, reverse), None if first is None else controls.start)
        page = take(listed, controls.size())
        return respond(request, page, controls, chain.block_id(head))

    def filtered_page(
        request: web.Request,
        controls: Controls,
        head: int,
        found: list[tuple[str, dict[str, Any]]],
    ) -> web.Response:
        """A page of the items an ``id`` filter named, as found up to ``head``."""
        if is_reverse(request, "default"):
            found.reverse()
        page = page_of(found, controls, controls.size())
        return respond(request, page, controls, chain.block_id(head))

    def start_block(start: str) -> int | None:
        if _BLOCK_NUM.fullmatch(start):
            num = int(start, 16)
            return num if chain.block(num) is not None else None
        block = node.find_block(start) if _ID.fullmatch(start) else None
        return None if block is None else block.num

    def list_blocks(request: web.Request) -> web.Response:
        controls = paging_controls(request)
        head = chain.list_head(request)
        ids = filter_ids(request, "block")
        if ids is not None:
            found = []
            for wanted in ids:
                block = node.find_block(wanted)
                record = None if block is None or block.num > head else chain.block(block.num)
                if record is not None:
                    found.append((wanted, chain.block_json(record)))
            page = Page([item for _, item in found], "", "", 0)
            return respond(request, page, controls, chain.block_id(head), paged=False)
        reverse = is_reverse(request, "block_num")
        first: int | None = None
        if controls.start is not None:
            first = start_block(controls.start)
            if first is None or first > head:
                raise paging_invalid(
                    f"'start' {controls.start[:130]!r} is no block of this chain up to its "
                    "head: give a block number as paging.next_position writes it (0x and 16 "
                    "hex digits)"
                )

        def items() -> Items:
            for num in chain.nums(head, first, reverse):
                record = chain.block(num)
                if record is not None:
                    yield block_num_hex(num), chain.block_json(record)

        page = take(items(), controls.size())
        return respond(request, page, controls, chain.block_id(head))

    def get_block(request: web.Request) -> web.Response:
        wanted = check_id(request.match_info["block_id"], "block")
        block = node.find_block(wanted)
        record = None if block is None else chain.block(block.num)
        if record is None:
            raise RequestError(404, 70, "Block Not Found", f"there is no block {wanted}")
        return _one(request, chain.block_json(record))

    def batch_block(batch_id: str) -> int | None:
        if not _ID.fullmatch(batch_id):  # the store looks up ids as bytes
            return None
        stored = node.committed.final(batch_id)
        if stored is None or not isinstance(stored.status, str):
            return None
        record = chain.batch_record(stored.block)  # its final status: event number
        return None if record is None else record.block

    def batch_items(head: int) -> Callable[[int | None, bool], Items]:
        def items(first: int | None, reverse: bool) -> Items:
            for num in chain.nums(head, first, reverse):
                record = chain.block(num)
                batches = [] if record is None else chain.batches(record)
                for batch in reversed(batches) if reverse else batches:
                    yield batch.header_signature, batch_json(batch)

        return items

    def list_batches(request: web.Request) -> web.Response:
        controls = paging_controls(request)
        head = chain.list_head(request)
        ids = filter_ids(request, "batch")
        if ids is None:
            return chain_page(request, controls, head, batch_items(head), batch_block)
        found = []
        for wanted in ids:
            num = batch_block(wanted)
            record = None if num is None or num > head else chain.block(num)
            for batch in [] if record is None else chain.batches(record):
                if batch.header_signature == wanted:
                    found.append((wanted, batch_json(batch)))
        return filtered_page(request, controls, head, found)

    def get_batch(request: web.Request) -> web.Response:
        wanted = check_id(request.match_info["batch_id"], "batch")
        num = batch_block(wanted)
        record = None if num is None else chain.block(num)
        for batch in [] if record is None else chain.batches(record):
            if batch.header_signature == wanted:
                return _one(request, batch_json(batch))
        raise RequestError(404, 71, "Batch Not Found", f"there is no batch {wanted} in the chain")

    def txn_block(tx_id: str) -> int | None:
        if not _ID.fullmatch(tx_id):
            return None
        where = node.committed.txn(tx_id)
        record = None if where is None else chain.batch_record(where[0])
        return None if record is None else record.block

    def transaction(tx_id: str, head: int) -> dict[str, Any] | None:
        num = txn_block(tx_id)
        record = None if num is None or num > head else chain.block(num)
        for batch in [] if record is None else chain.batches(record):
            for tx in transaction_json(batch):
                if tx["header_signature"] == tx_id:
                    return tx
        return None

    def transaction_items(head: int) -> Callable[[int | None, bool], Items]:
        def items(first: int | None, reverse: bool) -> Items:
            for num in chain.nums(head, first, reverse):
                record = chain.block(num)
                txs = [
                    tx
                    for batch in ([] if record is None else chain.batches(record))
                    for tx in transaction_json(batch)
                ]
                for tx in reversed(txs) if reverse else txs:
                    yield tx["header_signature"], tx

        return items

    def list_transactions(request: web.Request) -> web.Response:
        controls = paging_controls(request)
        head = chain.list_head(request)
        ids = filter_ids(request, "transaction")
        if ids is None:
            return chain_page(request, controls, head, transaction_items(head), txn_block)
        found = []
        for wanted in ids:
            tx = transaction(wanted, head)
            if tx is not None:
                found.append((wanted, tx))
        return filtered_page(request, controls, head, found)

    def get_transaction(request: web.Request) -> web.Response:
        wanted = check_id(request.match_info["transaction_id"], "transaction")
        found = transaction(wanted, node.height)
        if found is None:
            raise RequestError(
                404, 72, "Transaction Not Found", f"there is no transaction {wanted} in the chain"
            )
        return _one(request, found)

    def receipts(ids: list[str]) -> list[dict[str, Any]]:
        data = []
        for tx_id in ids:
            check_id(tx_id, "transaction")
        for tx_id in ids:
            where = node.committed.txn(tx_id)
            record = None if where is None else chain.batch_record(where[0])
            batch = None if record is None else _committed(record)
            if batch is None or record is None or where is None:
                raise RequestError(
                    404,
                    80,
                    "Transaction Receipt Not Found",
                    f"there is no receipt for transaction {tx_id}: it is not committed",
                )
            # An output is an address or a namespace prefix: either begins what it covers.
            outputs = tuple(batch.transactions[where[1]].header.outputs)
            data.append(
                {
                    "id": tx_id,
                    "state_changes": [
                        {"type": "SET", "address": a, "value": b64(v)}
                        for a, v in record.writes
                        if a.startswith(outputs)
                    ],
                    "events": [],
                    "data": [],
                }
            )
        return cast(list[dict[str, Any]], drop_empty(data))

    def too_many(count: int) -> RequestError:
        return RequestError(
            400,
            82,
            "Bad Receipts Request",
            f"{count} transaction ids in one request; ask for at most {MAX_LIMIT} at a time",
        )

    def get_receipts(request: web.Request) -> web.Response:
        ids = filter_ids(request, "transaction")
        if not ids:
            raise RequestError(
                400,
                83,
                "Id Query Invalid or Missing",
                "Requests for receipts need an 'id' query parameter with a comma-separated "
                "list of at least one transaction id",
            )
        if len(ids) > MAX_LIMIT:
            raise too_many(len(ids))
        return web.json_response({"data": receipts(ids), "link": build_url(request)})

    async def post_receipts(request: web.Request) -> web.Response:
        if request.content_type != "application/json":
            return RequestError(
                400,
                81,
                "Wrong Content Type",
                "Requests for receipts sent as a POST must have a 'Content-Type' header of "
                "'application/json'",
            ).response
        try:
            ids = jsontext.loads(await read_body(request, request.client_max_size))
        except ValueError:
            ids = None
        if not isinstance(ids, list) or not ids or not all(isinstance(i, str) for i in ids):
            return RequestError(
                400,
                82,
                "Bad Receipts Request",
                "The body must be a JSON array of at least one transaction id (strings)",
            ).response
        try:
            if len(ids) > MAX_LIMIT:
                raise too_many(len(ids))
            return web.json_response({"data": receipts(ids)})
        except RequestError as exc:
            return exc.response

    def status(request: web.Request) -> web.Response:
        return web.json_response(
            {"data": {"endpoint": "", "peers": []}, "link": build_url(request)}
        )

    def peers(request: web.Request) -> web.Response:
        return web.json_response({"data": [], "link": build_url(request)})

    app.router.add_get("/blocks", guarded(list_blocks))
    app.router.add_get("/blocks/{block_id}", guarded(get_block))
    app.router.add_get("/batches", guarded(list_batches))
    app.router.add_get("/batches/{batch_id}", guarded(get_batch))
    app.router.add_get("/transactions", guarded(list_transactions))
    app.router.add_get("/transactions/{transaction_id}", guarded(get_transaction))
    app.router.add_get("/receipts", guarded(get_receipts))
    app.router.add_post("/receipts", post_receipts)
    app.router.add_get("/status", guarded(status))
    app.router.add_get("/peers", guarded(peers))


def _one(request: web.Request, item: dict[str, Any]) -> web.Response:
    """One block, batch or transaction: ``data`` and ``link``, no ``head``, as Sawtooth's."""
    return web.json_response({"data": item, "link": build_url(request)})

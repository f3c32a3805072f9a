"""Sawtooth's read endpoints over the node's chain of blocks (``openapi.yaml``).

A block is one final status (see :mod:`ledgerq.node.blocks`): a COMMITTED
batch's block holds that batch; an INVALID batch's block holds none (Sawtooth
leaves invalid batches out of its blocks; the node keeps the block so block
numbers stay those of ``/events`` and ``/subscriptions``). Everything is read
from the node's committed view (memory for what is not written yet, else the
store), never from a full scan.

* ``GET /blocks``, ``/batches``, ``/transactions``: newest first from
  ``head`` (default: the latest block; a block id or number), ``reverse``
  for oldest first; ``start`` (an id, inclusive) and ``limit`` (default 100;
  above 1000, pages of 1000, as Sawtooth's validator gives) page; ``paging``
  has ``start``, ``limit``, ``next_position`` and ``next`` (a link to the
  next page) when there is more.
* ``GET /blocks/{id}``, ``/batches/{id}``, ``/transactions/{id}``: one item,
  404 (codes 70, 71, 72) when the chain does not hold it.
* ``GET /receipts?id=a,b`` and ``POST /receipts`` (JSON array of ids): one
  receipt per committed transaction: ``state_changes`` are the ``SET`` of
  every address among the transaction's outputs that its batch wrote (the
  batch's final value; the node executes a batch as one candidate), no
  events, no data. 404 (code 80) if one is not committed.
* ``GET /status``: ``{"endpoint": "", "peers": []}``; ``GET /peers``: ``[]``:
  the node has no peers.

Errors use Sawtooth's codes: 50 (head not found), 53/54 (a ``limit`` that is
not a positive integer, or bad paging), 60 (malformed id), 81-83 (receipts
requests).
"""

from __future__ import annotations

import base64
import re
from collections.abc import Callable, Iterator
from typing import Any

from aiohttp import web

from ledgerq import jsontext
from ledgerq.codec import ParsedBatch, decode_batch
from ledgerq.node.blocks import NULL_BLOCK_ID
from ledgerq.node.disk import CommitRecord
from ledgerq.node.node import Node

_ID = re.compile(r"[0-9a-f]{128}")
# ASCII digits only: str.isdigit() also takes "²", and int() refuses it (and
# strings past 4,300 digits), which made such a head a 500.
_NUM = re.compile(r"[0-9]{1,20}")
DEFAULT_LIMIT = 100
MAX_LIMIT = 1_000


class RequestError(Exception):
    def __init__(self, status: int, code: int, title: str, message: str) -> None:
        super().__init__(message)
        self.response = web.json_response(
            {"error": {"code": code, "title": title, "message": message}}, status=status
        )


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def batch_json(batch: ParsedBatch) -> dict[str, Any]:
    return {
        "header": {
            "signer_public_key": batch.signer_public_key,
            "transaction_ids": list(batch.transaction_ids),
        },
        "header_signature": batch.header_signature,
        "trace": batch.trace,
        "transactions": [
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
        ],
    }


def _committed(record: CommitRecord) -> ParsedBatch | None:
    if not isinstance(record.status, str) or not record.batch:
        return None
    return decode_batch(record.batch, verify=False)


class Chain:
    """Reads of the chain for the REST handlers."""

    def __init__(self, node: Node) -> None:
        self.node = node

    def head(self, request: web.Request) -> int:
        """The head block number the request asks for (default: the latest)."""
        raw = request.query.get("head", "")
        latest = self.node.ledger.event_seq
        if raw in ("", "latest"):
            return latest
        if _NUM.fullmatch(raw):
            num = int(raw)
            if 0 < num <= latest:
                return num
        elif _ID.fullmatch(raw):
            block = self.node.find_block(raw)
            if block is not None:
                return block.num
        raise RequestError(
            404, 50, "Head Not Found", f"there is no block {raw[:130]!r} in this node's chain"
        )

    def block(self, num: int) -> CommitRecord | None:
        return self.node.committed.block(num) if num > 0 else None

    def block_id(self, num: int) -> str:
        block = self.node.get_block(num)
        return NULL_BLOCK_ID if block is None else block.id

    def block_json(self, record: CommitRecord) -> dict[str, Any]:
        batch = _committed(record)
        block = self.node.get_block(record.num)
        assert block is not None
        return {
            "header": {
                "block_num": record.num,
                "previous_block_id": block.previous_id,
                "signer_public_key": "",
                "batch_ids": [] if batch is None else [batch.header_signature],
                "consensus": "",
                "state_root_hash": "",
            },
            "header_signature": block.id,
            "batches": [] if batch is None else [batch_json(batch)],
        }

    def nums(self, head: int, start: int | None, reverse: bool) -> Iterator[int]:
        if reverse:
            return iter(range(start or 1, head + 1))
        return iter(range(head if start is None else min(start, head), 0, -1))


def _paging(request: web.Request) -> tuple[str | None, int, bool]:
    raw = request.query.get("limit", str(DEFAULT_LIMIT))
    try:
        limit = int(raw)
    except ValueError:
        limit = 0
    if limit <= 0:
        raise RequestError(400, 53, "Invalid Count Query", "'limit' must be a positive integer")
    limit = min(limit, MAX_LIMIT)  # as Sawtooth's validator: a larger limit gets full pages
    start = request.query.get("start") or None
    reverse = request.query.get("reverse", "false").lower() not in ("false", "0", "no")
    return start, limit, reverse


def _page(
    request: web.Request,
    chain: Chain,
    items: Iterator[tuple[str, dict[str, Any]]],
    head: int,
    start: str | None,
    limit: int,
) -> web.Response:
    data: list[dict[str, Any]] = []
    paging: dict[str, Any] = {"limit": limit}
    if start is not None:
        paging["start"] = start
    for item_id, item in items:
        if len(data) == limit:
            paging["next_position"] = item_id
            paging["next"] = str(request.url.update_query(start=item_id))
            break
        data.append(item)
    return web.json_response(
        {"data": data, "head": chain.block_id(head), "link": str(request.url), "paging": paging}
    )


def _check_id(value: str, what: str) -> None:
    if not _ID.fullmatch(value):
        raise RequestError(
            400,
            60,
            "Invalid Resource Id",
            f"{value[:130]!r} is not a {what} id: ids are 128 lowercase hex characters",
        )


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

    def start_block(start: str | None) -> int | None:
        if start is None:
            return None
        _check_id(start, "block")
        block = node.find_block(start)
        if block is None:
            raise RequestError(400, 54, "Invalid Paging Query", f"no block {start} to start at")
        return block.num

    def list_blocks(request: web.Request) -> web.Response:
        head = chain.head(request)
        start, limit, reverse = _paging(request)

        def items() -> Iterator[tuple[str, dict[str, Any]]]:
            for num in chain.nums(head, start_block(start), reverse):
                record = chain.block(num)
                if record is not None:
                    yield chain.block_id(num), chain.block_json(record)

        return _page(request, chain, items(), head, start, limit)

    def get_block(request: web.Request) -> web.Response:
        wanted = request.match_info["block_id"]
        _check_id(wanted, "block")
        block = node.find_block(wanted)
        record = None if block is None else chain.block(block.num)
        if record is None:
            raise RequestError(404, 70, "Block Not Found", f"there is no block {wanted}")
        return _one(request, chain, chain.block_json(record))

    def batch_block(batch_id: str) -> CommitRecord | None:
        stored = node.committed.final(batch_id)
        if stored is None or not isinstance(stored.status, str):
            return None
        return chain.block(stored.block)

    def list_batches(request: web.Request) -> web.Response:
        head = chain.head(request)
        start, limit, reverse = _paging(request)
        first = None
        if start is not None:
            _check_id(start, "batch")
            record = batch_block(start)
            if record is None:
                raise RequestError(400, 54, "Invalid Paging Query", f"no batch {start} to start at")
            first = record.num

        def items() -> Iterator[tuple[str, dict[str, Any]]]:
            for num in chain.nums(head, first, reverse):
                record = chain.block(num)
                batch = None if record is None else _committed(record)
                if batch is not None:
                    yield batch.header_signature, batch_json(batch)

        return _page(request, chain, items(), head, start, limit)

    def get_batch(request: web.Request) -> web.Response:
        wanted = request.match_info["batch_id"]
        _check_id(wanted, "batch")
        record = batch_block(wanted)
        batch = None if record is None else _committed(record)
        if batch is None:
            raise RequestError(
                404, 71, "Batch Not Found", f"there is no batch {wanted} in the chain"
            )
        return _one(request, chain, batch_json(batch))

    def transaction(tx_id: str) -> tuple[int, dict[str, Any]] | None:
        where = node.committed.txn(tx_id)
        record = None if where is None else chain.block(where[0])
        batch = None if record is None else _committed(record)
        if batch is None or where is None:
            return None
        return where[0], batch_json(batch)["transactions"][where[1]]

    def list_transactions(request: web.Request) -> web.Response:
        head = chain.head(request)
        start, limit, reverse = _paging(request)
        first: tuple[int, int] | None = None
        if start is not None:
            _check_id(start, "transaction")
            where = node.committed.txn(start)
            if where is None:
                raise RequestError(
                    400, 54, "Invalid Paging Query", f"no transaction {start} to start at"
                )
            first = where

        def items() -> Iterator[tuple[str, dict[str, Any]]]:
            for num in chain.nums(head, None if first is None else first[0], reverse):
                record = chain.block(num)
                batch = None if record is None else _committed(record)
                if batch is None:
                    continue
                txs = batch_json(batch)["transactions"]
                order = list(enumerate(txs)) if reverse else list(enumerate(txs))[::-1]
                for index, tx in order:
                    if first is not None and num == first[0] and _before(index, first[1], reverse):
                        continue
                    yield tx["header_signature"], tx

        return _page(request, chain, items(), head, start, limit)

    def get_transaction(request: web.Request) -> web.Response:
        wanted = request.match_info["transaction_id"]
        _check_id(wanted, "transaction")
        found = transaction(wanted)
        if found is None:
            raise RequestError(
                404, 72, "Transaction Not Found", f"there is no transaction {wanted} in the chain"
            )
        return _one(request, chain, found[1])

    def receipts(request: web.Request, ids: list[str]) -> web.Response:
        data = []
        for tx_id in ids:
            _check_id(tx_id, "transaction")
            where = node.committed.txn(tx_id)
            record = None if where is None else chain.block(where[0])
            batch = None if record is None else _committed(record)
            if batch is None or record is None or where is None:
                raise RequestError(
                    404,
                    80,
                    "Transaction Receipt Not Found",
                    f"there is no receipt for transaction {tx_id}: it is not committed",
                )
            outputs = set(batch.transactions[where[1]].header.outputs)
            data.append(
                {
                    "transaction_id": tx_id,
                    "state_changes": [
                        {"type": "SET", "address": a, "value": b64(v)}
                        for a, v in record.writes
                        if a in outputs
                    ],
                    "events": [],
                    "data": [],
                }
            )
        return web.json_response({"data": data, "link": str(request.url)})

    def get_receipts(request: web.Request) -> web.Response:
        ids = [i for i in request.query.get("id", "").split(",") if i]
        if not ids:
            raise RequestError(
                400,
                83,
                "Id Query Invalid or Missing",
                "Requests for receipts need an 'id' query parameter with a comma-separated "
                "list of at least one transaction id",
            )
        return receipts(request, ids[:MAX_LIMIT])

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
            ids = jsontext.loads(await request.read())
        except ValueError:
            ids = None
        if (
            not isinstance(ids, list)
            or not ids
            or len(ids) > MAX_LIMIT
            or not all(isinstance(i, str) for i in ids)
        ):
            return RequestError(
                400,
                82,
                "Bad Receipts Request",
                f"The body must be a JSON array of 1 to {MAX_LIMIT} transaction ids",
            ).response
        try:
            return receipts(request, ids)
        except RequestError as exc:
            return exc.response

    def status(request: web.Request) -> web.Response:
        return web.json_response({"data": {"endpoint": "", "peers": []}, "link": str(request.url)})

    def peers(request: web.Request) -> web.Response:
        return web.json_response({"data": [], "link": str(request.url)})

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


def _before(index: int, start: int, reverse: bool) -> bool:
    """Whether a transaction of the start block comes before the start one in page order."""
    return index < start if reverse else index > start


def _one(request: web.Request, chain: Chain, item: dict[str, Any]) -> web.Response:
    return web.json_response(
        {
            "data": item,
            "head": chain.block_id(chain.node.ledger.event_seq),
            "link": str(request.url),
        }
    )

"""Sawtooth's Merkle-radix state root, kept incrementally over the node's store.

The root is the one a Sawtooth validator computes for the same state (its
``state/merkle.py``): a radix tree whose tokens are the address's bytes (two
hex characters each, 35 levels); every node is the canonical CBOR map
``{"c": {token: child hash, ...}, "v": value}`` (keys sorted, ``v`` null on
inner nodes, on a leaf the CBOR byte string of the stored value), and its
hash is the first 64 hex digits of the SHA-512 of that encoding. The empty
state's root is the hash of ``{"c": {}, "v": null}``.

What is kept: only the nodes whose subtree holds two leaves or more (and the
root), each as its children's entries; a child that holds a single leaf
carries that leaf's address and leaf hash in its parent's entry, so the
chain of single-child nodes above a leaf (most of its 35 levels) is never
stored: its hashes are computed again from the leaf hash when it changes.
Updating one address costs one SHA-512 per level (35 small ones along the
leaf's chain, and one per stored node on its path, whose encodings list all
their children), reads only stored nodes (no state), and changes the nodes on
its path. Addresses are never deleted (the node's families only set).

:class:`MerkleTree` applies a block's writes and answers its root; the nodes it
changed since :meth:`~MerkleTree.take_changes` go to the store with the
commits that made them, so the stored tree is always that of the stored state.
"""

from __future__ import annotations

from binascii import hexlify as _hexlify
from bisect import bisect_left
from collections.abc import Callable, Iterable
from hashlib import sha512 as _sha512

#: Reads a stored node's encoding by path (the address's first bytes), or None.
NodeReader = Callable[[bytes], "bytes | None"]

_TOKENS = [f"{i:02x}".encode() for i in range(256)]
_NODE_START = b"\xa2\x61c"  # map of 2: "c" ...
_INNER_END = b"\x61v\xf6"  # "v": null
_LEAF_START = b"\xa2\x61c\xa0\x61v"  # {"c": {}, "v": ...
_ENTRY = b"\x62"  # a 2-character text string: the token
_HASH = b"\x78\x40"  # a 64-character text string: the child's hash
_CHAIN_START = _NODE_START + b"\xa1" + _ENTRY  # one child
ADDRESS_BYTES = 35

_ENTRY_BYTES = 69  # token (3 bytes) and hash (66 bytes) as CBOR text strings
_LEAF_BYTES = ADDRESS_BYTES + 64  # a single leaf below a child: its address and leaf hash
_UNHASHED = b"0" * 64  # a child's hash until the block's hashes are computed


def _hash(data: bytes) -> bytes:
    """The first 64 hex digits of the SHA-512 of ``data``, as ASCII bytes."""
    return _hexlify(_sha512(data).digest()[:32])


def _head(major: int, n: int) -> bytes:
    """A CBOR head: major type and length."""
    if n < 24:
        return bytes([major << 5 | n])
    if n < 256:
        return bytes([major << 5 | 24, n])
    if n < 65536:
        return bytes([major << 5 | 25]) + n.to_bytes(2, "big")
    if n < 2**32:
        return bytes([major << 5 | 26]) + n.to_bytes(4, "big")
    return bytes([major << 5 | 27]) + n.to_bytes(8, "big")


def leaf_hash(value: bytes) -> bytes:
    """The hash of the leaf holding ``value`` (``v`` is the CBOR of the value)."""
    inner = _head(2, len(value)) + value
    return _hash(_LEAF_START + _head(2, len(inner)) + inner)


def chain_hash(address: bytes, depth: int, leaf: bytes) -> bytes:
    """The hash of the node at ``depth`` whose subtree holds only this leaf."""
    h = leaf
    for k in range(ADDRESS_BYTES - 1, depth - 1, -1):
        h = _hash(_CHAIN_START + _TOKENS[address[k]] + _HASH + h + _INNER_END)
    return h


class _Node:
    """A stored node: its children's CBOR entries in token order, kept encoded so
    that hashing it is one copy; and, for each child that is a single leaf, that
    leaf's address and leaf hash (kept packed too: a node is read and written
    whole at every change below it)."""

    __slots__ = ("entries", "lblob", "ltokens", "tokens")

    def __init__(self, data: bytes = b"") -> None:
        n = int.from_bytes(data[:2], "big")
        end = 2 + n + n * _ENTRY_BYTES
        self.tokens = bytearray(data[2 : 2 + n])
        self.entries = bytearray(data[2 + n : end])
        k = int.from_bytes(data[end : end + 2], "big")
        self.ltokens = bytearray(data[end + 2 : end + 2 + k])
        self.lblob = bytearray(data[end + 2 + k :])

    def set(self, token: int, digest: bytes, leaf: tuple[bytes, bytes] | None = None) -> None:
        """Set a child's hash (``leaf``: the single leaf it holds, if so)."""
        tokens = self.tokens
        i = bisect_left(tokens, token)
        at = i * _ENTRY_BYTES
        if i < len(tokens) and tokens[i] == token:
            self.entries[at + 5 : at + _ENTRY_BYTES] = digest
        else:
            tokens.insert(i, token)
            self.entries[at:at] = _ENTRY + _TOKENS[token] + _HASH + digest
        if leaf is None:
            self.drop_leaf(token)
        else:
            self.set_leaf(token, leaf[0], leaf[1])

    def has(self, token: int) -> bool:
        i = bisect_left(self.tokens, token)
        return i < len(self.tokens) and self.tokens[i] == token

    def leaf(self, token: int) -> tuple[bytes, bytes] | None:
        i = self.ltokens.find(token)
        if i < 0:
            return None
        at = i * _LEAF_BYTES
        blob = self.lblob
        middle = at + ADDRESS_BYTES
        return bytes(blob[at:middle]), bytes(blob[middle : at + _LEAF_BYTES])

    def set_leaf(self, token: int, address: bytes, leaf: bytes) -> None:
        i = self.ltokens.find(token)
        if i < 0:
            self.ltokens.append(token)
            self.lblob += address + leaf
        else:
            at = i * _LEAF_BYTES
            self.lblob[at : at + _LEAF_BYTES] = address + leaf

    def drop_leaf(self, token: int) -> None:
        i = self.ltokens.find(token)
        if i >= 0:
            del self.ltokens[i]
            del self.lblob[i * _LEAF_BYTES : (i + 1) * _LEAF_BYTES]

    def encode(self) -> bytes:
        return _NODE_START + _head(5, len(self.tokens)) + self.entries + _INNER_END

    def pack(self) -> bytes:
        """Stored form: child count, tokens, entries; leaf count, their tokens, and
        each one's address and leaf hash."""
        return b"".join(
            (
                len(self.tokens).to_bytes(2, "big"),
                self.tokens,
                self.entries,
                len(self.ltokens).to_bytes(2, "big"),
                self.ltokens,
                self.lblob,
            )
        )


EMPTY_ROOT = _hash(_Node().encode()).decode()


class MerkleTree:
    """The state root over stored nodes, updated a block at a time."""

    def __init__(self, nodes: NodeReader) -> None:
        self._read = nodes
        #: Nodes read or changed since the last take_changes, by path.
        self._dirty: dict[bytes, _Node] = {}
        self._changed: set[bytes] = set()
        root = self._node(b"")
        assert root is not None
        self.root = _hash(root.encode()).decode()

    def _node(self, path: bytes) -> _Node | None:
        node = self._dirty.get(path)
        if node is None:
            data = self._read(path)
            if data is None:
                if path:
                    return None
                node = _Node()  # the root always exists
            else:
                node = _Node(data)
            self._dirty[path] = node
        return node

    def apply(self, writes: Iterable[tuple[str, bytes]]) -> str:
        """Set each address to its value, in order; the new root (64 hex digits)."""
        touched: set[bytes] = set()
        leaves: dict[tuple[bytes, int], bytes] = {}  # (node, token) -> the leaf's address
        values: dict[bytes, bytes] = {}  # leaf hashes of the leaves to place
        dirty = self._dirty
        for address_hex, value in writes:
            address = bytes.fromhex(address_hex)
            values[address] = leaf_hash(value)
            path = b""
            node = self._node(path)
            assert node is not None
            depth = 0
            while True:
                touched.add(path)
                token = address[depth]
                alone = node.leaf(token)
                if alone is None and node.has(token):  # a stored node: go down
                    path = address[: depth + 1]
                    child = self._node(path)
                    assert child is not None, f"stored node {path.hex()} is missing"
                    node, depth = child, depth + 1
                    continue
                if alone is None or alone[0] == address:
                    node.set_leaf(token, address, _UNHASHED)  # hashed once the block is applied
                    leaves[(path, token)] = address
                    break
                # Another leaf is alone below this token: both now share a subtree,
                # stored from here down to where their addresses part.
                other = alone[0]
                if other not in values:
                    values[other] = alone[1]
                split = depth + 1
                while address[split] == other[split]:
                    split += 1
                node.set(token, _UNHASHED)  # now a stored node, hashed below
                for k in range(depth + 1, split + 1):
                    dirty[address[:k]] = inner = _Node()
                    if k < split:
                        inner.set(address[k], _UNHASHED)
                    touched.add(address[:k])
                below_path = address[:split]
                below = dirty[below_path]
                for leaf_address in (other, address):
                    below.set_leaf(leaf_address[split], leaf_address, _UNHASHED)
                    leaves[(below_path, leaf_address[split])] = leaf_address
                break
        for (path, token), address in leaves.items():
            node = dirty[path]
            alone = node.leaf(token)
            if alone is None or alone[0] != address:
                continue  # moved further down by a later write of the block
            leaf = values[address]
            node.set(token, chain_hash(address, len(path) + 1, leaf), (address, leaf))
        self._changed |= touched
        for path in sorted(touched, key=len, reverse=True):
            digest = _hash(dirty[path].encode())
            if path:
                dirty[path[:-1]].set(path[-1], digest)
            else:
                self.root = digest.decode()
        return self.root

    def take_changes(self) -> dict[bytes, bytes]:
        """The nodes changed since the last call, packed, by path (for the store)."""
        dirty = self._dirty
        changes = {path: dirty[path].pack() for path in self._changed}
        self._changed = set()
        dirty.clear()
        return changes

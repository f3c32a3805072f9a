"""The state root: Sawtooth's Merkle-radix tree, kept incrementally, against the
tree built whole from its definition (every node the canonical CBOR of
``{"c": children, "v": value}``, hashed with SHA-512 cut to 64 hex digits)."""

from __future__ import annotations

import hashlib

import cbor2
from hypothesis import given, settings
from hypothesis import strategies as st

from ledgerq.node.merkle import EMPTY_ROOT, MerkleTree


def reference_root(state: dict[str, bytes]) -> str:
    def node_hash(path: str, addresses: list[str]) -> str:
        if len(path) == 70:
            node = {"c": {}, "v": cbor2.dumps(state[path])}
        else:
            groups: dict[str, list[str]] = {}
            for address in addresses:
                groups.setdefault(address[len(path) : len(path) + 2], []).append(address)
            children = {token: node_hash(path + token, group) for token, group in groups.items()}
            node = {"c": children, "v": None}
        return hashlib.sha512(cbor2.dumps(node, canonical=True)).hexdigest()[:64]

    return node_hash("", list(state))


def test_the_empty_state_root() -> None:
    assert EMPTY_ROOT == reference_root({}) == MerkleTree({}.get).root


# Few distinct characters: addresses share long prefixes, so leaves split deep.
_address = st.text("01", min_size=6, max_size=6).map(lambda s: "1cf126" + s * 10 + "0" * 4)
_blocks = st.lists(
    st.lists(
        st.tuples(_address | st.sampled_from(["00" * 35]), st.binary(max_size=40)), min_size=1
    ),
    min_size=1,
    max_size=12,
)


@settings(max_examples=80, deadline=None)
@given(_blocks, st.lists(st.booleans(), min_size=12, max_size=12))
def test_the_root_after_each_block_is_the_root_of_the_state(
    blocks: list[list[tuple[str, bytes]]], stores: list[bool]
) -> None:
    stored: dict[bytes, bytes] = {}
    tree = MerkleTree(stored.get)
    state: dict[str, bytes] = {}
    for writes, store_now in zip(blocks, stores, strict=False):
        state.update(writes)
        root = tree.apply(writes)
        assert root == reference_root(state)
        if store_now:  # the nodes go to the store; a tree reading them goes on alike
            stored.update(tree.take_changes())
            tree = MerkleTree(stored.get)
            assert tree.root == root


def test_many_random_addresses() -> None:
    stored: dict[bytes, bytes] = {}
    tree = MerkleTree(stored.get)
    state: dict[str, bytes] = {}
    for block in range(40):
        writes = [
            (
                "1cf126" + hashlib.sha512(f"{block}-{i}".encode()).hexdigest()[-64:],
                f"{block}".encode(),
            )
            for i in range(25)
        ]
        state.update(writes)
        tree.apply(writes)
        stored.update(tree.take_changes())
    assert tree.root == reference_root(state)

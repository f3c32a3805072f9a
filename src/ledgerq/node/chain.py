"""The node's chain of blocks: genesis, block headers, the node's signing key.

* **Blocks.** Block 0 is the genesis block, made when a node first opens its
  store: no batches, the state root of the state it starts with (empty for
  a new node). Then each COMMITTED batch is a block of its own, numbered
  1, 2, 3, ...; an INVALID batch is in no block.
* **Headers** are Sawtooth's ``BlockHeader``: ``block_num``,
  ``previous_block_id`` (block 0's is ``0000000000000000``, Sawtooth's null
  block id), ``signer_public_key`` (the node's key), ``batch_ids``,
  ``consensus`` and ``state_root_hash`` (the Merkle-radix root of the state
  after the block, :mod:`ledgerq.node.merkle`). A block's id is the
  signature of its serialized header by the node's key (secp256k1, as the
  codec signs batches), so headers and ids are deterministic: a restart that
  replays the journal makes the same blocks.
* **Consensus.** The node is the only publisher of its chain: nobody votes
  and no other node checks. ``consensus`` says so: :data:`CONSENSUS`
  (``Genesis`` on block 0, as Sawtooth's genesis block).
* **The key** is ``validator.priv`` in the data directory (64 hex digits,
  as Sawtooth's key files), made at first start (mode 0600); a node without a
  data directory signs with a key of its own run.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from ledgerq.codec import block_pb2
from ledgerq.codec.signing import Signer
from ledgerq.errors import NodeDataError
from ledgerq.node.disk import CommitRecord, Store
from ledgerq.node.merkle import MerkleTree, NodeReader
from ledgerq.node.ordering.messages import KVSDatum, KVSKey

NULL_BLOCK_ID = "0" * 16
#: ``consensus`` of the node's blocks: one node publishes, nobody votes.
CONSENSUS = b"ledgerq-single-node"
GENESIS_CONSENSUS = b"Genesis"
KEY_FILE = "validator.priv"


def load_or_create_key(data_dir: Path | None) -> Signer:
    """The node's signing key, made at first start."""
    if data_dir is None:
        return Signer.generate()
    path = data_dir / KEY_FILE
    try:
        return Signer.from_hex(path.read_text())
    except FileNotFoundError:
        pass
    except ValueError as exc:
        raise NodeDataError(f"the node's key {path} is unreadable ({exc})") from exc
    signer = Signer.generate()
    temporary = path.with_suffix(".tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, (signer.private_key_hex + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temporary, path)
    directory = os.open(data_dir, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
    return signer


def header_fields(header: bytes) -> block_pb2.BlockHeader:
    parsed = block_pb2.BlockHeader()
    parsed.ParseFromString(header)
    return parsed


class Sealer:
    """Makes the chain's blocks: state root, header and signature, in order."""

    def __init__(self, signer: Signer, nodes: NodeReader, previous: str) -> None:
        self.signer = signer
        self.tree = MerkleTree(nodes)
        #: The id of the latest block.
        self.previous = previous

    def _sign(
        self, num: int, batch_ids: Sequence[str], consensus: bytes, previous: str
    ) -> tuple[bytes, str]:
        header = block_pb2.BlockHeader(
            block_num=num,
            previous_block_id=previous,
            signer_public_key=self.signer.public_key,
            batch_ids=batch_ids,
            consensus=consensus,
            state_root_hash=self.tree.root,
        ).SerializeToString()
        signature = self.signer.sign(header)
        self.previous = signature
        return header, signature

    def genesis(self) -> tuple[bytes, str]:
        """Block 0's header and id, over the state the tree holds."""
        return self._sign(0, (), GENESIS_CONSENSUS, NULL_BLOCK_ID)

    def seal(
        self, num: int, batch_id: str, writes: Sequence[tuple[KVSKey, KVSDatum]]
    ) -> tuple[bytes, str]:
        """Block ``num``, holding one batch that wrote ``writes``: header and id."""
        self.tree.apply(writes)
        return self._sign(num, (batch_id,), CONSENSUS, self.previous)

    def take_changes(self) -> dict[bytes, bytes]:
        """The tree's nodes changed since the last call (to store with the blocks)."""
        return self.tree.take_changes()


#: Records of the final-status log sealed per store transaction (see seal_store).
SEAL_CHUNK = 1_000


def seal_store(store: Store, key: Signer) -> Sealer:
    """Make the genesis block, and seal the blocks a store holds without headers.

    A new store has no blocks: the genesis block's state is what the store
    holds (nothing, or an imported snapshot's). A store upgraded from format 1
    has blocks without headers: its genesis state is what no block wrote (an
    imported snapshot's entries), then each block is sealed in commit order,
    its state root computed from its writes, in transactions of
    :data:`SEAL_CHUNK` records. The genesis block is written last, with the
    last of them: a crash before it starts the sealing again from scratch.
    """
    store.clear_merkle()
    written: set[str] = set()
    if store.meta().height:
        for record in store.blocks_from(1):
            if record.block:
                written.update(address for address, _ in record.writes)
    sealer = Sealer(key, store.get_node, NULL_BLOCK_ID)
    start = ""
    while True:
        page = store.state_page("", start, SEAL_CHUNK + 1)
        entries = [(a, v) for a, v in page[:SEAL_CHUNK] if a not in written]
        if entries:
            sealer.tree.apply(entries)
            store.reseal([], sealer.take_changes(), None, entries)
        if len(page) <= SEAL_CHUNK:
            break
        start = page[-1][0]
    genesis = sealer.genesis()
    chunk: list[CommitRecord] = []
    for record in store.blocks_from(1):
        if record.block:
            header, signature = sealer.seal(record.block, record.batch_id, record.writes)
            record = record._replace(header=header, signature=signature)
        chunk.append(record)
        if len(chunk) >= SEAL_CHUNK:
            store.reseal(chunk, sealer.take_changes(), None)
            chunk = []
    store.reseal(chunk, sealer.take_changes(), genesis)
    return sealer

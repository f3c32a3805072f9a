"""The messages the node's engines exchange, named as in the Anoma V1 specs.

Every message is a frozen dataclass; engines communicate only through them.
Deviations from the spec, each for a stated reason:

* :class:`TxFingerprint` has no ``collector_id`` (V1 has a single worker) and
  no ``last`` flag (our worker assigns transaction numbers on arrival, before
  it knows which one closes the batch).
* :class:`KVSLockAcquired` answers one :class:`KVSAcquireLock` as a whole (the
  spec sends one per key; the lock request is all-or-nothing per shard anyway).
* :class:`TransactionAck` also carries the fingerprint, because our worker
  assigns it immediately, and ``duplicate`` when the request was disregarded.
* :class:`ExecutorFinished` carries the execution summary so the worker can
  keep the log that :class:`RequestLogs` asks for.
* Key prefixes (Sawtooth's namespace prefixes): a :class:`TransactionLabel`
  may name prefixes it reads under (lazily) and writes under (may-writes),
  each covering every key that begins with it. :class:`KVSAcquireLock`
  carries them to every shard (the keys under a prefix are spread over all
  of them), and one :class:`KVSPrefixDone` per shard ends them, carrying the
  values written under them at keys that shard owns. V1 labels name keys
  only; a prefix is what a Sawtooth transaction may declare.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple, TypeAlias

#: A key of the key-value store (a Sawtooth state address: 70 hex characters).
KVSKey: TypeAlias = str
#: A value of the key-value store. ``None`` is "no value at this key".
KVSDatum: TypeAlias = bytes
#: An engine address: ``"worker"``, ``"supervisor"``, ``"issuer"``,
#: ``("shard", n)`` or an executor's integer id.
Address: TypeAlias = "str | int | tuple[str, int]"

WORKER = "worker"
SUPERVISOR = "supervisor"
ISSUER = "issuer"


class TxFingerprint(NamedTuple):
    """Position in the total order: batch number, then transaction number."""

    batch: int
    tx: int

    def __str__(self) -> str:
        return f"{self.batch}.{self.tx}"

    @classmethod
    def parse(cls, text: str) -> TxFingerprint:
        """Parse ``"B.T"``; raises ``ValueError`` otherwise."""
        batch, _, tx = text.partition(".")
        value = cls(int(batch), int(tx))
        if value.batch < 0 or value.tx < 0:
            raise ValueError(f"negative fingerprint {text!r}")
        return value


@dataclass(frozen=True, slots=True)
class InvalidTx:
    """Why a transaction inside a candidate was invalid (Sawtooth's shape)."""

    id: str
    message: str
    extended_data: bytes = b""


@dataclass(frozen=True, slots=True)
class ProgramResult:
    """What a transaction's code produced.

    ``writes`` maps written keys to their new value; a may-write key that is
    absent (or ``None``) is left unchanged. When ``success`` is false the
    executor discards every write: the candidate is atomic.
    """

    writes: Mapping[KVSKey, KVSDatum | None] = field(default_factory=dict)
    success: bool = True
    invalid: tuple[InvalidTx, ...] = ()
    log: tuple[str, ...] = ()


#: The code of a candidate: a generator that yields the keys it reads, is sent
#: each key's value (``None`` when absent) and returns its :class:`ProgramResult`.
Program: TypeAlias = Generator[KVSKey, "KVSDatum | None", ProgramResult]
TransactionExecutable: TypeAlias = Callable[[], Program]


def covered(key: KVSKey, prefixes: frozenset[KVSKey]) -> bool:
    """Whether ``key`` begins with one of ``prefixes``."""
    return any(key.startswith(prefix) for prefix in prefixes)


@dataclass(frozen=True, slots=True)
class TransactionLabel:
    """The keys a candidate may touch; eager/lazy reads and will/may writes.

    ``read_prefixes`` and ``write_prefixes`` cover every key that begins with
    one of them: a key under a read prefix may be read (a lazy read, asked
    for when the code first needs it), a key under a write prefix may be
    written (a may-write).
    """

    eager_read: frozenset[KVSKey] = frozenset()
    lazy_read: frozenset[KVSKey] = frozenset()
    will_write: frozenset[KVSKey] = frozenset()
    may_write: frozenset[KVSKey] = frozenset()
    read_prefixes: frozenset[KVSKey] = frozenset()
    write_prefixes: frozenset[KVSKey] = frozenset()

    def __post_init__(self) -> None:
        if self.eager_read & self.lazy_read:
            raise ValueError("eager and lazy reads must be disjoint")
        if self.will_write & self.may_write:
            raise ValueError("will- and may-writes must be disjoint")

    def keys(self) -> frozenset[KVSKey]:
        return self.eager_read | self.lazy_read | self.will_write | self.may_write


@dataclass(frozen=True, slots=True)
class TransactionCandidate:
    """A unit of ordering and execution; ``id`` is what de-duplication uses."""

    id: str
    label: TransactionLabel
    executable: TransactionExecutable = field(compare=False)


# --- mempool ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TransactionRequest:
    tx: TransactionCandidate
    resubmission: TxFingerprint | None = None
    issuer: Address = ISSUER


@dataclass(frozen=True, slots=True)
class TransactionAck:
    tx_hash: str
    batch_number: int
    batch_start: int
    fingerprint: TxFingerprint | None
    duplicate: bool = False


@dataclass(frozen=True, slots=True)
class SpawnExecutor:
    curator: Address = WORKER


@dataclass(frozen=True, slots=True)
class ExecutorPIDAssigned:
    epid: int


@dataclass(frozen=True, slots=True)
class ExecutionSummary:
    """Everything about one execution that its issuer may see."""

    fingerprint: TxFingerprint
    tx_id: str
    success: bool
    values_read: tuple[tuple[KVSKey, KVSDatum | None], ...]
    values_written: tuple[tuple[KVSKey, KVSDatum], ...]
    invalid: tuple[InvalidTx, ...] = ()
    log: tuple[str, ...] = ()

    @property
    def log_key(self) -> str:
        return str(self.fingerprint)


@dataclass(frozen=True, slots=True)
class ExecutorFinished:
    fingerprint: TxFingerprint
    log_key: str
    summary: ExecutionSummary


@dataclass(frozen=True, slots=True)
class RequestLogs:
    fingerprint: TxFingerprint
    log_key: str = ""
    requester: Address = ISSUER


@dataclass(frozen=True, slots=True)
class SendLog:
    fingerprint: TxFingerprint
    summary: ExecutionSummary | None


# --- execution ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ExecuteTransaction:
    executable: TransactionExecutable
    label: TransactionLabel
    timestamp: TxFingerprint
    tx_id: str
    curator: Address = WORKER
    issuer: Address = ISSUER


@dataclass(frozen=True, slots=True)
class KVSAcquireLock:
    lazy_read_keys: frozenset[KVSKey]
    eager_read_keys: frozenset[KVSKey]
    will_write_keys: frozenset[KVSKey]
    may_write_keys: frozenset[KVSKey]
    curator: Address
    executor: Address
    timestamp: TxFingerprint
    read_prefixes: frozenset[KVSKey] = frozenset()
    write_prefixes: frozenset[KVSKey] = frozenset()


@dataclass(frozen=True, slots=True)
class KVSLockAcquired:
    fingerprint: TxFingerprint
    shard: int


@dataclass(frozen=True, slots=True)
class UpdateSeenAll:
    timestamp: TxFingerprint
    write: bool = True


@dataclass(frozen=True, slots=True)
class KVSReadRequest:
    timestamp: TxFingerprint
    key: KVSKey
    actual: bool


@dataclass(frozen=True, slots=True)
class KVSRead:
    timestamp: TxFingerprint
    key: KVSKey
    data: KVSDatum | None


@dataclass(frozen=True, slots=True)
class KVSWrite:
    timestamp: TxFingerprint
    key: KVSKey
    datum: KVSDatum | None


@dataclass(frozen=True, slots=True)
class KVSPrefixDone:
    """The candidate at ``timestamp`` is done with its prefixes on this shard.

    ``written`` holds the values it wrote at keys under its write prefixes
    that this shard owns (keys its label also names one by one go by their
    own :class:`KVSWrite`); every other key under them is unchanged. Its
    read prefixes are released: it reads nothing more under them.
    """

    timestamp: TxFingerprint
    written: tuple[tuple[KVSKey, KVSDatum], ...] = ()


class UnknownMessageError(TypeError):
    """An engine was sent a message it does not handle: a wiring bug."""

    def __init__(self, engine: object, msg: object) -> None:
        super().__init__(f"{type(engine).__name__} does not handle {type(msg).__name__}")

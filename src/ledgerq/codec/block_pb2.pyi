from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class BlockHeader(_message.Message):
    __slots__ = ("block_num", "previous_block_id", "signer_public_key", "batch_ids", "consensus", "state_root_hash")
    BLOCK_NUM_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_BLOCK_ID_FIELD_NUMBER: _ClassVar[int]
    SIGNER_PUBLIC_KEY_FIELD_NUMBER: _ClassVar[int]
    BATCH_IDS_FIELD_NUMBER: _ClassVar[int]
    CONSENSUS_FIELD_NUMBER: _ClassVar[int]
    STATE_ROOT_HASH_FIELD_NUMBER: _ClassVar[int]
    block_num: int
    previous_block_id: str
    signer_public_key: str
    batch_ids: _containers.RepeatedScalarFieldContainer[str]
    consensus: bytes
    state_root_hash: str
    def __init__(self, block_num: _Optional[int] = ..., previous_block_id: _Optional[str] = ..., signer_public_key: _Optional[str] = ..., batch_ids: _Optional[_Iterable[str]] = ..., consensus: _Optional[bytes] = ..., state_root_hash: _Optional[str] = ...) -> None: ...

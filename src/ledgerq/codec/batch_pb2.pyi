from ledgerq.codec import transaction_pb2 as _transaction_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class BatchHeader(_message.Message):
    __slots__ = ("signer_public_key", "transaction_ids")
    SIGNER_PUBLIC_KEY_FIELD_NUMBER: _ClassVar[int]
    TRANSACTION_IDS_FIELD_NUMBER: _ClassVar[int]
    signer_public_key: str
    transaction_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, signer_public_key: _Optional[str] = ..., transaction_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class Batch(_message.Message):
    __slots__ = ("header", "header_signature", "transactions", "trace")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    HEADER_SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    TRANSACTIONS_FIELD_NUMBER: _ClassVar[int]
    TRACE_FIELD_NUMBER: _ClassVar[int]
    header: bytes
    header_signature: str
    transactions: _containers.RepeatedCompositeFieldContainer[_transaction_pb2.Transaction]
    trace: bool
    def __init__(self, header: _Optional[bytes] = ..., header_signature: _Optional[str] = ..., transactions: _Optional[_Iterable[_Union[_transaction_pb2.Transaction, _Mapping]]] = ..., trace: _Optional[bool] = ...) -> None: ...

class BatchList(_message.Message):
    __slots__ = ("batches",)
    BATCHES_FIELD_NUMBER: _ClassVar[int]
    batches: _containers.RepeatedCompositeFieldContainer[Batch]
    def __init__(self, batches: _Optional[_Iterable[_Union[Batch, _Mapping]]] = ...) -> None: ...

"""Test factories shared by every folder: tracking batches as the store holds them."""

from __future__ import annotations

from collections.abc import Sequence

from ledgerq.model import TrackingBatch, TrackingTransaction

SIGNER = "02" + "a" * 64


def tracking_batch(
    service_id: str,
    n: int,
    *,
    inputs: Sequence[str] | None = None,
    outputs: Sequence[str] | None = None,
    dependencies: Sequence[str] | None = None,
    seq: int | None = None,
    created_at: int | None = None,
    transaction_id: str | None = None,
) -> TrackingBatch:
    """Batch ``n`` of ``service_id``: one intkey transaction; ids that sort
    in ``n`` order (``<service>-<n>`` padded to 16 characters); ``seq`` and
    ``created_at`` ``n`` unless given (0 lets the store stamp them); its
    transaction's id ``tx-<batch id>`` unless given."""
    bid = f"{service_id}-{n:04d}".ljust(16, "0")
    return TrackingBatch(
        service_id=service_id,
        batch_header=bid,
        data_change_id=None,
        signer_public_key=SIGNER,
        trace=False,
        serialized_batch=bid.encode(),
        created_at=n if created_at is None else created_at,
        transactions=(
            TrackingTransaction(
                "intkey",
                "1.0",
                transaction_id or f"tx-{bid}",
                b"p",
                SIGNER,
                service_id,
                inputs=None if inputs is None else tuple(inputs),
                outputs=None if outputs is None else tuple(outputs),
                dependencies=tuple(dependencies or ()),
            ),
        ),
        seq=n if seq is None else seq,
    )

"""ledgerq: ordered, lossless batch submission to distributed ledgers."""

__version__ = "0.1.0"

"""ledgerq benchmarks: one module per subject, each exposing a click command ``command``.

Run them with ``ledgerq bench <name>`` (or ``make bench`` for all). Figures go
to ``docs/BENCHMARKS.md`` through :mod:`bench.report`.
"""

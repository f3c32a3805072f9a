"""The ``ledgerq`` subcommands, one module per area; ``ledgerq.cli`` registers them.

May import anything; nothing imports it but ``ledgerq.cli``.
"""

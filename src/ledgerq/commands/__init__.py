"""The ``ledgerq`` subcommands, one module per area; ``ledgerq.cli`` registers them."""

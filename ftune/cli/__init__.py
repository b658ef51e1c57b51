"""Command-line interface: one module per command, looked up lazily from `ftune.cli.main.COMMANDS`."""

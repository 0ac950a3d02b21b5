"""The command line: the typer app, its command table, one module per command group."""

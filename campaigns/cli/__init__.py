"""The `commcamp` command: typer apps only (one module per command group); the work is in the packages beside."""

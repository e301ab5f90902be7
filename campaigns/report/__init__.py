"""Reports built from the results store (HTML)."""

"""State store adapters: Table Storage (ETag in, ConcurrencyConflict out)."""

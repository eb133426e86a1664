"""The operator's tools: the HTTP API of contract 3.7 and the same operations as a CLI."""

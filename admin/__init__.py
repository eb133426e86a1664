"""The operator's tools: the HTTP API of docs/contracts.md §3.7 and the same operations as a CLI."""

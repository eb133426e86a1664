"""devhost: the project's local Functions host, ``python -m devhost`` (contract 3.9; what it
runs: docs/local-development.md). Each module says where it differs from Azure."""

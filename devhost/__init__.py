"""devhost: the project's own local Functions host, ``python -m devhost`` (contract 3.9). The
"devhost" section of docs/local-development.md says what it runs; each module says where it
differs from Azure."""

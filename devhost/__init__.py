"""devhost: the project's own local Functions host, ``python -m devhost`` (contract 3.9). The
README's "devhost" section says what it runs; each module says where it differs from Azure."""

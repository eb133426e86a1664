"""The live dashboard's layer: its figures (``dashboard.figures``) and the store port
that speaks their types (``dashboard.ports``)."""

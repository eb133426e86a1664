"""End-to-end tests: real processes (Azurite, simulator, devhost instances), killed on purpose."""

"""The supervisor: finds steps whose deadline passed and retries them or gives up."""

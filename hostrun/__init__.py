"""The app through the Functions Python runtime (``azure-functions-runtime``), as the host
drives it: see :mod:`hostrun.worker`. ``python -m devhost`` runs every function this way."""

"""The app through the Functions Python runtime (``azure-functions-runtime``), as the host
drives it: see :mod:`hostrun.worker`. Runs only on Python 3.13 (``.venv-runtime``)."""

"""Your workflows' tests, written with the test kit (``testkit``): ``make team-tests`` runs
them, and so does ``make test``. They are not deployed (``.funcignore``)."""

"""The app's configuration: the typed settings read once from the environment
(``config.settings``) and who may do what (``config.principals``); no I/O beyond the
environment the composition root hands in."""

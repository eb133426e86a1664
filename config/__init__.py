"""The app's configuration: the typed settings read once from the environment the
composition root hands in (``config.settings``), and who may do what
(``config.principals``), which the settings build the sign-in of. It imports only
``core`` (``core.limits``: the bounds the workflow language shares with the settings),
so that every role may import it."""

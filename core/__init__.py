"""The domain, pure: records, states and transitions, the workflow language, messages,
errors, policy, ports.

Nothing here performs I/O, imports an Azure SDK or reads the environment; every rule
that depends on time takes ``now`` as an argument, so it is tested with a fake clock.
The settings and who may do what are ``config/``; the dashboard's figures, ``dashboard/``.
"""

"""The pure core: records, states and transitions, workflows, messages, errors, ports.

Nothing here performs I/O or imports an Azure SDK; every rule that depends on
time takes ``now`` as an argument, so it is tested with a fake clock.
"""

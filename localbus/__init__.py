"""A local Service Bus test double: an AMQP 1.0 broker (Apache Qpid Proton) that the real
azure-servicebus SDK talks to, for local runs and tests only (never deployed).

``python -m localbus --queues a,b`` runs one; :class:`localbus.process.LocalBus` starts one
as a child process. The rules it keeps are in ``localbus.entities``; the wire protocol in
``localbus.broker``; what it does not imitate is in docs/local-development.md ("localbus").
"""

from __future__ import annotations


def connection_string(host: str, port: int) -> str:
    """What the SDK needs to reach the double (no TLS, no real key: it is not checked)."""
    return (
        f"Endpoint=sb://{host}:{port};SharedAccessKeyName=localbus;"
        "SharedAccessKey=localbus;UseDevelopmentEmulator=true"
    )

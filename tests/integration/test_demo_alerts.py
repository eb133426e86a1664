"""The demo reads the operator alerts it checks and leaves them on the queue, so the
console's alerts page shows them after ``make run`` (more than a peek's 32 of them)."""

from __future__ import annotations

import json

from demo.verify import drain_alerts, read_alerts
from tests.support import make_context


def test_the_demo_reads_every_alert_and_leaves_each_on_the_queue(
    storage_connection: str, tag: str
) -> None:
    ctx = make_context(storage_connection, tag)
    client = ctx.queues.client(ctx.names.operator_alerts)
    sent = [{"orderId": f"o-{i}", "reason": "r"} for i in range(40)]
    for alert in sent:
        client.send_message(json.dumps(alert))
    read = read_alerts(ctx)
    assert sorted(a["orderId"] for a in read) == sorted(a["orderId"] for a in sent)
    # all still there, visible now: the console (and the tests' drain) find each one
    assert sorted(a["orderId"] for a in drain_alerts(ctx)) == sorted(a["orderId"] for a in sent)

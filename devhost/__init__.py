"""devhost: the project's own local Functions host (architecture contract 3.9).

``python -m devhost`` runs every function that a v2-model ``function_app.py`` declares,
found from their bindings (so what runs locally is what deploys), against the storage
named by ``AzureWebJobsStorage``, until interrupted. Azure Functions Core Tools is not
needed; where it is installed, ``func start`` runs the same app.

- Queue triggers (``queues``): host.json ``extensions.queues`` honoured; a message is
  leased for at most 30 s and the lease renewed every 10 s while the function runs, so a
  message held by a killed process is back within 30 s; failures are retried after
  ``visibilityTimeout`` and moved to ``<queue>-poison`` at ``maxDequeueCount``. Several
  devhost processes share a queue's work, as scaled-out instances do.
- Timer triggers (``timers``): six-field NCRONTAB in UTC. **Timers fire in every devhost
  process**: there is no cross-process singleton as in Azure.
- HTTP triggers (``http``): served on 127.0.0.1 (``--http-port``, default 7071), routes
  under host.json's routePrefix; auth levels are not enforced.
- Service Bus triggers (``servicebus``): run when the connection is configured, otherwise
  skipped with a line that says so.

``devhost.azurite`` starts a private Azurite for local runs and tests.
"""

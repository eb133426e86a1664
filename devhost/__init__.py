"""devhost: the project's own local Functions host (architecture contract 3.9).

``python -m devhost`` runs the queue, timer, HTTP and Service Bus triggers that a v2-model
``function_app.py`` declares, found from their bindings (so what runs locally is what
deploys), against the storage named by ``AzureWebJobsStorage``, until interrupted. Azure
Functions Core Tools is not needed; where it is installed, ``func start`` runs the same app.
Each module says where it differs from Azure. ``localrun.azurite`` starts a private Azurite.
"""

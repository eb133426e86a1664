"""What the workflow language shares with the settings: the bounds the Functions host can
honour, and the setting that names the declarations.

Pure constants: ``config.settings`` reads the environment and checks its values against
these; ``core.flow`` and ``core.agent_spec`` check declarations against the same ones.
"""

from __future__ import annotations

from typing import Final

#: What the Functions host can honour (host.json; tests/unit/test_settings.py keeps
#: these equal to it). An agent invocation lasts up to a step's timeout: it must end
#: well inside the Service Bus lock renewal window and the function timeout.
HOST_FUNCTION_TIMEOUT_SECONDS: Final = 600
HOST_LOCK_RENEWAL_SECONDS: Final = 300
MAX_STEP_TIMEOUT_SECONDS: Final = HOST_LOCK_RENEWAL_SECONDS - 30

#: The setting that names the module declaring the agents and workflows
#: (``declarations/``, yours), and that module when it is not set.
DECLARATIONS_SETTING: Final = "ORDERS_DECLARATIONS"
DEFAULT_DECLARATIONS: Final = "declarations"

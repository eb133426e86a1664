"""The Function App: one blueprint per role of the Scheduler Agent Supervisor pattern."""

import azure.functions as func

from admin.triggers import bp as admin
from agents.triggers import bp as agents
from console.triggers import bp as console
from scheduler.triggers import bp as scheduler
from supervisor.triggers import bp as supervisor

app = func.FunctionApp(http_auth_level=func.AuthLevel.FUNCTION)
app.register_functions(scheduler)
app.register_functions(agents)
app.register_functions(supervisor)
app.register_functions(admin)
app.register_functions(console)

"""The supervisor's blueprint: one timer trigger on SUPERVISOR_SCHEDULE."""

from __future__ import annotations

import azure.functions as func

from runtime.context import app_context

bp = func.Blueprint()


@bp.timer_trigger(
    arg_name="timer", schedule="%SUPERVISOR_SCHEDULE%", run_on_startup=False, use_monitor=True
)
def supervise(timer: func.TimerRequest) -> None:
    app_context().supervisor.run()

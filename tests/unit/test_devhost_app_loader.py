"""devhost app loading: functions found from their bindings, unsupported ones refused."""

from __future__ import annotations

import types

import azure.functions as func
import pytest

from devhost import app_loader
from devhost.app_loader import FunctionSpec, UnsupportedFunction, build_spec
from devhost.settings import ConfigError

ENV = {"ORDERS_QUEUE": "orders-x", "SWEEP": "*/10 * * * * *"}


def specs_of(app: func.FunctionApp, environ: dict[str, str] | None = None) -> list[FunctionSpec]:
    return [build_spec(fn, ENV if environ is None else environ) for fn in app.get_functions()]


def test_every_supported_trigger_is_found_from_its_bindings() -> None:
    app = func.FunctionApp()

    @app.queue_trigger(arg_name="msg", queue_name="%ORDERS_QUEUE%", connection="Storage")
    def submit(msg: func.QueueMessage) -> None: ...

    @app.timer_trigger(schedule="%SWEEP%", arg_name="timer", run_on_startup=True)
    def sweep(timer: func.TimerRequest) -> None: ...

    @app.route(route="orders/{orderId}", methods=["GET"])
    def get_order(req: func.HttpRequest) -> func.HttpResponse:
        return func.HttpResponse("")

    @app.service_bus_queue_trigger(
        arg_name="m",
        queue_name="%ORDERS_QUEUE%/$DeadLetterQueue",
        connection="ServiceBusConnection",
    )
    def on_bus(m: func.ServiceBusMessage) -> None: ...

    by_name = {spec.name: spec for spec in specs_of(app)}
    assert by_name["submit"].trigger_type == "queueTrigger"
    assert by_name["submit"].trigger["queueName"] == "orders-x"
    assert by_name["submit"].trigger_arg == "msg"
    assert by_name["sweep"].trigger["schedule"] == "*/10 * * * * *"
    assert by_name["sweep"].trigger["runOnStartup"] is True
    assert by_name["get_order"].trigger_type == "httpTrigger"
    assert by_name["get_order"].trigger["methods"] == ["GET"]
    assert by_name["on_bus"].trigger["queueName"] == "orders-x/$DeadLetterQueue"


def test_a_storage_queue_output_binding_is_kept_resolved() -> None:
    app = func.FunctionApp()

    @app.queue_trigger(arg_name="msg", queue_name="in", connection="AzureWebJobsStorage")
    @app.queue_output(arg_name="out", queue_name="%OUT_QUEUE%", connection="AzureWebJobsStorage")
    def forward(msg: func.QueueMessage, out: func.Out[str]) -> None: ...

    (spec,) = [app_loader.build_spec(fn, {"OUT_QUEUE": "out-x"}) for fn in app.get_functions()]
    assert spec.outputs["out"]["queueName"] == "out-x"  # delivered by DevHost.deliver


def test_another_output_binding_is_refused_naming_function_and_binding() -> None:
    app = func.FunctionApp()

    @app.queue_trigger(arg_name="msg", queue_name="in", connection="AzureWebJobsStorage")
    @app.blob_output(arg_name="out", path="docs/x", connection="AzureWebJobsStorage")
    def forward(msg: func.QueueMessage, out: func.Out[str]) -> None: ...

    with pytest.raises(UnsupportedFunction) as error:
        specs_of(app)
    message = str(error.value)
    assert "'forward'" in message
    assert "'out'" in message
    assert "'blob'" in message
    assert "--exclude forward" in message


def test_an_unsupported_trigger_is_refused() -> None:
    app = func.FunctionApp()

    @app.blob_trigger(arg_name="blob", path="docs/{name}", connection="AzureWebJobsStorage")
    def on_blob(blob: func.InputStream) -> None: ...

    with pytest.raises(UnsupportedFunction, match=r"'on_blob'.*'blob'.*'blobTrigger'"):
        specs_of(app)


def test_service_bus_sessions_batches_and_topics_are_refused() -> None:
    sessions = func.FunctionApp()

    @sessions.service_bus_queue_trigger(
        arg_name="m", queue_name="q", connection="C", is_sessions_enabled=True
    )
    def with_sessions(m: func.ServiceBusMessage) -> None: ...

    batches = func.FunctionApp()

    @batches.service_bus_queue_trigger(
        arg_name="m", queue_name="q", connection="C", cardinality=func.Cardinality.MANY
    )
    def in_batches(m: list[func.ServiceBusMessage]) -> None: ...

    topics = func.FunctionApp()

    @topics.service_bus_topic_trigger(
        arg_name="m", topic_name="t", subscription_name="s", connection="C"
    )
    def on_topic(m: func.ServiceBusMessage) -> None: ...

    for app in (sessions, batches, topics):
        with pytest.raises(UnsupportedFunction, match="Service Bus queue triggers"):
            specs_of(app)


def test_a_parameter_without_binding_is_refused() -> None:
    app = func.FunctionApp()

    @app.queue_trigger(arg_name="msg", queue_name="q1", connection="AzureWebJobsStorage")
    def handler(msg: func.QueueMessage, extra: str) -> None: ...

    with pytest.raises(UnsupportedFunction, match="extra"):
        specs_of(app)


def test_the_context_parameter_and_output_parameters_are_refused() -> None:
    with_context = func.FunctionApp()

    @with_context.queue_trigger(arg_name="msg", queue_name="q1", connection="AzureWebJobsStorage")
    def handler(msg: func.QueueMessage, context: func.Context) -> None: ...

    with pytest.raises(UnsupportedFunction, match="context"):
        specs_of(with_context)

    out_param = func.FunctionApp()

    @out_param.route(route="r", binding_arg_name="res")
    def answer(req: func.HttpRequest, res: func.Out[func.HttpResponse]) -> None: ...

    with pytest.raises(UnsupportedFunction, match="'res'"):
        specs_of(out_param)


def test_a_missing_setting_in_a_binding_names_the_setting() -> None:
    app = func.FunctionApp()

    @app.queue_trigger(arg_name="msg", queue_name="%NOPE_QUEUE%", connection="AzureWebJobsStorage")
    def handler(msg: func.QueueMessage) -> None: ...

    with pytest.raises(ConfigError, match=r"NOPE_QUEUE.*not set"):
        specs_of(app)


def test_only_and_exclude_select_and_reject_unknown_names() -> None:
    app = func.FunctionApp()

    @app.route(route="a")
    def first(req: func.HttpRequest) -> func.HttpResponse:
        return func.HttpResponse("")

    @app.route(route="b")
    def second(req: func.HttpRequest) -> func.HttpResponse:
        return func.HttpResponse("")

    functions = app.get_functions()
    assert [f.get_function_name() for f in app_loader.select(functions, {"first"}, set())] == [
        "first"
    ]
    assert [f.get_function_name() for f in app_loader.select(functions, set(), {"first"})] == [
        "second"
    ]
    with pytest.raises(ConfigError, match="unknown function name"):
        app_loader.select(functions, {"third"}, set())
    # the host's own setting disables a function, as in Azure
    for value, names in (("true", ["second"]), ("1", ["second"]), ("false", ["first", "second"])):
        env = {"AzureWebJobs.first.Disabled": value}
        chosen = app_loader.select(functions, set(), set(), env)
        assert [f.get_function_name() for f in chosen] == names


def test_the_module_must_hold_exactly_one_function_app() -> None:
    empty = types.ModuleType("empty")
    with pytest.raises(ConfigError, match=r"no azure\.functions\.FunctionApp"):
        app_loader.find_app(empty)
    two = types.ModuleType("two")
    two.a = func.FunctionApp()  # type: ignore[attr-defined]
    two.b = func.FunctionApp()  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match="exactly one"):
        app_loader.find_app(two)
    one = types.ModuleType("one")
    one.app = func.FunctionApp()  # type: ignore[attr-defined]
    one.blueprint = func.Blueprint()  # type: ignore[attr-defined]
    assert app_loader.find_app(one) is one.app


def test_blueprint_functions_are_found_through_the_app() -> None:
    blueprint = func.Blueprint()

    @blueprint.queue_trigger(arg_name="msg", queue_name="bp-q", connection="AzureWebJobsStorage")
    def from_blueprint(msg: func.QueueMessage) -> None: ...

    app = func.FunctionApp()
    app.register_functions(blueprint)
    assert [spec.name for spec in specs_of(app)] == ["from_blueprint"]

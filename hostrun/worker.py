"""Drive ``azure-functions-runtime`` as the Functions host and the worker's proxy do.

Since Python 3.13 the Python worker is a thin proxy (Azure/azure-functions-python-worker,
``proxy_worker/dispatcher.py``) that owns the gRPC stream and hands each request to the
runtime package, ``azure_functions_runtime`` (``handle_event.py``), as a coroutine taking
a ``WorkerRequest(name, request, properties)`` whose ``request`` is the host's
``StreamingMessage``:

1. ``start_threadpool_executor()`` then ``worker_init_request``: ``properties`` carries
   ``protos`` (the compiled FunctionRpc module) and ``host``; the runtime indexes
   ``function_app.py`` in ``function_app_directory`` here, and answers with its
   capabilities (RawHttpBodyBytes, RpcHttpBodyOnly, RpcHttpTriggerMetadataRemoved ...);
2. ``functions_metadata_request``: the indexed functions (``RpcFunctionMetadata``, each
   with the ``function_id`` the invocations name);
3. ``function_load_request`` per function (the host sends the metadata back);
4. ``invocation_request`` per invocation: ``InvocationRequest(invocation_id,
   function_id, input_data, trigger_metadata, trace_context)``; the response's
   ``result.status`` says success or failure (with ``RpcException``), ``return_value``
   and ``output_data`` carry what the function gave back.

As in the proxy, all of this runs on one asyncio loop (here in a thread of its own); sync
functions run on the runtime's thread pool, async ones on that loop. The runtime keeps its
state in module globals, so there is one :class:`WorkerRuntime` per process, as there is
one worker per process in Azure. Environment reload (placeholder specialization) is not
driven: devhost never starts as a placeholder.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hostrun import rpc, shapes

log = logging.getLogger("hostrun")
HOST_VERSION = "4.1040.0"  # what the host reports; the runtime only logs it


class WorkerError(Exception):
    """The runtime refused a request (init, indexing, load): devhost exits 2 with it."""


class FunctionFailed(Exception):
    """An invocation ended with ``StatusResult.Failure``: the function raised (or its
    result could not be encoded). The message and the worker's stack trace are kept."""

    def __init__(self, name: str, message: str, stack: str) -> None:
        super().__init__(f"function {name}: {message}\n{stack}".rstrip())
        self.function, self.reason, self.stack = name, message, stack


@dataclass(frozen=True)
class Result:
    """What one invocation gave back: the return value and the output bindings."""

    value: Any = None
    outputs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class WorkerRequest:
    """What the proxy passes to each ``handle_event`` coroutine (proxy_worker/dispatcher.py)."""

    name: str
    request: Any
    properties: dict[str, Any] | None = None


class WorkerRuntime:
    """``function_app.py`` in ``app_dir``, loaded and invoked through the runtime."""

    def __init__(
        self, app_dir: str | Path, script: str = "function_app", protos: Any = None
    ) -> None:
        import azure_functions_runtime as runtime

        self.app_dir, self.script = str(Path(app_dir).resolve()), script
        # What the runtime imports (azure_functions_runtime/utils/constants.py)
        os.environ.setdefault("PYTHON_SCRIPT_FILE_NAME", f"{script}.py")
        self.protos = protos if protos is not None else rpc.load()
        self.runtime = runtime
        self.functions: dict[str, Any] = {}  # name -> RpcFunctionMetadata
        self.capabilities: dict[str, str] = {}
        #: Where output bindings go (devhost sets ``DevHost.deliver``); by default refused.
        self.deliver: Callable[[Any, dict[str, Any]], None] = self._undelivered
        self._triggers: dict[str, str] = {}  # invocation id -> trigger type, while it runs
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="worker", daemon=True)
        self.started = False

    # --- the host's start-up sequence -----------------------------------------------------

    def start(self) -> WorkerRuntime:
        """Worker init (indexing), functions metadata, then a load request per function."""
        started = time.perf_counter()
        # The proxy's DependencyManager puts the app folder first on sys.path; the runtime
        # then imports function_app by name (azure_functions_runtime/loader.py).
        if self.app_dir not in sys.path:
            sys.path.insert(0, self.app_dir)
        index_once(self.script)
        self._thread.start()
        p = self.protos
        self.runtime.start_threadpool_executor()
        init = p.StreamingMessage(
            worker_init_request=p.WorkerInitRequest(
                host_version=HOST_VERSION,
                function_app_directory=self.app_dir,
                worker_directory=str(Path(self.runtime.__file__).parent),
            )
        )
        properties = {"protos": p, "host": "127.0.0.1"}
        response = self._run(
            self.runtime.worker_init_request(WorkerRequest("WorkerInitRequest", init, properties))
        )
        self._check(response.result, "worker init (indexing function_app.py)")
        self.capabilities = dict(response.capabilities)
        metadata = self._run(
            self.runtime.functions_metadata_request(
                WorkerRequest("WorkerMetadataRequest", p.StreamingMessage())
            )
        )
        self._check(metadata.result, "functions metadata")
        for fn in metadata.function_metadata_results:
            load = p.StreamingMessage(
                function_load_request=p.FunctionLoadRequest(function_id=fn.function_id, metadata=fn)
            )
            loaded = self._run(
                self.runtime.function_load_request(WorkerRequest("FunctionLoadRequest", load))
            )
            self._check(loaded.result, f"function load of {fn.name}")
            self.functions[fn.name] = fn
        self.started = True
        log.info(
            "azure-functions-runtime loaded %d function(s) from %s in %.3f s",
            len(self.functions),
            self.app_dir,
            time.perf_counter() - started,
        )
        return self

    def _check(self, result: Any, what: str) -> None:
        if result.status != self.protos.StatusResult.Success:
            exc = result.exception
            raise WorkerError(f"{what} failed: {exc.message}\n{exc.stack_trace}".rstrip())

    def _run(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def stop(self) -> None:
        if self._thread.is_alive():
            self.runtime.stop_threadpool_executor()
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)

    # --- invocations ------------------------------------------------------------------------

    def trigger_of(self, name: str) -> tuple[str, str]:
        """(binding name, type) of the trigger of function ``name``."""
        for binding_name, info in self.functions[name].bindings.items():
            if info.type.endswith("Trigger"):
                return binding_name, info.type
        raise WorkerError(f"function {name!r} has no trigger binding")

    def request(
        self, name: str, trigger: Any, metadata: Mapping[str, Any], invocation_id: str = ""
    ) -> Any:
        """The ``InvocationRequest`` for function ``name``: its trigger's ``TypedData`` and
        ``trigger_metadata`` (the host's ``ToRpcInvocationRequest``)."""
        p = self.protos
        binding, _ = self.trigger_of(name)
        return p.InvocationRequest(
            invocation_id=invocation_id or str(uuid.uuid4()),
            function_id=self.functions[name].function_id,
            input_data=[p.ParameterBinding(name=binding, data=trigger)],
            trigger_metadata=dict(metadata),
            trace_context=p.RpcTraceContext(trace_parent="", trace_state=""),
        )

    def send(self, request: Any) -> Any:
        """One ``InvocationRequest`` through the runtime; the ``InvocationResponse``."""
        message = self.protos.StreamingMessage(invocation_request=request)
        return self._run(
            self.runtime.invocation_request(WorkerRequest("FunctionInvocationRequest", message))
        )

    def invoke(self, name: str, trigger: shapes.Trigger) -> Result:
        """Invoke ``name`` with its trigger as the host has it, turned into what the host
        sends. Raises :class:`FunctionFailed` when the response says Failure."""
        _, kind = self.trigger_of(name)
        data, metadata = shapes.trigger_data(self.protos, trigger, name)
        invocation_id = str(uuid.uuid4())
        self._triggers[invocation_id] = kind
        try:
            return self.outcome(name, self.send(self.request(name, data, metadata, invocation_id)))
        finally:
            del self._triggers[invocation_id]

    def current_trigger(self) -> str | None:
        """The trigger type (``timerTrigger`` ...) of the invocation the calling thread runs
        for this runtime, if it runs one (the runtime names it in its ``invocation_id``
        context variable on the pool thread)."""
        from azure_functions_runtime.utils.executor import invocation_id_cv

        invocation_id = invocation_id_cv.get()
        return self._triggers.get(invocation_id) if invocation_id else None

    def outcome(self, name: str, response: Any) -> Result:
        """Act on an ``InvocationResponse`` as the host does: Failure is an exception."""
        if response.result.status != self.protos.StatusResult.Success:
            exc = response.result.exception
            raise FunctionFailed(name, exc.message, exc.stack_trace)
        value = (
            shapes.from_rpc(response.return_value) if response.HasField("return_value") else None
        )
        outputs = {b.name: shapes.from_rpc(b.data) for b in response.output_data}
        return Result(value, outputs)

    def call(self, spec: Any, trigger: shapes.Trigger) -> Any:
        """devhost's runner (:class:`devhost.invoke.Invoker`): one invocation, its output
        bindings delivered (``deliver``: after success only, as the host flushes them; a
        delivery that fails fails the invocation, so the trigger's message is retried);
        returns the return value (an HTTP function's is a :class:`shapes.HttpResponse`)."""
        result = self.invoke(spec.name, trigger)
        if result.outputs:
            self.deliver(spec, result.outputs)
        return result.value

    @staticmethod
    def _undelivered(spec: Any, outputs: dict[str, Any]) -> None:
        raise WorkerError(
            f"function {spec.name} wrote output bindings {', '.join(sorted(outputs))} and "
            "nothing here delivers them"
        )


def index_once(module_name: str) -> None:
    """Import the app module and make its FunctionApp index once: the runtime indexes it at
    worker init (``app.get_functions()``), and devhost reads the same functions' bindings;
    azure-functions 2.x refuses a second ``get_functions()`` ("does not have a unique
    function name"), so later calls get the first call's functions."""
    import azure.functions as func

    try:
        module = importlib.import_module(module_name)
    except Exception as error:  # as the worker reports an app that does not import
        raise WorkerError(f"worker init: cannot import {module_name}: {error!r}") from error
    for app in [v for v in vars(module).values() if isinstance(v, func.FunctionRegister)]:
        if not getattr(app.get_functions, "indexed_once", False):
            first = app.get_functions
            indexed: list[Any] = []

            def get_functions(first: Any = first, indexed: list[Any] = indexed) -> list[Any]:
                if not indexed:
                    indexed.extend(first())
                return list(indexed)

            get_functions.indexed_once = True  # type: ignore[attr-defined]
            app.get_functions = get_functions  # type: ignore[method-assign]


def start(app_dir: str | Path | None = None, script: str = "function_app") -> WorkerRuntime:
    """Load the app in ``app_dir`` (default: the current folder) through the runtime."""
    return WorkerRuntime(app_dir or os.getcwd(), script).start()


__all__ = ["FunctionFailed", "Result", "WorkerError", "WorkerRuntime", "start"]

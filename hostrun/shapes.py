"""What the Functions host sends for each trigger this app uses, and what comes back.

A trigger's ``InvocationRequest`` carries the trigger value as one ``ParameterBinding``
(``input_data``) and the trigger's *binding data* as ``trigger_metadata``: every non-null
entry, each turned into ``TypedData`` by the host's ``ToRpc`` (Azure/azure-functions-host,
``src/WebJobs.Script.Grpc/MessageExtensions/ScriptInvocationContextExtensions.cs``,
``ToRpcInvocationRequest``, and ``GrpcMessageConversionExtensions.cs``, ``ToRpc``):
``string`` -> ``string``, ``byte[]`` -> ``bytes``, ``double`` -> ``double``, anything else
(``int``/``long``, ``DateTime``/``DateTimeOffset``, dictionaries) -> ``json`` through
Newtonsoft's ``JsonConvert.SerializeObject``: numbers as ``3``, times as
``"2024-05-01T12:00:00.1234567+00:00"`` (a ``DateTimeOffset``), ``"...Z"`` (a UTC
``DateTime``) or with no zone at all (a ``DateTime`` of kind Unspecified, which is what
``DateTimeOffset.DateTime`` gives). The worker declares ``RpcHttpTriggerMetadataRemoved``,
so an ``HttpRequest`` in the binding data is left out.

The binding data of each trigger, from the extensions' source:

- Storage queue: Azure/azure-sdk-for-net,
  ``sdk/storage/Microsoft.Azure.WebJobs.Extensions.Storage.Queues/src/Triggers/
  QueueTriggerBinding.cs`` (``CreateBindingData``): QueueTrigger (the text, only when the
  body is valid UTF-8), DequeueCount (long), ExpirationTime, InsertionTime,
  NextVisibleTime (DateTimeOffset), Id, PopReceipt.
- Service Bus: Azure/azure-sdk-for-net,
  ``sdk/servicebus/Microsoft.Azure.WebJobs.Extensions.ServiceBus/src/Triggers/
  ServiceBusTriggerBindingStrategy.cs`` (``AddBindingData`` for one message):
  DeliveryCount, DeadLetterSource, LockToken, ExpiresAtUtc and EnqueuedTimeUtc
  (``.DateTime``: no zone), ExpiresAt and EnqueuedTime (DateTimeOffset), MessageId,
  ContentType, ReplyTo, SequenceNumber, To, Subject and Label (the same), CorrelationId,
  ApplicationProperties and UserProperties (the same dictionary), SessionId,
  ReplyToSessionId, PartitionKey, TransactionPartitionKey. ``azure.functions`` decides
  "one message" from the presence of ``UserProperties`` (servicebus.py,
  ``_is_cardinality_one``).
- Timer: the trigger value is ``TimerInfo`` as JSON (Azure/azure-webjobs-sdk-extensions,
  ``src/WebJobs.Extensions/Extensions/Timers/TimerInfo.cs``: Schedule, ScheduleStatus
  (null without a schedule monitor), IsPastDue); no binding data of its own.
- HTTP: the trigger value is ``RpcHttp`` (``ToRpcHttp``): lower-cased header names, query
  values that are not empty, route parameters, and, as the worker asks for raw body bytes
  (``RawHttpBodyBytes``), the body as ``bytes`` when there is one. Binding data: Query and
  Headers (JSON objects) and each route parameter.

Every invocation also has ``sys`` (MethodName, UtcNow, RandGuid), added by the WebJobs SDK.
The functions receive these through ``azure.functions``' converters (queue.py,
servicebus.py, timer.py, http.py of azure-functions 2.3.0), which is what the
trigger-shape tests (tests/runtime) check end to end.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import azure.functions as func

#: Trigger metadata: key -> TypedData. The key names and types are the contract.
Metadata = dict[str, Any]


def net_time(moment: datetime | None, kind: str = "offset") -> str | None:
    """A time as Newtonsoft serializes it (ISO 8601, up to 7 fractional digits, trailing
    zeros dropped): ``offset`` a DateTimeOffset (+00:00), ``utc`` a UTC DateTime (Z),
    ``unspecified`` a DateTime of kind Unspecified (no zone)."""
    if moment is None:
        return None
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC)
    text = moment.strftime("%Y-%m-%dT%H:%M:%S")
    fraction = f"{moment.microsecond * 10:07d}".rstrip("0")
    if fraction:
        text += "." + fraction
    return text + {"offset": "+00:00", "utc": "Z", "unspecified": ""}[kind]


def to_rpc(protos: Any, value: Any) -> Any:
    """``TypedData`` for a binding data value, as the host's ``ToRpc`` makes it."""
    if isinstance(value, bytes | bytearray):
        return protos.TypedData(bytes=bytes(value))
    if isinstance(value, str):
        return protos.TypedData(string=value)
    if isinstance(value, float):
        return protos.TypedData(double=value)
    return protos.TypedData(json=json.dumps(value, separators=(",", ":")))


def _json_time(moment: datetime | None, kind: str = "offset") -> Any:
    """A time value that :func:`to_rpc` turns into JSON (a quoted string)."""
    return _Json(net_time(moment, kind))


class _Json:
    """A value the host serializes to JSON even though it is a string (a time)."""

    def __init__(self, value: Any) -> None:
        self.value = value


def metadata(protos: Any, data: Mapping[str, Any]) -> Metadata:
    """Binding data -> ``trigger_metadata``: null values are left out, as the host does."""
    out: Metadata = {}
    for key, value in data.items():
        if isinstance(value, _Json):
            if value.value is not None:
                out[key] = protos.TypedData(json=json.dumps(value.value))
        elif value is not None:
            out[key] = to_rpc(protos, value)
    return out


def sys_metadata(function_name: str, now: datetime | None = None) -> dict[str, Any]:
    """The WebJobs SDK's ``sys`` binding data (a JSON object)."""
    return {
        "MethodName": f"Functions.{function_name}",
        "UtcNow": net_time(now or datetime.now(UTC), "utc"),
        "RandGuid": str(uuid.uuid4()),
    }


def _body(protos: Any, body: bytes) -> Any:
    """A message body as the host hands it to a non-.NET worker: text when it is UTF-8."""
    try:
        return protos.TypedData(string=body.decode("utf-8"))
    except UnicodeDecodeError:
        return protos.TypedData(bytes=body)


def queue_request(protos: Any, msg: func.QueueMessage, name: str) -> tuple[Any, Metadata]:
    """(trigger TypedData, trigger_metadata) of a Storage queue message."""
    body = msg.get_body()
    data = _body(protos, body)
    return data, metadata(
        protos,
        {
            "QueueTrigger": data.string if data.HasField("string") else None,
            "DequeueCount": msg.dequeue_count,
            "ExpirationTime": _json_time(msg.expiration_time),
            "Id": msg.id,
            "InsertionTime": _json_time(msg.insertion_time),
            "NextVisibleTime": _json_time(msg.time_next_visible),
            "PopReceipt": msg.pop_receipt,
            "sys": sys_metadata(name),
        },
    )


def servicebus_request(protos: Any, msg: func.ServiceBusMessage, name: str) -> tuple[Any, Metadata]:
    """(trigger TypedData, trigger_metadata) of one Service Bus message."""
    props = dict(msg.application_properties or {})
    return _body(protos, msg.get_body()), metadata(
        protos,
        {
            "DeliveryCount": msg.delivery_count,
            "DeadLetterSource": msg.dead_letter_source,
            "LockToken": msg.lock_token,
            "ExpiresAtUtc": _json_time(msg.expires_at_utc, "unspecified"),
            "ExpiresAt": _json_time(msg.expires_at_utc),
            "EnqueuedTimeUtc": _json_time(msg.enqueued_time_utc, "unspecified"),
            "EnqueuedTime": _json_time(msg.enqueued_time_utc),
            "MessageId": msg.message_id,
            "ContentType": msg.content_type,
            "ReplyTo": msg.reply_to,
            "SequenceNumber": msg.sequence_number,
            "To": msg.to,
            "Subject": msg.subject,
            "Label": msg.subject,
            "CorrelationId": msg.correlation_id,
            "ApplicationProperties": props,
            "UserProperties": props,
            "SessionId": msg.session_id,
            "ReplyToSessionId": msg.reply_to_session_id,
            "PartitionKey": msg.partition_key,
            "sys": sys_metadata(name),
        },
    )


def timer_request(protos: Any, timer: func.TimerRequest, name: str) -> tuple[Any, Metadata]:
    """(trigger TypedData, trigger_metadata) of a timer tick: ``TimerInfo`` as JSON."""
    info = {
        "Schedule": getattr(timer, "schedule", None) or {"AdjustForDST": True},
        "ScheduleStatus": getattr(timer, "schedule_status", None),
        "IsPastDue": timer.past_due,
    }
    data = protos.TypedData(json=json.dumps(info, separators=(",", ":")))
    return data, metadata(protos, {"sys": sys_metadata(name)})


def http_request(protos: Any, req: func.HttpRequest, name: str) -> tuple[Any, Metadata]:
    """(trigger TypedData, trigger_metadata) of an HTTP request (``RpcHttp``)."""
    body = req.get_body()
    query = {k: v for k, v in req.params.items() if v}
    headers = {k.lower(): v for k, v in req.headers.items()}
    http = protos.RpcHttp(
        method=req.method,
        url=req.url,
        headers=headers,
        query=query,
        params=dict(req.route_params),
        body=protos.TypedData(bytes=body) if body else None,
    )
    data = protos.TypedData(http=http)
    binding = {"Query": query, "Headers": headers, **req.route_params, "sys": sys_metadata(name)}
    return data, metadata(protos, binding)


def set_cookie(cookie: Any) -> str:
    """An ``RpcHttpCookie`` as the host writes it: ``response.Cookies.Append(name, value,
    CookieOptions)`` (azure-functions-host, ``RpcHttpCookieConverter`` /
    ``HttpResponseExtensions``), so ASP.NET Core's ``SetCookieHeaderValue`` format: lower-case
    attributes, ``path=/`` when the cookie names none (``CookieOptions.Path``'s default)."""
    parts = [f"{cookie.name}={cookie.value}"]
    if cookie.HasField("expires"):
        when = cookie.expires.value.ToDatetime(tzinfo=UTC)
        parts.append("expires=" + when.strftime("%a, %d %b %Y %H:%M:%S GMT"))
    if cookie.HasField("max_age"):
        parts.append(f"max-age={int(cookie.max_age.value)}")
    if cookie.HasField("domain") and cookie.domain.value:
        parts.append(f"domain={cookie.domain.value}")
    path = cookie.path.value if cookie.HasField("path") and cookie.path.value else "/"
    parts.append(f"path={path}")
    if cookie.HasField("secure") and cookie.secure.value:
        parts.append("secure")
    same_site = {1: "lax", 2: "strict", 3: "none"}.get(int(cookie.same_site))
    if same_site:
        parts.append(f"samesite={same_site}")
    if cookie.HasField("http_only") and cookie.http_only.value:
        parts.append("httponly")
    return "; ".join(parts)


def from_rpc(data: Any) -> Any:
    """A ``TypedData`` the runtime returned, as a Python value (an ``HttpResponse`` for
    ``http``, as the host turns it into the HTTP response)."""
    if data is None:
        return None
    kind = data.WhichOneof("data")
    if kind == "http":
        http = data.http
        body = from_rpc(http.body) if http.HasField("body") else b""
        response = func.HttpResponse(
            body=body.encode("utf-8") if isinstance(body, str) else body or b"",
            status_code=int(http.status_code or 200),
            headers=dict(http.headers),
        )
        response.set_cookies = [set_cookie(c) for c in http.cookies]  # type: ignore[attr-defined]
        return response
    if kind == "json":
        return json.loads(data.json)
    if kind in ("string", "bytes", "int", "double"):
        return getattr(data, kind)
    if kind == "collection_string":  # func.Out[list[str]], say
        return list(data.collection_string.string)
    if kind == "collection_bytes":
        return list(data.collection_bytes.bytes)
    return None if kind is None else getattr(data, kind)

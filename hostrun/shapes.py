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
  ReplyToSessionId, PartitionKey (and TransactionPartitionKey, which devhost leaves out:
  the SDK's received message does not carry it). ``azure.functions`` decides
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

devhost hands over each trigger as the host has it, one dataclass per trigger below
(:data:`Trigger`); its ``rpc`` gives the trigger's ``TypedData`` and its binding data as
Python values (an aware ``datetime`` for a DateTimeOffset, a naive one for a DateTime),
and :func:`trigger_data` adds ``sys`` and makes each a ``TypedData``. What an HTTP
function answers comes back as :class:`HttpResponse`. The functions receive the triggers
through ``azure.functions``' converters (queue.py, servicebus.py, timer.py, http.py of
azure-functions 2.3.0), which is what the trigger-shape tests (tests/runtime) check end
to end.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

#: Trigger metadata: key -> TypedData. The key names and types are the contract.
Metadata = dict[str, Any]


def net_time(moment: datetime) -> str:
    """A time as Newtonsoft serializes it (ISO 8601, up to 7 fractional digits, trailing
    zeros dropped): an aware time as a DateTimeOffset in UTC (``+00:00``), a naive one as a
    DateTime of kind Unspecified (no zone)."""
    zone = ""
    if moment.tzinfo is not None:
        moment, zone = moment.astimezone(UTC), "+00:00"
    text = moment.strftime("%Y-%m-%dT%H:%M:%S")
    fraction = f"{moment.microsecond * 10:07d}".rstrip("0")
    return text + ("." + fraction if fraction else "") + zone


def to_rpc(protos: Any, value: Any) -> Any:
    """``TypedData`` for a binding data value, as the host's ``ToRpc`` makes it."""
    if isinstance(value, bytes | bytearray):
        return protos.TypedData(bytes=bytes(value))
    if isinstance(value, str):
        return protos.TypedData(string=value)
    if isinstance(value, float):
        return protos.TypedData(double=value)
    if isinstance(value, datetime):
        return protos.TypedData(json=json.dumps(net_time(value)))
    return protos.TypedData(json=json.dumps(value, separators=(",", ":"), default=_newtonsoft))


def _newtonsoft(value: Any) -> Any:
    """What Newtonsoft writes for a value JSON has no type for (a Service Bus application
    property: a GUID, a time, bytes, a duration): text, bytes as base64."""
    if isinstance(value, datetime):
        return net_time(value)
    if isinstance(value, bytes | bytearray):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, timedelta):  # a TimeSpan: [-][d.]hh:mm:ss[.fffffff]
        days, rest = divmod(abs(value) // timedelta(microseconds=1), 86_400_000_000)
        hours, rest = divmod(rest, 3_600_000_000)
        minutes, rest = divmod(rest, 60_000_000)
        seconds, micros = divmod(rest, 1_000_000)
        sign, day = "-" if value < timedelta(0) else "", f"{days}." if days else ""
        fraction = f".{micros * 10:07d}" if micros else ""
        return f"{sign}{day}{hours:02d}:{minutes:02d}:{seconds:02d}{fraction}"
    return str(value)


def _body(protos: Any, body: bytes) -> Any:
    """A message body as the host hands it to a non-.NET worker: text when it is UTF-8."""
    try:
        return protos.TypedData(string=body.decode("utf-8"))
    except UnicodeDecodeError:
        return protos.TypedData(bytes=body)


def _utc(moment: datetime | None) -> datetime | None:
    """A time the trigger has (aware from the SDKs; a naive one is taken as UTC) as a UTC
    DateTimeOffset."""
    if moment is None:
        return None
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def _unspecified(moment: datetime | None) -> datetime | None:
    """``DateTimeOffset.DateTime`` of a UTC time: the same time, of kind Unspecified."""
    utc = _utc(moment)
    return None if utc is None else utc.replace(tzinfo=None)


@dataclass(frozen=True)
class QueueMessage:
    """A Storage queue message as the queue trigger has it (a naive time is UTC)."""

    id: str
    body: bytes
    dequeue_count: int
    pop_receipt: str
    insertion_time: datetime | None = None
    expiration_time: datetime | None = None
    next_visible_time: datetime | None = None

    def rpc(self, protos: Any) -> tuple[Any, dict[str, Any]]:
        """The trigger's ``TypedData`` and its binding data."""
        data = _body(protos, self.body)
        return data, {
            "QueueTrigger": data.string if data.HasField("string") else None,
            "DequeueCount": self.dequeue_count,
            "ExpirationTime": _utc(self.expiration_time),
            "Id": self.id,
            "InsertionTime": _utc(self.insertion_time),
            "NextVisibleTime": _utc(self.next_visible_time),
            "PopReceipt": self.pop_receipt,
        }


@dataclass(frozen=True)
class ServiceBusMessage:
    """One Service Bus message as the trigger has it: ``delivery_count`` is .NET's (1 on
    the first delivery), a naive time is UTC, application properties have text keys."""

    body: bytes
    message_id: str
    delivery_count: int | None = None
    lock_token: str | None = None
    enqueued_time_utc: datetime | None = None
    expires_at_utc: datetime | None = None
    application_properties: Mapping[str, Any] = field(default_factory=dict)
    dead_letter_source: str | None = None
    content_type: str | None = None
    reply_to: str | None = None
    sequence_number: int | None = None
    to: str | None = None
    subject: str | None = None
    correlation_id: str | None = None
    session_id: str | None = None
    reply_to_session_id: str | None = None
    partition_key: str | None = None

    def rpc(self, protos: Any) -> tuple[Any, dict[str, Any]]:
        """The trigger's ``TypedData`` and its binding data."""
        props = dict(self.application_properties)
        return _body(protos, self.body), {
            "DeliveryCount": self.delivery_count,
            "DeadLetterSource": self.dead_letter_source,
            "LockToken": self.lock_token,
            "ExpiresAtUtc": _unspecified(self.expires_at_utc),
            "ExpiresAt": _utc(self.expires_at_utc),
            "EnqueuedTimeUtc": _unspecified(self.enqueued_time_utc),
            "EnqueuedTime": _utc(self.enqueued_time_utc),
            "MessageId": self.message_id,
            "ContentType": self.content_type,
            "ReplyTo": self.reply_to,
            "SequenceNumber": self.sequence_number,
            "To": self.to,
            "Subject": self.subject,
            "Label": self.subject,
            "CorrelationId": self.correlation_id,
            "ApplicationProperties": props,
            "UserProperties": props,
            "SessionId": self.session_id,
            "ReplyToSessionId": self.reply_to_session_id,
            "PartitionKey": self.partition_key,
        }


@dataclass(frozen=True)
class TimerInfo:
    """A timer tick: ``TimerInfo``'s IsPastDue and ScheduleStatus (Last, Next,
    LastUpdated)."""

    past_due: bool
    last: datetime | None
    next: datetime
    last_updated: datetime

    def rpc(self, protos: Any) -> tuple[Any, dict[str, Any]]:
        """The trigger's ``TypedData`` (``TimerInfo`` as JSON); no binding data."""
        info = {
            "Schedule": {"AdjustForDST": True},
            "ScheduleStatus": {
                "Last": self.last.isoformat() if self.last else None,
                "Next": self.next.isoformat(),
                "LastUpdated": self.last_updated.isoformat(),
            },
            "IsPastDue": self.past_due,
        }
        return protos.TypedData(json=json.dumps(info, separators=(",", ":"))), {}


@dataclass(frozen=True)
class HttpRequest:
    """An HTTP request as the host has it: headers as they came, the query (one value a
    name), the route's parameters and the body."""

    method: str
    url: str
    headers: Mapping[str, str]
    query: Mapping[str, str]
    route_params: Mapping[str, str]
    body: bytes

    def rpc(self, protos: Any) -> tuple[Any, dict[str, Any]]:
        """The trigger's ``TypedData`` (``RpcHttp``) and its binding data."""
        query = {k: v for k, v in self.query.items() if v}
        headers = {k.lower(): v for k, v in self.headers.items()}
        http = protos.RpcHttp(
            method=self.method,
            url=self.url,
            headers=headers,
            query=query,
            params=dict(self.route_params),
            body=protos.TypedData(bytes=self.body) if self.body else None,
        )
        binding = {"Query": query, "Headers": headers, **self.route_params}
        return protos.TypedData(http=http), binding


#: What devhost hands hostrun for one invocation.
Trigger = QueueMessage | ServiceBusMessage | TimerInfo | HttpRequest


def trigger_data(protos: Any, trigger: Trigger, function_name: str) -> tuple[Any, Metadata]:
    """(trigger TypedData, trigger_metadata) of one invocation: the trigger's binding data
    and ``sys``, null values left out, as the host does."""
    data, binding = trigger.rpc(protos)
    binding["sys"] = {
        "MethodName": f"Functions.{function_name}",
        "UtcNow": net_time(datetime.now(UTC).replace(tzinfo=None)) + "Z",  # a UTC DateTime
        "RandGuid": str(uuid.uuid4()),
    }
    return data, {key: to_rpc(protos, value) for key, value in binding.items() if value is not None}


@dataclass(frozen=True)
class HttpResponse:
    """What an HTTP function answered (``RpcHttp``), as the host writes it: each cookie
    is its ``Set-Cookie`` value."""

    body: bytes = b""
    status: int = 200
    headers: Mapping[str, str] = field(default_factory=dict)
    cookies: tuple[str, ...] = ()


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
    """A ``TypedData`` the runtime returned, as a Python value (an :class:`HttpResponse`
    for ``http``, as the host turns it into the HTTP response)."""
    if data is None:
        return None
    kind = data.WhichOneof("data")
    if kind == "http":
        http = data.http
        body = from_rpc(http.body) if http.HasField("body") else b""
        return HttpResponse(
            body.encode("utf-8") if isinstance(body, str) else body or b"",
            int(http.status_code or 200),
            dict(http.headers),
            tuple(set_cookie(c) for c in http.cookies),
        )
    if kind == "json":
        return json.loads(data.json)
    if kind in ("string", "bytes", "int", "double"):
        return getattr(data, kind)
    if kind == "collection_string":  # func.Out[list[str]], say
        return list(data.collection_string.string)
    if kind == "collection_bytes":
        return list(data.collection_bytes.bytes)
    return None if kind is None else getattr(data, kind)

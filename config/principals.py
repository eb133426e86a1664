"""Who calls the operator API and the console, and what they may do (docs/operating.md,
"Who can do what").

Two app roles of the app registration people sign in to decide, on every HTTP route:

- ``Orders.Reader``: read orders, agents, workflows and every console page;
- ``Orders.Operator``: also change them: resubmit, cancel, fix, deliver an event, bulk
  actions, pause, resume and limits. Operator implies reader.

Where a principal comes from, and when it is believed (``SignIn``):

- **App Service authentication** (Easy Auth) with Microsoft Entra ID. The platform checks
  the browser's session cookie or the caller's bearer token and hands the app its claims
  in ``X-MS-CLIENT-PRINCIPAL`` (base64 of JSON: ``claims``, each ``typ`` and ``val``; app
  roles as ``roles``), after removing any ``X-MS-CLIENT-PRINCIPAL*`` header the client
  sent. Believed only when ``SIGN_IN_CLIENT_ID`` is set (Bicep writes it with sign-in)
  *and* the platform says its module is on (``WEBSITE_AUTH_ENABLED``): otherwise nothing
  removed the header, so it is the client's own and is ignored.
- **devhost's development principal**: ``X-Dev-Principal: <name>; roles=<role>,<role>``,
  believed only when ``ORDERS_DEV_PRINCIPAL`` is set, which the settings refuse outside
  devhost (it listens on 127.0.0.1 only) and in Azure. A request with neither that header
  nor a function key is ``ORDERS_DEV_PRINCIPAL`` itself: the developer's browser.
- **A principal header believed here that cannot be read** (an X-Dev-Principal that is not
  ``<name>; roles=<role>,...`` with this app's roles, an X-MS-CLIENT-PRINCIPAL that is not
  the platform's): nobody. Not the development principal, and never a key caller, with a
  key or without: every route but the public ones refuses it (403, saying which header).
- **Neither**: no principal. On the operator API, whose routes need the function key in
  Azure, that is a key caller, a machine (a webhook delivering an event, a script): it
  may read and deliver events, and change orders and agents only where no sign-in is
  configured (then there is no person to ask for). The console always needs a principal:
  the function key never opens it.

Pure: no Azure import; the triggers hand in the request's headers and query.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Final

READER: Final = "Orders.Reader"
OPERATOR: Final = "Orders.Operator"
ROLES: Final = (READER, OPERATOR)

#: What the platform sets (and strips from clients) with App Service authentication on.
CLIENT_PRINCIPAL: Final = "x-ms-client-principal"
CLIENT_PRINCIPAL_NAME: Final = "x-ms-client-principal-name"
#: devhost's development principal (``ORDERS_DEV_PRINCIPAL``).
DEV_PRINCIPAL_HEADER: Final = "x-dev-principal"
#: Where the Functions host takes a function key from.
KEY_PARAM: Final = "code"
KEY_HEADER: Final = "x-functions-key"

#: Claim types that carry an app role: Entra ID's ``roles``, and the .NET URI that some
#: flows map it to (``role_typ`` in the header names the one in use).
ROLE_CLAIMS: Final = frozenset(
    {"roles", "role", "http://schemas.microsoft.com/ws/2008/06/identity/claims/role"}
)
#: Claims that name a principal, best first, after the header's ``name_typ``: a person's
#: user name, then an application's id (a service principal has no user name).
NAME_CLAIMS: Final = (
    "preferred_username",
    "upn",
    "http://schemas.xmlsoap.org/ws/2005/05/identity/claims/upn",
    "email",
    "http://schemas.xmlsoap.org/ws/2005/05/identity/claims/emailaddress",
    "name",
    "appid",
    "azp",
    "oid",
    "http://schemas.microsoft.com/identity/claims/objectidentifier",
)
#: A longer header is not decoded (Entra's tokens, roles included, are a few KB).
MAX_HEADER_CHARS: Final = 32_768
MAX_NAME_CHARS: Final = 128
_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


class Access(StrEnum):
    """What a route does, which decides who may call it."""

    PUBLIC = "public"  # nothing to protect: the console's stylesheet and script
    READ = "read"
    EVENT = "event"  # deliver a person's event: an operator (a machine: its capability URL)
    CHANGE = "change"


#: The role each access needs of a principal.
NEEDS: Final = {Access.READ: READER, Access.EVENT: OPERATOR, Access.CHANGE: OPERATOR}


def clean_name(text: str | None, limit: int = MAX_NAME_CHARS) -> str:
    """A name fit for the history: no control characters or line separators, trimmed."""
    return _UNPRINTABLE.sub("", text or "").strip()[:limit]


@dataclass(frozen=True)
class Principal:
    """A person (or an application with a token) the platform or devhost vouches for."""

    name: str
    roles: frozenset[str] = frozenset()
    source: str = "entra"  # "entra" (App Service authentication) or "devhost"
    #: Not empty: the request carried a principal header believed here that could not be
    #: read, and this says why. Such a request is nobody (``unreadable``).
    unreadable: str = ""

    def has(self, role: str) -> bool:
        if self.unreadable:
            return False
        return role in self.roles or (role == READER and OPERATOR in self.roles)

    def may(self, access: Access) -> bool:
        return access is Access.PUBLIC or self.has(NEEDS[access])

    @property
    def app_roles(self) -> list[str]:
        """This app's roles among the principal's, as they read."""
        return [r for r in ROLES if r in self.roles]


def unreadable(header: str, why: str) -> Principal:
    """Who a request is whose principal ``header`` is believed here but cannot be read:
    nobody, with no role, refused everything but the public routes (never a key caller,
    which a request with no principal is)."""
    return Principal(
        "(an unreadable principal header)",
        frozenset(),
        "unreadable",
        f"the {header} header cannot be read ({why}), so this request is nobody's: neither "
        "a person nor a key caller. Send a well-formed header or none",
    )


def parse_dev_principal(text: str) -> Principal:
    """``<name>; roles=<role>,<role>`` (``roles=`` empty or left out: no role). Raises
    ``ValueError`` with a sentence for anything else."""
    name, _, rest = text.partition(";")
    name = clean_name(name)
    if not name:
        raise ValueError(
            f"a development principal is '<name>; roles={OPERATOR}', got {text[:80]!r}"
        )
    roles: set[str] = set()
    rest = rest.strip()
    if rest:
        key, equals, values = rest.partition("=")
        if key.strip().lower() != "roles" or not equals:
            raise ValueError(f"after the name comes 'roles=<role>,<role>', got {rest[:80]!r}")
        roles = {r.strip() for r in values.split(",") if r.strip()}
        unknown = roles - set(ROLES)
        if unknown:
            raise ValueError(
                f"unknown role {sorted(unknown)[0]!r}: the roles are {', '.join(ROLES)}"
            )
    return Principal(name, frozenset(roles), "devhost")


def _claims(document: Any) -> list[tuple[str, str]] | None:
    if not isinstance(document, dict) or not isinstance(document.get("claims"), list):
        return None
    claims = []
    for claim in document["claims"]:
        if not isinstance(claim, dict):
            return None
        typ, val = claim.get("typ"), claim.get("val")
        if not isinstance(typ, str) or not isinstance(val, str):
            return None
        claims.append((typ, val))
    return claims


def _first(claims: Iterable[tuple[str, str]], types: Iterable[str]) -> str:
    by_type: dict[str, str] = {}
    for typ, val in claims:
        by_type.setdefault(typ, val)
    for typ in types:
        name = clean_name(by_type.get(typ))
        if name:
            return name
    return ""


def from_client_principal(encoded: str, name: str | None, client_id: str) -> Principal | None:
    """The principal App Service authentication describes in ``X-MS-CLIENT-PRINCIPAL``
    (``encoded``; ``name``: ``X-MS-CLIENT-PRINCIPAL-NAME``), or None when the header is
    not one it wrote: not base64 of a JSON object with ``claims``, too long, naming no
    one, or issued for another app (an ``aud`` claim that is not ``client_id``)."""
    text = encoded.strip()
    if not text or len(text) > MAX_HEADER_CHARS:
        return None
    try:
        raw = base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
        document = json.loads(raw.decode("utf-8"))
    except (binascii.Error, ValueError, RecursionError):  # (UnicodeDecodeError: ValueError)
        return None
    claims = _claims(document)
    if claims is None:
        return None
    role_typ = document.get("role_typ")
    role_types = ROLE_CLAIMS | ({role_typ} if isinstance(role_typ, str) else set())
    roles = frozenset(val for typ, val in claims if typ in role_types)
    audiences = {val for typ, val in claims if typ == "aud"}
    if audiences and not audiences & {client_id, f"api://{client_id}"}:
        return None
    name_typ = document.get("name_typ")
    named = clean_name(name) or _first(
        claims, ((name_typ,) if isinstance(name_typ, str) else ()) + NAME_CLAIMS
    )
    return Principal(named, roles, "entra") if named else None


def _lowered(headers: Mapping[str, str]) -> dict[str, str]:
    return {k.lower(): v for k, v in headers.items()}


@dataclass(frozen=True)
class SignIn:
    """How this app knows its callers (read once from the settings)."""

    #: ``SIGN_IN_CLIENT_ID``: the app registration people sign in to; Bicep sets it with
    #: sign-in. Set, a key caller may no longer change anything (a person must).
    client_id: str | None = None
    #: ``WEBSITE_AUTH_ENABLED``: the platform's authentication module is on.
    platform: bool = False
    #: ``ORDERS_DEV_PRINCIPAL`` (devhost only): who a request without a principal of its
    #: own and without a key is; X-Dev-Principal is believed while it is set.
    dev_default: Principal | None = field(default=None)

    @property
    def entra(self) -> bool:
        """X-MS-CLIENT-PRINCIPAL is the platform's: sign-in configured and on."""
        return bool(self.client_id) and self.platform

    @property
    def configured(self) -> bool:
        return bool(self.client_id)

    def principal(self, headers: Mapping[str, str], params: Mapping[str, str]) -> Principal | None:
        """The request's principal, from the one source believed here; None: none."""
        named = _lowered(headers)
        if self.entra:
            encoded = named.get(CLIENT_PRINCIPAL)
            if encoded is None or self.client_id is None:
                return None  # a key caller (the Functions host checked the key)
            found = from_client_principal(encoded, named.get(CLIENT_PRINCIPAL_NAME), self.client_id)
            return found or unreadable(
                "X-MS-CLIENT-PRINCIPAL",
                "not the platform's description of a principal signed in to this app",
            )
        if self.dev_default is None:
            return None  # any principal header is the client's own: ignored
        sent = named.get(DEV_PRINCIPAL_HEADER)
        if sent is not None:
            try:
                return parse_dev_principal(sent)
            except ValueError as exc:
                return unreadable("X-Dev-Principal", str(exc))
        if params.get(KEY_PARAM) or named.get(KEY_HEADER):
            return None  # a key caller, as in Azure
        return self.dev_default


@dataclass(frozen=True)
class Refusal:
    """Why a request may not do what it asks: 401, no principal where one is needed (sign
    in); 403, a principal (or key caller) without the role it needs."""

    status: int
    reason: str
    role: str | None = None
    #: a browser may be sent to the sign-in page
    sign_in: bool = False


SIGN_IN_OFF: Final = (
    "The console needs sign-in (App Service authentication with Microsoft Entra ID) and "
    "it is not configured here: deploy with AZURE_AUTH_CLIENT_ID naming an app "
    "registration with the app roles Orders.Reader and Orders.Operator (docs/deployment.md, "
    '"Sign-in and roles"). The function key does not open the console.'
)
KEY_ON_DEVHOST: Final = (
    "A request with a function key is a machine's, and the console serves people only: "
    "open it without ?code= (devhost's development principal, ORDERS_DEV_PRINCIPAL) or "
    "send X-Dev-Principal."
)
PLATFORM_OFF: Final = (
    "Sign-in is configured (SIGN_IN_CLIENT_ID) but App Service authentication is off, so "
    "no one can be known: turn it on again (az webapp auth update --enabled true)."
)


def refusal(
    principal: Principal | None, access: Access, sign_in: SignIn, *, console: bool
) -> Refusal | None:
    """None when ``principal`` (None: no principal, a key caller on the API) may do
    ``access`` on the console (``console``) or the operator API; else why not."""
    if access is Access.PUBLIC:
        return None
    if principal is not None and principal.unreadable:
        return Refusal(403, principal.unreadable)
    if principal is None:
        if console:
            if sign_in.entra:
                return Refusal(401, "Sign in to use the console.", sign_in=True)
            if sign_in.dev_default is not None:
                return Refusal(403, KEY_ON_DEVHOST)
            return Refusal(403, PLATFORM_OFF if sign_in.configured else SIGN_IN_OFF)
        if access is Access.EVENT:
            return Refusal(
                403,
                f"an event is a person's decision (the {OPERATOR} role) or a remote's answer "
                "on the URL its step gave it (events_url, with its token): a function key "
                "alone delivers nothing",
                OPERATOR,
            )
        if access is Access.CHANGE and sign_in.configured:
            return Refusal(
                403,
                f"a change needs a signed-in person or application with the {OPERATOR} role: "
                "send its Entra ID token (Authorization: Bearer) with the function key; the "
                "key alone may read and deliver events",
                OPERATOR,
            )
        return None
    if principal.may(access):
        return None
    need = NEEDS[access]
    held = " and ".join(principal.app_roles) or "no role of this app"
    doing = "reading" if access is Access.READ else "a change"
    return Refusal(
        403,
        f"{principal.name} has {held}; {doing} needs {need} (an app role of the app "
        "registration: its owner assigns it)",
        need,
    )

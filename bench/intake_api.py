"""``outloop bench intake --provider gmail|graph``: messages per second from a Gmail API or
Microsoft Graph mailbox to claimed, triaged tasks, against bare HTTP fetches of the same
messages with the same client in the same run.

The bench starts its own throwaway mock providers (``outloop fixtures serve`` on a free
loopback port, its own process: ``fixtures/admin.py``'s ``MockServer``, which the CLI hands
in), creates one account of the provider (``google`` for Gmail, ``microsoft`` for Graph) and
delivers ``messages`` synthetic client messages to its inbox through the admin API, one
request a message (``POST /_admin/deliver``), ``per_thread`` to a thread: the same messages
as ``bench/intake_imap.py``'s (``intake_common.raw_message``), threaded by the mock as its
provider would. The fill is timed, and done, before anything is measured.

One side is the product: one whole intake cycle (``intake.run_cycle``: scan - list, read,
normalize, resolve, key and record each page with its cursor - then claim, triage and
report each item, then reconcile) of a workspace whose mailbox is that API mailbox (a
Workspace Context with ``provider: google|microsoft`` and an ``api`` block naming the mock's
endpoints), through the adapter (``GmailApiProvider``, ``GraphMailProvider``) on an
``ApiClient`` built by ``oauth_api_client`` with the mailbox's OAuth secrets, into a fresh
SQLite store in the scratch directory (WAL, ``synchronous=FULL``). The other, the baseline,
fetches the same messages with an ``ApiClient`` built the same way (the same parallelism,
its own token refresh): it lists the inbox's ids page by page and GETs every message in the
format the adapter reads, the pages and the concurrency as the adapter's, each answer's
JSON decoded, and does nothing with them. After a warm-up fetch, the two sides run
``rounds`` times, alternating which goes first; each intake round has a fresh store, and
each round's baseline is ``BARE_REPEATS`` bare fetches in a row.

``duplicates``, ``lost`` and the store's figures are counted as for IMAP
(``bench/intake_common.py``). ``intake_breakdown`` times every HTTP request
(``httpx.AsyncClient.send``, by method and path, ids masked; the token refresh included)
and the normalization, and the store's methods (outermost calls). Requests run
concurrently, so a request's own seconds overlap; ``http_s`` is the wall time during which at
least one request was in flight and neither normalization nor the store held the event loop,
so ``http_s``, ``normalize_s``, ``store_s`` and ``core_s`` (the rest: planning, triage, the
models, the adapter's own work between requests) add up to the round.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import quote

import anyio
import httpx

from agent.domain.context import ApiAccess, MailboxBinding
from agent.domain.errors import ProviderError
from agent.domain.secrets import Secret
from agent.ports import MailProvider
from agent.providers.api_http import ApiClient, ErrorReader, oauth_api_client
from agent.testing.contexts import context_yaml
from bench import choices
from bench.intake_common import (
    MAILBOX,
    ROUNDS,
    WORKSPACE,
    BenchError,
    Shape,
    Sides,
    Timers,
    Wire,
    checked,
    figures,
    measure,
    raw_message,
    timing,
)

PROVIDERS = choices.API_PROVIDERS
BARE_REPEATS = 2
"""Bare fetches per round (each is a few thousand requests: seconds, not a moment)."""
PAGE_SIZE = 100
"""The adapters' default page (``page_size``): messages listed, and read, per page."""
WIRE = Wire(prefix="http", by="http_by_request")
MASKED = frozenset({"messages", "threads", "drafts"})
"""Path segments followed by an id, masked in the request names."""


@dataclass(frozen=True)
class Api:
    """One provider's API as the bench reaches it."""

    kind: str
    """The mail system as the Workspace Context names it (google, microsoft)."""
    base: str
    token: str
    """The mock's API root and token endpoint, under its base URL."""


APIS = {
    "gmail": Api("google", "/gmail/v1", "/oauth2/google/token"),
    "graph": Api("microsoft", "/graph/v1.0", "/oauth2/microsoft/common/oauth2/v2.0/token"),
}


class MockAdmin(Protocol):
    """What the bench uses of the mock providers' admin API: ``fixtures.admin.MockAdmin``
    (the benchmarks import nothing of the fixtures; see the dependency rule in
    ARCHITECTURE.md)."""

    @property
    def base_url(self) -> str: ...
    def account(self, address: str, provider: str) -> dict[str, Any]: ...
    def deliver(self, to: str, raw: bytes) -> dict[str, Any]: ...
    def stored(self, address: str, folder: str | None = None) -> list[dict[str, Any]]: ...


class MockServer(Protocol):
    """``fixtures.admin.MockServer``: the mock providers as a child process."""

    def start(self) -> MockAdmin: ...
    def stop(self) -> None: ...


MockServerFactory = Callable[[Path], MockServer]
"""A stopped server that logs its standard error to the given file."""


# -- the mailbox ------------------------------------------------------------------------


def fill(admin: MockAdmin, messages: int, per_thread: int) -> dict[str, Any]:
    """Deliver the messages to the account's inbox through the admin API, one request a
    message (the mock threads each as its provider would), and check the inbox holds them."""
    started = time.perf_counter()
    written = 0
    for number in range(messages):
        raw = raw_message(number, per_thread)
        admin.deliver(MAILBOX, raw)
        written += len(raw)
    delivered = time.perf_counter() - started
    shown = len(admin.stored(MAILBOX, "inbox"))
    if shown != messages:
        raise BenchError(f"the mock's inbox holds {shown} of the {messages} messages delivered")
    return {
        "method": "admin API POST /_admin/deliver, one request a message",
        "deliver_s": round(delivered, 3),
        "per_message_ms": round(delivered / messages * 1000, 3),
        "bytes": written,
    }


# -- timers -------------------------------------------------------------------------------


def _http_label(name: str, args: tuple[Any, ...]) -> str:
    """``http.GET users/me/messages/{id}``: the method and the path under the API's root,
    ids masked; the token endpoint is ``http.POST token``."""
    request = args[1] if len(args) > 1 else None
    if not isinstance(request, httpx.Request):
        return name
    path = request.url.path
    if "/oauth2/" in path:
        return f"{name}.{request.method} token"
    for api in APIS.values():
        path = path.split(api.base + "/", 1)[-1]
    parts = path.strip("/").split("/")
    masked = ["{id}" if i and parts[i - 1] in MASKED else p for i, p in enumerate(parts)]
    return f"{name}.{request.method} {'/'.join(masked)}"


def timing_http(timers: Timers) -> AbstractContextManager[None]:
    """Time every HTTP request (``httpx.AsyncClient.send``: the answer read whole, the
    credential's refresh inside it) and the normalization (both sides run under it alike)."""
    return timing(timers, [(httpx.AsyncClient, "send", "http", _http_label)])


# -- the two sides ------------------------------------------------------------------------


@dataclass
class Mailbox:
    """The mock account the bench reads, its OAuth secrets (a vault of its own: Microsoft's
    rotated refresh token is written back here), and its API."""

    api: Api
    base_url: str
    secrets: dict[str, str]

    @classmethod
    def create(cls, admin: MockAdmin, api: Api) -> Mailbox:
        account = admin.account(MAILBOX, api.kind)
        secrets = {
            "oauth_client_id": account["client_id"],
            "oauth_client_secret": account["client_secret"],
            "oauth_refresh_token": account["refresh_token"],
        }
        return cls(api, admin.base_url, secrets)

    @property
    def access(self) -> ApiAccess:
        return ApiAccess(
            base_url=self.base_url + self.api.base, token_url=self.base_url + self.api.token
        )

    def context_text(self) -> str:
        access = self.access
        block = f"api: {{base_url: '{access.base_url}', token_url: '{access.token_url}'}}"
        return context_yaml(
            WORKSPACE, mailbox=MAILBOX, provider=self.api.kind, mailbox_fields=block
        )

    def client(self, access: ApiAccess, read_error: ErrorReader) -> ApiClient:
        """A client signed with the account's secrets, as the station builds one."""
        return oauth_api_client(
            access,
            MAILBOX,
            base_url=access.base_url or "",
            token_url=access.token_url or "",
            read_error=read_error,
            read=lambda name: Secret(self.secrets[name]),
            write=lambda name, value: self.secrets.__setitem__(name, value.reveal()),
            reconnect=f"outloop connect --workspace {WORKSPACE} --mailbox {MAILBOX}",
        )


def _adapter_class(kind: str) -> tuple[Callable[..., MailProvider], ErrorReader]:
    """The adapter and its error reader (imported when first needed, as the station does)."""
    if kind == "google":
        from agent.providers import gmail_api  # noqa: PLC0415

        return gmail_api.GmailApiProvider, gmail_api.read_error
    from agent.providers import msgraph  # noqa: PLC0415

    return msgraph.GraphMailProvider, msgraph.read_error


def adapter(mailbox: Mailbox, binding: MailboxBinding) -> MailProvider:
    """The product's channel for the workspace's binding: the adapter on its own client."""
    provider_class, read_error = _adapter_class(mailbox.api.kind)
    client = mailbox.client(binding.api, read_error)
    return provider_class(client, binding.mailbox_id, page_size=PAGE_SIZE)


async def _gmail_bare(client: ApiClient) -> int:
    """Every inbox id, page by page (``messages.list``), and each page's messages
    ``format=raw`` at once (the client bounds how many run), as the adapter reads them."""
    fetched = 0
    token: str | None = None
    while True:
        params: dict[str, Any] = {"labelIds": "INBOX", "maxResults": PAGE_SIZE}
        if token:
            params["pageToken"] = token
        listing = await client.json("GET", "users/me/messages", params=params)
        fetched += await _each(
            [f"users/me/messages/{ref['id']}" for ref in listing.get("messages", [])],
            lambda path: client.json("GET", path, params={"format": "raw"}),
            lambda body: bool(body.get("raw")),
        )
        token = listing.get("nextPageToken")
        if not token:
            return fetched


GRAPH_HEADERS = {"Prefer": 'IdType="ImmutableId"'}
"""What the Graph adapter asks every request with."""


async def _graph_bare(client: ApiClient) -> int:
    """Every inbox id, page by page (oldest first, following ``@odata.nextLink``), and each
    page's messages as MIME (``$value``) at once, as the adapter reads them."""
    fetched = 0
    url: str | None = "me/mailFolders/inbox/messages"
    params: dict[str, Any] | None = {
        "$select": "id,conversationId,receivedDateTime",
        "$orderby": "receivedDateTime asc",
        "$top": str(PAGE_SIZE),
    }
    while url:
        page = await client.json("GET", url, params=params, headers=GRAPH_HEADERS)
        fetched += await _each(
            [f"me/messages/{quote(item['id'], safe='')}/$value" for item in page["value"]],
            lambda path: client.call("GET", path, headers=GRAPH_HEADERS),
            lambda response: bool(response.content),
        )
        url, params = page.get("@odata.nextLink"), None
    return fetched


async def _each(
    paths: list[str], get: Callable[[str], Awaitable[Any]], holds: Callable[[Any], bool]
) -> int:
    """GET every path at once (the client bounds how many are in flight); how many answers
    hold the message. The first failure stops the rest and is raised as it is."""
    got: list[bool] = []
    failed: list[ProviderError] = []

    async def one(path: str, scope: anyio.CancelScope) -> None:
        try:
            got.append(holds(await get(path)))
        except ProviderError as exc:
            failed.append(exc)
            scope.cancel()

    async with anyio.create_task_group() as group:
        for path in paths:
            group.start_soon(one, path, group.cancel_scope)
    if failed:
        raise failed[0]
    return sum(got)


async def bare_fetch(mailbox: Mailbox) -> tuple[float, int]:
    """A fresh client (its own token refresh) fetches the whole inbox; the seconds it took
    and the messages fetched."""
    _provider, read_error = _adapter_class(mailbox.api.kind)
    client = mailbox.client(mailbox.access, read_error)
    started = time.perf_counter()
    try:
        if mailbox.api.kind == "google":
            fetched = await _gmail_bare(client)
        else:
            fetched = await _graph_bare(client)
    except ProviderError as exc:
        raise BenchError(
            f"the bare fetch of the mock {mailbox.api.kind} mailbox failed: {exc}"
        ) from exc
    finally:
        await client.aclose()
    return time.perf_counter() - started, fetched


# -- the run ------------------------------------------------------------------------------


def run(
    scratch: Path,
    mock: MockServerFactory,
    *,
    provider: str = "gmail",
    messages: int = 2000,
    per_thread: int = 4,
    rounds: int = ROUNDS,
    progress: Callable[[str], None] = lambda _line: None,
) -> dict[str, Any]:
    """Measure intake against the bare fetch in ``scratch`` (a fresh directory), on a
    throwaway mock server ``mock(scratch / "mock-providers.log")`` started, and stopped,
    here."""
    checked(provider, PROVIDERS, messages, per_thread, rounds)
    api = APIS[provider]
    scratch.mkdir(parents=True, exist_ok=True)
    server = mock(scratch / "mock-providers.log")
    try:
        progress("starting throwaway mock providers on 127.0.0.1")
        admin = server.start()
        mailbox = Mailbox.create(admin, api)
        progress(f"delivering {messages} messages to the inbox, {per_thread} to a thread")
        filled = fill(admin, messages, per_thread)
        sides = Sides(
            bare=partial(bare_fetch, mailbox),
            context_text=mailbox.context_text(),
            adapter_for=partial(adapter, mailbox),
            timing=timing_http,
            bare_repeats=BARE_REPEATS,
        )
        totals = anyio.run(measure, scratch, sides, messages, per_thread, rounds, progress)
    finally:
        server.stop()
    shape = Shape(provider, messages, per_thread, rounds, PAGE_SIZE, BARE_REPEATS, WIRE)
    return figures(totals, shape, filled, _includes(provider))


def _includes(provider: str) -> dict[str, str]:
    adapter_name = "GmailApiProvider" if provider == "gmail" else "GraphMailProvider"
    reads = (
        "users.messages.list of the inbox, then users.messages.get format=raw of each"
        if provider == "gmail"
        else "mailFolders/inbox/messages ($select id,conversationId,receivedDateTime, oldest "
        "first), then messages/{id}/$value (the MIME) of each"
    )
    return {
        "intake": f"intake.run_cycle through {adapter_name} on an ApiClient into a fresh "
        "SQLite store (WAL, synchronous=FULL): refresh the token, read every page "
        f"({reads}), normalize, resolve, key, record; claim, triage, report each item; "
        "reconcile",
        "bare": f"the same ApiClient: refresh the token, {reads}, in pages of {PAGE_SIZE}, "
        "a page's messages at once within the client's parallelism, each answer read whole "
        "(a JSON answer decoded); nothing else",
    }

"""One IMAP connection, with every failure translated into the port's errors.

Built on aioimaplib (the maintained asyncio IMAP4rev1 client): it runs on the same event loop
as the rest of Outloop and leaves the protocol's grammar to us (``imap_wire``). Two of its
habits are contained here: it logs every line it sends and receives at DEBUG, credentials
included (its scrubbing misses a quoted or base64 form), so its logger is kept above DEBUG;
and it raises its own errors, or the event loop's, which become ``TransientFailure`` (the
connection dropped or timed out: try again), ``AuthenticationExpired`` (the server refused
the login) or ``ProviderError`` (it answered something that is not IMAP).

Commands are read-only except APPEND (our sent copy). Mail is fetched with ``BODY.PEEK`` so
reading never marks it seen, and folders are opened with EXAMINE (read-only) where nothing
is written.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import ssl
from base64 import b64encode
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import aioimaplib  # pyright: ignore[reportMissingTypeStubs]

from agent.domain.context import MailServer, Security
from agent.domain.errors import AuthenticationExpired, ProviderError, TransientFailure
from agent.domain.secrets import Secret
from agent.providers import imap_wire
from agent.providers.imap_wire import ImapSyntaxError, Value

_lib: Any = aioimaplib
"""The client library, untyped: everything taken from it is checked here."""
_ImapError: type[Exception] = _lib.AioImapException
_CommandTimeout: type[Exception] = _lib.CommandTimeout

logging.getLogger("aioimaplib.aioimaplib").setLevel(logging.INFO)
logging.getLogger("aioimaplib").setLevel(logging.INFO)

Lines = list[bytes | bytearray]


@dataclass(frozen=True)
class FolderStatus:
    """What opening a folder told us."""

    name: bytes
    uidvalidity: int
    uidnext: int | None
    highestmodseq: int | None


PasswordSource = Callable[[], Secret]
"""Where a channel reads its password at each sign-in (the vault: a password changed there
is used from the next sign-in on)."""


def password_source(password: Secret | PasswordSource) -> PasswordSource:
    if isinstance(password, Secret):
        return lambda: password
    return password


class ImapSession:
    """A logged-in IMAP connection to one mailbox, opened on first use."""

    def __init__(
        self, server: MailServer, mailbox_id: str, password: Secret | PasswordSource
    ) -> None:
        self._server = server
        self._mailbox_id = mailbox_id
        self._password = password_source(password)
        self._client: Any = None
        self._selected: FolderStatus | None = None
        self._readonly = True

    @property
    def where(self) -> str:
        imap = self._server.imap
        return f"{imap.host}:{imap.port_for('imap')}"

    @property
    def username(self) -> str:
        return self._server.username or self._mailbox_id

    def _fix(self) -> str:
        return (
            f"check server.imap of mailbox {self._mailbox_id} in the Workspace Context and "
            "that the server is up"
        )

    def dropped(self, what: str, exc: BaseException | None) -> TransientFailure:
        reason = f" ({type(exc).__name__}: {exc})" if exc is not None and str(exc) else ""
        return TransientFailure(
            f"mailbox {self._mailbox_id}: the IMAP connection to {self.where} {what}{reason}; "
            f"it is retried, and if it persists, {self._fix()}"
        )

    def garbled(self, exc: Exception) -> ProviderError:
        return ProviderError(
            f"mailbox {self._mailbox_id}: the IMAP server at {self.where} answered something "
            f"that is not IMAP ({exc}); {self._fix()} (is it an IMAP port?)"
        )

    @property
    def capabilities(self) -> frozenset[str]:
        client = self._client
        if client is None:
            return frozenset()
        found: set[str] = client.protocol.capabilities  # pyright: ignore[reportUnknownMemberType]
        return frozenset(c.upper() for c in found)

    async def client(self) -> Any:
        """The connection, opened anew when there is none or the server closed it (an
        idle connection is dropped by servers after a while)."""
        if self._client is not None and self._client.protocol.state == _lib.LOGOUT:
            await self.discard()
        if self._client is None:
            self._client = await self._connect()
        return self._client

    async def _connect(self) -> Any:
        imap = self._server.imap
        port = imap.port_for("imap")
        timeout = self._server.timeout_seconds
        lost = _LostConnection()
        context = None
        if imap.security is Security.TLS:
            try:
                context = tls_context(self._server.ca_file)
            except ProviderError as exc:
                raise ProviderError(f"mailbox {self._mailbox_id}: {exc}") from None
        # The base client takes both a TLS context and the lost-connection callback (the
        # TLS subclass drops the callback).
        client = _lib.IMAP4(
            host=imap.host, port=port, timeout=timeout, conn_lost_cb=lost, ssl_context=context
        )
        lost.protocol = client.protocol
        _guard(client.protocol)
        try:
            await self._greeted(client)
            await self._login(client)
        except BaseException:
            _close_transport(client)
            raise
        return client

    async def _greeted(self, client: Any) -> None:
        try:
            await client.wait_hello_from_server()
        except ssl.SSLError as exc:
            raise tls_refused(self._mailbox_id, self.where, exc) from None
        except _DROPPED as exc:
            raise self.dropped("could not be opened", exc) from None
        except _ImapError as exc:
            raise self.garbled(exc) from None

    async def _login(self, client: Any) -> None:
        """AUTHENTICATE PLAIN with an initial response where the server offers it (any
        password bytes pass), else LOGIN. The password is written to the connection and
        nowhere else: the command the client library keeps (which its errors and logs
        print) holds ``[redacted]`` in its place, and no error of the login quotes the
        library's text."""
        protocol = client.protocol
        caps = {c.upper() for c in protocol.capabilities}  # pyright: ignore[reportUnknownMemberType,reportUnknownVariableType]
        password = self._password().reveal()
        if "AUTH=PLAIN" in caps and "SASL-IR" in caps:
            blob = b64encode(b"\0" + self.username.encode() + b"\0" + password.encode())
            wire = ("AUTHENTICATE", "PLAIN", blob.decode("ascii"))
        else:
            wire = ("LOGIN", _quoted(self.username), _quoted(password))
        try:
            response = await asyncio.wait_for(_secret_command(protocol, wire), client.timeout)
        except (*_DROPPED, _CommandTimeout):
            raise self.dropped("dropped during the login", None) from None
        except _ImapError:
            raise self.garbled(ImapSyntaxError("an answer to the login that is not IMAP")) from None
        if response.result != "OK":
            detail = _last_text(response.lines)
            raise AuthenticationExpired(
                f"mailbox {self._mailbox_id}: the IMAP server at {self.where} refused the login "
                f"of {self.username} ({detail}); store the right password (or app password) "
                f"with 'outloop vault set WORKSPACE {self._mailbox_id} {self._server.password}'"
            )
        protocol.state = _lib.AUTH
        await self._refresh_capabilities(client)

    async def _refresh_capabilities(self, client: Any) -> None:
        try:
            await client.protocol.capability()
        except _ImapError as exc:
            raise self.garbled(exc) from None

    async def run(self, what: str, command: Any) -> Lines:
        """Run a command; its untagged lines, or the error it met."""
        client = await self.client()
        try:
            response = await asyncio.wait_for(client.protocol.execute(command), client.timeout)
        except (*_DROPPED, _CommandTimeout) as exc:
            await self.discard()
            raise self.dropped(f"dropped during {what}", exc) from None
        except _ImapError as exc:
            await self.discard()
            raise self.garbled(exc) from None
        if client.protocol.state in (_lib.LOGOUT, _lib.CONNECTED):
            await self.discard()
            raise self.dropped(f"was closed by the server during {what}", None)
        if response.result != "OK":
            text = _last_text(response.lines)
            if response.result not in ("NO", "BAD") or _TEMPORARY.search(text):
                await self.discard()
                raise self.dropped(f"ended during {what}", None)
            raise ProviderError(
                f"mailbox {self._mailbox_id}: the IMAP server at {self.where} refused {what} "
                f"({response.result} {text})"
            )
        return list(response.lines[:-1])

    async def command(self, name: str, *args: str, prefix: str | None = None) -> Any:
        """A command on the connection (opened first if need be)."""
        client = await self.client()
        return _lib.Command(
            name, client.protocol.new_tag(), *args, prefix=prefix, loop=client.protocol.loop
        )

    async def open_folder(self, name: bytes, *, writable: bool = False) -> FolderStatus:
        """EXAMINE (or SELECT, to append) a folder, with CONDSTORE where the server has it.
        A connection the server cannot serve any more (its folder was rebuilt under it: a
        temporary ``NO [SERVERBUG]`` or ``[UNAVAILABLE]``, RFC 5530) is replaced once."""
        try:
            return await self._open_folder(name, writable)
        except TransientFailure:
            return await self._open_folder(name, writable)

    async def _open_folder(self, name: bytes, writable: bool) -> FolderStatus:
        await self.client()
        verb = "SELECT" if writable else "EXAMINE"
        args = [_mailbox_arg(name)]
        if "CONDSTORE" in self.capabilities:
            args.append("(CONDSTORE)")
        shown = name.decode("ascii", "replace")
        lines = await self.run(f"{verb} {shown}", await self._verb(verb, args))
        self._client_state_selected()
        codes = imap_wire.response_codes(lines)
        try:
            status = FolderStatus(
                name=name,
                uidvalidity=int(codes["UIDVALIDITY"]),
                uidnext=int(codes["UIDNEXT"]) if "UIDNEXT" in codes else None,
                highestmodseq=int(codes["HIGHESTMODSEQ"]) if "HIGHESTMODSEQ" in codes else None,
            )
        except (KeyError, ValueError) as exc:
            raise self.garbled(ImapSyntaxError(f"{verb} gave no UIDVALIDITY ({exc})")) from None
        self._selected = status
        return status

    async def _verb(self, verb: str, args: Sequence[str]) -> Any:
        return await self.command(verb, *args)

    def _client_state_selected(self) -> None:
        client = self._client
        assert client is not None
        client.protocol.state = _lib.SELECTED

    async def uid_search(self, criteria: str) -> list[int]:
        lines = await self.run("a search", await self.command("SEARCH", criteria, prefix="UID"))
        try:
            return imap_wire.search_uids(lines)
        except ImapSyntaxError as exc:
            raise self.garbled(exc) from None

    async def uid_fetch(self, uids: Sequence[int], items: str) -> list[dict[bytes, Value]]:
        if not uids:
            return []
        client = await self.client()
        command = _lib.FetchCommand(
            client.protocol.new_tag(),
            _uid_set(uids),
            items,
            prefix="UID",
            loop=client.protocol.loop,
        )
        lines = await self.run("a fetch", command)
        try:
            return imap_wire.fetch_items(lines)
        except ImapSyntaxError as exc:
            await self.discard()
            raise self.garbled(exc) from None

    async def uid_thread(self, algorithm: str) -> list[list[int]]:
        lines = await self.run(
            "threading", await self.command("THREAD", algorithm, "UTF-8", "ALL", prefix="UID")
        )
        threads: list[list[int]] = []
        try:
            for line in lines:
                raw = bytes(line).strip()
                if raw.upper().startswith(b"THREAD"):
                    raw = raw[len(b"THREAD") :]
                threads.extend(imap_wire.threads(raw))
        except ImapSyntaxError as exc:
            raise self.garbled(exc) from None
        return threads

    async def sent_folder(self) -> bytes:
        """The folder the server marks ``\\Sent`` (RFC 6154), else one named Sent."""
        lines = await self.run("listing folders", await self.command("LIST", '""', '"*"'))
        try:
            entries = imap_wire.list_entries(lines)
        except ImapSyntaxError as exc:
            raise self.garbled(exc) from None
        for attributes, name in entries:
            if "\\sent" in attributes:
                return name
        for _, name in entries:
            if name.lower() in (b"sent", b"sent items", b"sent messages", b"inbox.sent"):
                return name
        raise ProviderError(
            f"mailbox {self._mailbox_id}: the IMAP server at {self.where} has no folder marked "
            "\\Sent (RFC 6154) and none named Sent: create one, or set "
            "submission_keeps_sent_copy if the server files sent copies itself"
        )

    async def append(self, folder: bytes, raw: bytes) -> tuple[int, int] | None:
        """APPEND ``raw`` to ``folder`` (seen, as a mail program files what it sent); the new
        message's UIDVALIDITY and UID when the server says (UIDPLUS)."""
        client = await self.client()
        try:
            response = await asyncio.wait_for(
                client.append(raw, mailbox=_mailbox_arg(folder), flags="(\\Seen)"),
                client.timeout,
            )
        except (*_DROPPED, _CommandTimeout) as exc:
            await self.discard()
            raise self.dropped("dropped while filing the sent copy", exc) from None
        except _ImapError as exc:
            await self.discard()
            raise self.garbled(exc) from None
        if response.result != "OK":
            raise ProviderError(
                f"mailbox {self._mailbox_id}: the IMAP server refused to file the sent copy in "
                f"{folder.decode('utf-7', 'replace')} ({_last_text(response.lines)})"
            )
        codes = imap_wire.response_codes(response.lines)
        found = codes.get("APPENDUID", "").split()
        if len(found) == 2 and found[0].isdigit() and found[1].isdigit():
            return int(found[0]), int(found[1])
        return None

    async def discard(self) -> None:
        """Drop the connection (after an error: the next call opens a new one)."""
        client, self._client, self._selected = self._client, None, None
        if client is not None:
            _close_transport(client)

    async def close(self) -> None:
        client, self._client, self._selected = self._client, None, None
        if client is None:
            return
        with contextlib.suppress(Exception):  # the connection is going away either way
            await asyncio.wait_for(client.logout(), 5)
        _close_transport(client)


class ConnectionLost(Exception):
    """The connection went while a command waited for its answer."""


class _LostConnection:
    """Fails the commands still waiting when the connection goes (the client would leave
    them waiting for their timeout)."""

    def __init__(self) -> None:
        self.protocol: Any = None

    def __call__(self, exc: Exception | None) -> None:
        protocol = self.protocol
        if protocol is None:
            return
        protocol.state = _lib.LOGOUT
        waiting = [protocol.pending_sync_command, *protocol.pending_async_commands.values()]
        for command in waiting:
            if command is not None:
                # Never the library's text: it may print a pending command's arguments.
                command._exception = ConnectionLost("connection lost")
                command.close(b"connection lost", "KO")


_TEMPORARY = re.compile(r"^\[(SERVERBUG|UNAVAILABLE|INUSE)\]")
"""Response codes of a NO that may pass (RFC 5530): the connection is replaced."""
_DROPPED = (OSError, TimeoutError, asyncio.TimeoutError, ConnectionLost)


def tls_context(ca_file: str | None) -> ssl.SSLContext:
    """A client TLS context verifying against the system's authorities, or ``ca_file``'s;
    ``ProviderError`` saying so when that file cannot be read as PEM certificates."""
    try:
        return ssl.create_default_context(cafile=ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise ProviderError(
            f"server.ca_file {ca_file!r} cannot be read as PEM certificates "
            f"({type(exc).__name__}: {getattr(exc, 'strerror', None) or exc}); fix the path "
            "in the Workspace Context"
        ) from None


def tls_refused(mailbox_id: str, where: str, exc: ssl.SSLError) -> ProviderError:
    """TLS with a server failed: never retried, never downgraded."""
    reason = getattr(exc, "verify_message", None) or exc.reason or str(exc)
    return ProviderError(
        f"mailbox {mailbox_id}: TLS with {where} failed ({reason}); if its certificate is "
        "issued by an internal authority, set server.ca_file to that authority's PEM file, "
        "else fix the server's certificate (nothing is sent or read without a verified one)"
    )


async def _secret_command(protocol: Any, wire: tuple[str, ...]) -> Any:
    """Run a command that carries a secret as the client library runs a synchronous one,
    but with the kept command showing ``[redacted]`` for its arguments: the real line goes
    to the connection only."""
    command = _lib.Command(wire[0], protocol.new_tag(), "[redacted]", loop=protocol.loop)
    if protocol.pending_sync_command is not None:
        await protocol.pending_sync_command.wait()
    protocol.pending_sync_command = command
    line = " ".join((command.tag, *wire)) + "\r\n"
    protocol.transport.write(line.encode("utf-8"))
    await command.wait()
    return command.response


def _quoted(text: str) -> str:
    """An IMAP quoted string (RFC 3501): backslash and double quote escaped."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _guard(protocol: Any) -> None:
    """An answer the client library cannot follow (a tagged answer out of turn) makes it
    raise inside the event loop's callback; the connection is closed instead, which fails
    the waiting command as a dropped connection."""
    receive = protocol.data_received

    def guarded(data: bytes) -> None:
        try:
            receive(data)
        except Exception:  # the library's text may quote a pending command: not kept
            transport = protocol.transport
            if transport is not None:
                transport.close()

    protocol.data_received = guarded


def _close_transport(client: Any) -> None:
    transport = client.protocol.transport
    if transport is not None:
        transport.close()


def _uid_set(uids: Sequence[int]) -> str:
    """``1:3,7`` for 1, 2, 3, 7."""
    ordered = sorted(set(uids))
    parts: list[str] = []
    start = prev = ordered[0]
    for uid in ordered[1:]:
        if uid == prev + 1:
            prev = uid
            continue
        parts.append(f"{start}:{prev}" if prev > start else str(start))
        start = prev = uid
    parts.append(f"{start}:{prev}" if prev > start else str(start))
    return ",".join(parts)


def _mailbox_arg(name: bytes) -> str:
    """A folder name as a quoted IMAP string (names are modified UTF-7: ASCII)."""
    text = name.decode("ascii", "replace")
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _last_text(lines: Sequence[bytes | bytearray]) -> str:
    if not lines:
        return "no reason given"
    return bytes(lines[-1]).decode("utf-8", "replace")[:200]

"""Streamable HTTP: loopback by default, a bearer token always unless explicitly waived on
loopback for local tools."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import signal
import socket
from collections.abc import Callable, Generator
from pathlib import Path
from types import FrameType

import uvicorn
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from pydantic import AnyHttpUrl

from mcp_server.binding import MIN_TOKEN_CHARS, ServeError, is_loopback
from mcp_server.composition import MCP_TOKEN_ENV

TOKEN_ENV = MCP_TOKEN_ENV  # read into Settings.mcp_token by the composition root


class StaticTokenVerifier:
    """Accepts exactly one bearer token, compared in constant time. Only its digest is
    kept, so the token is never held in a form a log or a repr could print."""

    def __init__(self, token: str) -> None:
        if len(token) < MIN_TOKEN_CHARS:
            raise ServeError(
                f"the bearer token in {TOKEN_ENV} has {len(token)} characters; use at least "
                f"{MIN_TOKEN_CHARS} random ones (e.g. python -c 'import secrets; "
                "print(secrets.token_urlsafe(32))')"
            )
        self._digest = hashlib.sha256(token.encode()).digest()

    def __repr__(self) -> str:
        return "StaticTokenVerifier(<token hidden>)"

    async def verify_token(self, token: str) -> AccessToken | None:
        offered = hashlib.sha256(token.encode()).digest()
        if not hmac.compare_digest(offered, self._digest):
            return None
        return AccessToken(token="[hidden]", client_id="outloop-operator", scopes=[])  # noqa: S106


def auth_settings(host: str, port: int) -> AuthSettings:
    """A resource server that checks bearer tokens itself (no OAuth server is run)."""
    shown = f"[{host}]" if ":" in host else host
    return AuthSettings(issuer_url=AnyHttpUrl(f"http://{shown}:{port}"), resource_server_url=None)


def check_binding(host: str, token: str | None, insecure_no_auth: bool) -> None:
    """Refuse the configurations that would expose the lifecycle."""
    if insecure_no_auth and token:
        raise ServeError(f"--insecure-no-auth and {TOKEN_ENV} contradict each other; choose one")
    if insecure_no_auth and not is_loopback(host):
        raise ServeError(
            f"--insecure-no-auth is accepted only on a loopback address, not {host}; set "
            f"{TOKEN_ENV} to serve {host} with a bearer token"
        )
    if not insecure_no_auth and not token:
        raise ServeError(
            f"the HTTP transport requires a bearer token: set {TOKEN_ENV} (at least "
            f"{MIN_TOKEN_CHARS} random characters) and give it to the host as "
            "'Authorization: Bearer <token>'"
        )


def listening_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError as exc:
        sock.close()
        raise ServeError(f"cannot listen on {host}:{port}: {exc.strerror}") from exc
    sock.listen(128)
    return sock


class _Server(uvicorn.Server):
    """Stops cleanly on SIGINT or SIGTERM."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None]:
        def stop(signum: int, frame: FrameType | None) -> None:
            self.should_exit = True

        previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def serve(
    app: Callable[..., object],
    sock: socket.socket,
    on_ready: Callable[[], None],
    tls: tuple[Path | None, Path | None] | None = None,
) -> None:
    """Serve the ASGI app on an already listening socket until SIGINT or SIGTERM (over TLS
    when ``tls`` names a certificate and its key)."""
    cert, key = tls or (None, None)
    config = uvicorn.Config(
        app,
        log_level="warning",
        log_config=None,  # its records go to the process's handlers (text or JSON lines)
        lifespan="on",
        ssl_certfile=str(cert) if cert else None,
        ssl_keyfile=str(key) if key else None,
    )
    server = _Server(config)
    original_startup = server.startup

    async def startup(sockets: list[socket.socket] | None = None) -> None:
        await original_startup(sockets=sockets)
        on_ready()

    server.startup = startup  # type: ignore[method-assign]
    server.run(sockets=[sock])

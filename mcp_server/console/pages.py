"""What every console page shares: the signed-in sessions and their one-time form tokens,
the console's state (store, data directory, vault, clock, audit file), and the helpers a
page uses to render, refuse, and find what the person may see."""

from __future__ import annotations

import json
import secrets
from collections.abc import Awaitable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from agent.domain.errors import OutloopError
from agent.domain.mail import MessageBody
from agent.domain.task import MessageRef, Task
from agent.ports import Clock, EmbeddedStore, Vault
from agent.services import console
from agent.services.gate_check import load_task
from managed_login import console as credentials

COOKIE = "outloop_console"
FORM_COOKIE = "outloop_console_form"
HOST_PREFIX = "__Host-"
"""Before a session: the sign-in form's token, sent back in the form (double submit)."""
SESSION_TTL = timedelta(hours=8)
MAX_FORMS = 64
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]", "::1")
CSP = (
    "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
    "frame-src 'self'; frame-ancestors 'none'; base-uri 'none'"
)
PREVIEW_CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; sandbox"
"""The draft's own HTML, as it will be sent: inline styles only, no script, no fetch."""


class BodyReader(Protocol):
    """Reads an inbound message's body from the task's mailbox."""

    def __call__(self, task: Task, message: MessageRef) -> Awaitable[MessageBody]: ...
    async def aclose(self) -> None: ...


@dataclass
class Session:
    address: str
    expires: datetime
    forms: dict[str, None] = field(default_factory=dict[str, None])
    """The one-time tokens of the forms this session was shown (the newest MAX_FORMS)."""

    def form_token(self) -> str:
        token = secrets.token_urlsafe(24)
        self.forms[token] = None
        while len(self.forms) > MAX_FORMS:
            del self.forms[next(iter(self.forms))]
        return token

    def spend(self, token: str) -> bool:
        return self.forms.pop(token, False) is None


@dataclass
class Console:
    """What the pages need: the store, the data directory, the vault, the clock and the
    sessions."""

    store: EmbeddedStore
    data_root: Path
    vault: Vault
    clock: Clock
    secure: bool
    bodies: BodyReader | None = None
    """Reads an inbound message's body from its mailbox (None: bodies are not shown)."""
    sessions: dict[str, Session] = field(default_factory=dict[str, Session])
    attempts: credentials.Attempts = field(default_factory=credentials.Attempts)

    @property
    def cookie(self) -> str:
        """The session cookie's name: off loopback with the ``__Host-`` prefix, so a
        browser keeps it only when it is Secure, for this host alone, on every path."""
        return f"{HOST_PREFIX}{COOKIE}" if self.secure else COOKIE

    @property
    def form_cookie(self) -> str:
        return f"{HOST_PREFIX}{FORM_COOKIE}" if self.secure else FORM_COOKIE

    @property
    def audit_file(self) -> Path:
        return self.data_root / "console" / "audit.jsonl"

    def audit(self, request: Request, who: str, action: str, outcome: str) -> None:
        """One line per sign-in and decision: who, when, from where, what, and how it ended."""
        self.audit_file.parent.mkdir(parents=True, exist_ok=True)
        line = {
            "at": self.clock.now().isoformat(), "who": who, "from": client_of(request),
            "action": action, "outcome": outcome,
        }  # fmt: skip
        with self.audit_file.open("a", encoding="utf-8") as out:
            out.write(json.dumps(line, ensure_ascii=False) + "\n")

    def session(self, request: Request) -> Session | None:
        now = self.clock.now()
        for sid in [k for k, v in self.sessions.items() if v.expires <= now]:
            del self.sessions[sid]
        return self.sessions.get(request.cookies.get(self.cookie, ""))

    def start(self, address: str) -> str:
        sid = secrets.token_urlsafe(32)
        self.sessions[sid] = Session(address, self.clock.now() + SESSION_TTL)
        return sid

    def workspaces(self, session: Session) -> list[str]:
        """What the person sees now: the live contexts decide on every request (a role
        taken away takes the workspace away at once)."""
        return console.visible_workspaces(console.live_contexts(self.store), session.address)


def client_of(request: Request) -> str:
    return request.client.host if request.client else "unknown"


def templates() -> Environment:
    return Environment(
        loader=PackageLoader("mcp_server.console", "templates"),
        autoescape=select_autoescape(default=True, default_for_string=True),
    )


class PagesBase:
    def __init__(self, app_console: Console, env: Environment) -> None:
        self.c = app_console
        self.env = env

    def render(self, name: str, status: int = 200, **values: Any) -> HTMLResponse:
        return HTMLResponse(self.env.get_template(name).render(**values), status_code=status)

    def refuse(self, session: Session, status: int, message: str) -> HTMLResponse:
        return self.render(
            "error.j2", status, session=session, token=session.form_token(), message=message
        )

    def _needs_session(self, request: Request) -> Session | Response:
        session = self.c.session(request)
        if session is None:
            return RedirectResponse("/signin", status_code=303)
        return session

    def _visible_task(self, request: Request, session: Session) -> Task | None:
        try:
            task = load_task(self.c.store, request.path_params["task_id"])
        except OutloopError:
            return None
        return task if task.workspace_id in self.c.workspaces(session) else None

    def task_for(self, request: Request) -> tuple[Session, Task] | Response:
        """The signed-in person and the task the path names, if they see it; else the
        answer (sign in, or not found)."""
        session = self._needs_session(request)
        if isinstance(session, Response):
            return session
        task = self._visible_task(request, session)
        if task is None:
            return self.refuse(session, 404, "No such task for you.")
        return session, task

    async def spent_form(self, request: Request, session: Session, action: str) -> Any | None:
        """The posted form when its one-time token is this session's (then spent); None,
        audited, when it is forged or replayed."""
        form = await request.form()
        if session.spend(str(form.get("form_token", ""))):
            return form
        self.c.audit(request, session.address, action, "refused: form")
        return None

    def refuse_form(self, session: Session) -> HTMLResponse:
        return self.refuse(session, 403, "This form was already used or is not from this "
                           "console: reload the page and try again.")  # fmt: skip

"""The operator console: a Starlette app that shows the queue and a task, and posts what a
signed-in person decides to the core, which judges it.

Security is behaviour here: every form carries a one-time token bound to the session (a
forged or replayed form is refused), the session cookie is HttpOnly and SameSite=Strict
(and Secure off loopback), every page has a strict Content-Security-Policy, the draft is
previewed in a sandboxed frame with no script, sign-in is rate-limited, and every sign-in
and decision is audited with who, when and from where. No secret is ever rendered.
"""

from __future__ import annotations

import hmac
import json
import secrets
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from agent.domain.approval import Decision
from agent.domain.errors import GateRefused, OutloopError
from agent.domain.secrets import Secret
from agent.domain.states import TERMINAL_STATES, TaskState
from agent.domain.task import QueueEntry, Task
from agent.domain.untrusted import shown
from agent.ports import Clock, EmbeddedStore, Vault
from agent.services import console, drafts
from agent.services.gate_check import load_task
from managed_login import console as credentials

COOKIE = "outloop_console"
FORM_COOKIE = "outloop_console_form"
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
    sessions: dict[str, Session] = field(default_factory=dict[str, Session])
    attempts: credentials.Attempts = field(default_factory=credentials.Attempts)

    @property
    def audit_file(self) -> Path:
        return self.data_root / "console" / "audit.jsonl"

    def audit(self, request: Request, who: str, action: str, outcome: str) -> None:
        """One line per sign-in and decision: who, when, from where, what, and how it ended."""
        self.audit_file.parent.mkdir(parents=True, exist_ok=True)
        line = {
            "at": self.clock.now().isoformat(), "who": who, "from": _client(request),
            "action": action, "outcome": outcome,
        }  # fmt: skip
        with self.audit_file.open("a", encoding="utf-8") as out:
            out.write(json.dumps(line, ensure_ascii=False) + "\n")

    def session(self, request: Request) -> Session | None:
        now = self.clock.now()
        for sid in [k for k, v in self.sessions.items() if v.expires <= now]:
            del self.sessions[sid]
        return self.sessions.get(request.cookies.get(COOKIE, ""))

    def start(self, address: str) -> str:
        sid = secrets.token_urlsafe(32)
        self.sessions[sid] = Session(address, self.clock.now() + SESSION_TTL)
        return sid

    def workspaces(self, session: Session) -> list[str]:
        """What the person sees now: the live contexts decide on every request (a role
        taken away takes the workspace away at once)."""
        return console.visible_workspaces(console.live_contexts(self.store), session.address)


def _client(request: Request) -> str:
    return request.client.host if request.client else "unknown"


def templates() -> Environment:
    return Environment(
        loader=PackageLoader("mcp_server.console", "templates"),
        autoescape=select_autoescape(default=True, default_for_string=True),
    )


class _Headers(BaseHTTPMiddleware):
    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        response = await call_next(request)
        response.headers.setdefault("Content-Security-Policy", CSP)
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Referrer-Policy"] = "no-referrer"
        response.headers["Cache-Control"] = "no-store"
        return response


def build_app(app_console: Console, hosts: tuple[str, ...] = LOOPBACK_HOSTS) -> Starlette:
    """The console's pages; requests naming another host are refused (DNS rebinding)."""
    pages = _Pages(app_console, templates())
    routes = [
        Route("/signin", pages.signin_form, methods=["GET"]),
        Route("/signin", pages.signin, methods=["POST"]),
        Route("/signin/link", pages.link_form, methods=["GET"]),
        Route("/signin/link", pages.signin_link, methods=["POST"]),
        Route("/signout", pages.signout, methods=["POST"]),
        Route("/", pages.home, methods=["GET"]),
        Route("/console.css", pages.stylesheet, methods=["GET"]),
        Route("/workspaces/{workspace_id}", pages.queue, methods=["GET"]),
        Route("/tasks/{task_id}", pages.task, methods=["GET"]),
        Route("/tasks/{task_id}/preview", pages.preview, methods=["GET"]),
        Route("/tasks/{task_id}/decision", pages.decision, methods=["POST"]),
    ]
    allowed = [h.strip("[]") for h in hosts] + list(hosts)
    middleware = [
        Middleware(TrustedHostMiddleware, allowed_hosts=allowed),
        Middleware(_Headers),
    ]
    return Starlette(routes=routes, middleware=middleware)


class _Pages:
    def __init__(self, app_console: Console, env: Environment) -> None:
        self.c = app_console
        self.env = env

    def render(self, name: str, status: int = 200, **values: Any) -> HTMLResponse:
        return HTMLResponse(self.env.get_template(name).render(**values), status_code=status)

    def refuse(self, session: Session, status: int, message: str) -> HTMLResponse:
        return self.render(
            "error.j2", status, session=session, token=session.form_token(), message=message
        )

    # -- signing in and out -----------------------------------------------------------------

    def _anonymous(self, name: str, request: Request, status: int = 200, **values: Any) -> Response:
        """A page before a session, with its form's double-submit token."""
        token = request.cookies.get(FORM_COOKIE) or secrets.token_urlsafe(24)
        response = self.render(name, status, form_token=token, **values)
        response.set_cookie(
            FORM_COOKIE, token, httponly=True, samesite="strict", secure=self.c.secure, path="/"
        )
        return response

    async def _anonymous_form(self, request: Request) -> Any | None:
        """The posted form when its token is the browser's own (a cross-site post is not)."""
        form = await request.form()
        expected = request.cookies.get(FORM_COOKIE, "")
        offered = str(form.get("form_token", ""))
        return form if expected and hmac.compare_digest(expected, offered) else None

    async def signin_form(self, request: Request) -> Response:
        return self._anonymous("signin.j2", request, error=None, address="")

    async def signin(self, request: Request) -> Response:
        form = await self._anonymous_form(request)
        if form is None:
            error = "This form is not from this console: try again."
            return self._anonymous("signin.j2", request, 403, address="", error=error)
        address = str(form.get("address", "")).strip().lower()[: credentials.MAX_ADDRESS_CHARS]
        password = Secret(str(form.get("password", "")))
        key = f"{address}|{_client(request)}"
        now = self.c.clock.now()
        if self.c.attempts.blocked(key, now):
            self.c.audit(request, address, "sign-in", "refused: too many attempts")
            return self._anonymous("signin.j2", request, 429, address=address,
                                   error="Too many attempts: wait a few minutes.")  # fmt: skip
        seen = credentials.sign_in_password(self.c.store, self.c.vault, address, password)
        if seen is None:
            self.c.attempts.failed(key, now)
            self.c.audit(request, address, "sign-in", "refused")
            return self._anonymous("signin.j2", request, 401, address=address,
                                   error="That address and password do not match.")  # fmt: skip
        self.c.attempts.succeeded(key)
        return self._signed_in(request, address, "sign-in with password")

    async def link_form(self, request: Request) -> Response:
        """A link opened (by a person, or a link scanner) only shows a button: the POST
        spends it."""
        return self._anonymous("link.j2", request,
                               address=request.query_params.get("address", ""),
                               link_token=request.query_params.get("token", ""))  # fmt: skip

    async def signin_link(self, request: Request) -> Response:
        form = await self._anonymous_form(request)
        address = str(form.get("address", "")).strip().lower() if form is not None else ""
        token = Secret(str(form.get("link_token", ""))) if form is not None else Secret("")
        seen = (
            credentials.sign_in_link(self.c.store, self.c.vault, address, token, self.c.clock.now())
            if form is not None and len(address) <= credentials.MAX_ADDRESS_CHARS
            else None
        )
        if seen is None:
            self.c.audit(request, address, "sign-in with link", "refused")
            return self._anonymous("signin.j2", request, 401, address=address,
                                   error="That sign-in link is used, expired or not yours: "
                                   "ask for a new one.")  # fmt: skip
        return self._signed_in(request, address, "sign-in with link")

    def _signed_in(self, request: Request, address: str, how: str) -> Response:
        sid = self.c.start(address)
        self.c.audit(request, address, how, "signed in")
        response = RedirectResponse("/", status_code=303)
        response.set_cookie(
            COOKIE, sid, httponly=True, samesite="strict", secure=self.c.secure,
            max_age=int(SESSION_TTL.total_seconds()), path="/",
        )  # fmt: skip
        return response

    async def signout(self, request: Request) -> Response:
        session = self.c.session(request)
        if session is None:
            return RedirectResponse("/signin", status_code=303)
        form = await request.form()
        if not session.spend(str(form.get("form_token", ""))):
            return self.refuse(session, 403, "This form is not from this console: reload.")
        self.c.sessions.pop(request.cookies.get(COOKIE, ""), None)
        self.c.audit(request, session.address, "sign-out", "signed out")
        response = RedirectResponse("/signin", status_code=303)
        response.delete_cookie(COOKIE, path="/")
        return response

    # -- pages ----------------------------------------------------------------------------

    def _needs_session(self, request: Request) -> Session | Response:
        session = self.c.session(request)
        if session is None:
            return RedirectResponse("/signin", status_code=303)
        return session

    async def stylesheet(self, request: Request) -> Response:
        css = (Path(__file__).parent / "static" / "console.css").read_text(encoding="utf-8")
        return Response(css, media_type="text/css")

    async def home(self, request: Request) -> Response:
        session = self._needs_session(request)
        if isinstance(session, Response):
            return session
        return self.render("home.j2", session=session, token=session.form_token(),
                           workspaces=self.c.workspaces(session))  # fmt: skip

    async def queue(self, request: Request) -> Response:
        session = self._needs_session(request)
        if isinstance(session, Response):
            return session
        workspace_id = request.path_params["workspace_id"]
        if workspace_id not in self.c.workspaces(session):
            return self.refuse(session, 404, "No such workspace for you.")
        page = queue_html(
            self.env, self.c.store, workspace_id, session=session, token=session.form_token(),
            state=request.query_params.get("state", ""), gate=request.query_params.get("gate", ""),
        )  # fmt: skip
        return HTMLResponse(page)

    def _visible_task(self, request: Request, session: Session) -> Task | None:
        try:
            task = load_task(self.c.store, request.path_params["task_id"])
        except OutloopError:
            return None
        return task if task.workspace_id in self.c.workspaces(session) else None

    async def task(self, request: Request) -> Response:
        session = self._needs_session(request)
        if isinstance(session, Response):
            return session
        task = self._visible_task(request, session)
        if task is None:
            return self.refuse(session, 404, "No such task for you.")
        asked = task.approval_requests[-1] if task.approval_requests else None
        draft = drafts.load_draft(self.c.store, task.task_id, asked.draft_id)[1] if asked else None
        history = [
            (at, state, shown(event)) for at, state, event in self.c.store.task_events(task.task_id)
        ]
        return self.render(
            "task.j2", session=session, token=session.form_token(), task=row_of(task),
            request=asked, history=history, decidable=task.state in console.DECIDABLE and asked,
            notice=request.query_params.get("notice", ""),
            draft_subject=shown(draft.subject) if draft else "",
            draft_files=[shown(a.name) for a in draft.attachments] if draft else [],
        )  # fmt: skip

    async def preview(self, request: Request) -> Response:
        session = self.c.session(request)
        task = self._visible_task(request, session) if session is not None else None
        if task is None or not task.approval_requests:
            return Response("not found", status_code=404, media_type="text/plain")
        asked = task.approval_requests[-1]
        _, rendered = drafts.load_draft(self.c.store, task.task_id, asked.draft_id)
        response = HTMLResponse(rendered.html)
        response.headers["Content-Security-Policy"] = PREVIEW_CSP
        return response

    async def decision(self, request: Request) -> Response:
        session = self.c.session(request)
        if session is None:
            return RedirectResponse("/signin", status_code=303)
        task = self._visible_task(request, session)
        if task is None:
            return self.refuse(session, 404, "No such task for you.")
        form = await request.form()
        if not session.spend(str(form.get("form_token", ""))):
            self.c.audit(request, session.address, f"decision on {task.task_id}", "refused: form")
            return self.refuse(session, 403, "This form was already used or is not from this "
                               "console: reload the page and decide again.")  # fmt: skip
        choice = DECISIONS.get(str(form.get("decision", "")))
        if choice is None:
            return self.refuse(session, 400, "Choose Approve or Request changes.")
        return self._decided(request, session, task.task_id, choice, form)

    def _decided(
        self, request: Request, session: Session, task_id: str, decision: Decision, form: Any
    ) -> Response:
        action = f"{decision.value} on {task_id}"
        try:
            task = console.decide(
                self.c.store, task_id, self.c.clock, approver=session.address,
                decision=decision, draft_digest=str(form.get("draft_digest", "")),
                recipients=tuple(str(r) for r in form.getlist("recipient")),
                note=str(form.get("note", "")), where=_client(request),
            )  # fmt: skip
        except OutloopError as exc:
            refused = isinstance(exc, GateRefused)
            self.c.audit(request, session.address, action, f"refused: {exc}")
            return self.refuse(session, 403 if refused else 409, f"Not recorded: {exc}")
        self.c.audit(request, session.address, action, f"recorded; the task is {task.state.value}")
        notice = NOTICES.get(task.state, f"recorded; the task is still {task.state.value}")
        return RedirectResponse(f"/tasks/{task_id}?notice={quote(notice)}", status_code=303)


DECISIONS = {"approve": Decision.APPROVED, "request_changes": Decision.CHANGES_REQUESTED}
NOTICES = {
    TaskState.APPROVED_TO_SEND: "approved: the send is possible",
    TaskState.CHANGES_REQUESTED: "changes requested: the task went back",
}


def queue_html(
    env: Environment,
    store: EmbeddedStore,
    workspace_id: str,
    *,
    session: Session | None,
    token: str,
    state: str = "",
    gate: str = "",
) -> str:
    """The queue page: the workspace's open tasks, oldest received first, filtered."""
    tasks = [
        t
        for t in store.list_queue_entries(workspace_id)
        if (not state or t.state.value == state) and (not gate or gate in _gates(t))
    ]
    return env.get_template("queue.j2").render(
        session=session, token=token, workspace_id=workspace_id,
        rows=[row_of(t) for t in tasks], state=state, gate=gate,
    )  # fmt: skip


def _gates(task: Task | QueueEntry) -> set[str]:
    return {g.kind.value for g in task.open_gates}


def row_of(task: Task | QueueEntry) -> dict[str, Any]:
    """What a page shows of a task; the sender's own words are marked as untrusted data."""
    return {
        "task_id": task.task_id,
        "state": task.state.value,
        "since": task.state_since,
        "received_at": task.received_at,
        "gates": [(g.kind.value, g.owner, g.since) for g in task.open_gates],
        "owner": task.next_action.owner,
        "next_action": shown(task.next_action.description),
        "title": shown(task.title),
        "sender": shown(task.sender_identity),
        "sender_name": shown(task.sender_name),
        "flags": list(task.content_flags),
        "terminal": task.state in TERMINAL_STATES,
    }

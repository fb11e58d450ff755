"""The operator console: a Starlette app that shows the queue and a task, and posts what a
signed-in person decides to the core, which judges it.

Security is behaviour here: every form carries a one-time token bound to the session (a
forged or replayed form is refused), the session cookie is HttpOnly and SameSite=Strict
(and Secure off loopback), every page has a strict Content-Security-Policy, the draft is
previewed in a sandboxed frame with no script, sign-in is rate-limited, and every sign-in
and decision is audited with who, when and from where. No secret is ever rendered.
"""

from __future__ import annotations

import contextlib
import hmac
import secrets
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any
from urllib.parse import quote

from jinja2 import Environment
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp

from agent.domain.approval import Decision
from agent.domain.errors import GateRefused, OutloopError
from agent.domain.secrets import Secret
from agent.domain.states import TERMINAL_STATES, TaskState
from agent.domain.task import QueueEntry, Task
from agent.domain.untrusted import shown
from agent.ports import EmbeddedStore
from agent.services import console, drafts
from managed_login import console as credentials
from mcp_server.console.operations import (
    OperationPages,
    gate_of,
    operation_routes,
    thread_of,
)
from mcp_server.console.pages import (
    COOKIE,
    CSP,
    LOOPBACK_HOSTS,
    PREVIEW_CSP,
    SESSION_TTL,
    Console,
    PagesBase,
    Session,
    client_of,
    templates,
)

__all__ = ["COOKIE", "LOOPBACK_HOSTS", "Console", "build_app", "queue_html", "row_of", "templates"]

HSTS = "max-age=31536000"
"""Off loopback the console is served over TLS only: browsers are told to keep to it."""


class _Headers(BaseHTTPMiddleware):
    def __init__(self, app: ASGIApp, secure: bool) -> None:
        super().__init__(app)
        self.secure = secure

    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        response = await call_next(request)
        if self.secure:
            response.headers["Strict-Transport-Security"] = HSTS
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
        *operation_routes(OperationPages(app_console, pages.env)),
    ]
    allowed = [h.strip("[]") for h in hosts] + list(hosts)
    middleware = [
        Middleware(TrustedHostMiddleware, allowed_hosts=allowed),
        Middleware(_Headers, secure=app_console.secure),
    ]

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncGenerator[None]:
        try:
            yield
        finally:
            if app_console.bodies is not None:
                await app_console.bodies.aclose()

    return Starlette(routes=routes, middleware=middleware, lifespan=lifespan)


class _Pages(PagesBase):
    # -- signing in and out -----------------------------------------------------------------

    def _anonymous(self, name: str, request: Request, status: int = 200, **values: Any) -> Response:
        """A page before a session, with its form's double-submit token."""
        token = request.cookies.get(self.c.form_cookie) or secrets.token_urlsafe(24)
        response = self.render(name, status, form_token=token, **values)
        response.set_cookie(
            self.c.form_cookie, token, httponly=True, samesite="strict", secure=self.c.secure,
            path="/",
        )  # fmt: skip
        return response

    async def _anonymous_form(self, request: Request) -> Any | None:
        """The posted form when its token is the browser's own (a cross-site post is not)."""
        form = await request.form()
        expected = request.cookies.get(self.c.form_cookie, "")
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
        key = f"{address}|{client_of(request)}"
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
            self.c.cookie, sid, httponly=True, samesite="strict", secure=self.c.secure,
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
        self.c.sessions.pop(request.cookies.get(self.c.cookie, ""), None)
        self.c.audit(request, session.address, "sign-out", "signed out")
        response = RedirectResponse("/signin", status_code=303)
        response.delete_cookie(self.c.cookie, path="/", secure=self.c.secure)
        return response

    # -- pages ----------------------------------------------------------------------------

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

    async def task(self, request: Request) -> Response:
        seen = self.task_for(request)
        if isinstance(seen, Response):
            return seen
        session, task = seen
        asked = task.approval_requests[-1] if task.approval_requests else None
        draft = drafts.load_draft(self.c.store, task.task_id, asked.draft_id)[1] if asked else None
        history = [
            (at, state, shown(event)) for at, state, event in self.c.store.task_events(task.task_id)
        ]
        held = [g for g in task.open_gates if g.kind in console.HOLDS]
        return self.render(
            "task.j2", session=session, token=session.form_token(), task=row_of(task),
            gate=gate_of(self.c.store, task, asked),
            thread=await thread_of(self, task), held=held, release_token=session.form_token(),
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
                note=str(form.get("note", "")), where=client_of(request),
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

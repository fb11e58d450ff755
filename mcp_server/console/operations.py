"""The console's operator pages: learning proposals, runs, and a person's actions on them.

Every action is a form with a one-time token, posted to the core, which judges it (only an
operator of the workspace may accept or reject a proposal, acknowledge a sign-in challenge,
release a held send or settle a send); each is audited with who, when, from where and the
outcome. Agent-written and mail-derived text is shown as data, its hidden characters marked.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from typing import Any
from urllib.parse import quote

from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from agent.domain.approval import ApprovalRequest
from agent.domain.context import WorkspaceContext
from agent.domain.dispositions import Disposition
from agent.domain.errors import GateRefused, InvalidRequest, OutloopError
from agent.domain.mail import MessageBody
from agent.domain.records import HealthRecord, LearningProposal, ProposalState, SendRecord
from agent.domain.schedule import next_runs
from agent.domain.task import Task
from agent.domain.untrusted import shown
from agent.ports import EmbeddedStore
from agent.rendering.text import visible_text
from agent.services import challenges, console, drafts, learning, workspaces
from agent.services import status as station_status
from agent.services.gate_check import check_send
from agent.services.outbound import SETTLEABLE
from agent.services.workspaces import DataDir
from mcp_server.console.pages import PagesBase, Session, client_of

Segments = list[tuple[str, bool]]


def marked(text: str) -> Segments:
    """``text`` in runs of (text, hidden): each hidden character (a format or control
    character other than a line break or tab) written out as its code point, to be marked."""
    out: Segments = []
    plain: list[str] = []
    for ch in text:
        if ch in "\n\t" or ch.isprintable() or shown(ch) == ch:
            plain.append(ch)
            continue
        if plain:
            out.append(("".join(plain), False))
            plain = []
        out.append((shown(ch), True))
    if plain:
        out.append(("".join(plain), False))
    return out


def operation_routes(pages: OperationPages) -> list[Route]:
    return [
        Route("/workspaces/{workspace_id}/proposals", pages.proposals, methods=["GET"]),
        Route("/proposals/{proposal_id}", pages.proposal, methods=["GET"]),
        Route("/proposals/{proposal_id}/preview", pages.proposal_preview, methods=["POST"]),
        Route("/proposals/{proposal_id}/accept", pages.proposal_accept, methods=["POST"]),
        Route("/proposals/{proposal_id}/reject", pages.proposal_reject, methods=["POST"]),
        Route("/workspaces/{workspace_id}/runs", pages.runs, methods=["GET"]),
        Route("/workspaces/{workspace_id}/challenges", pages.acknowledge, methods=["POST"]),
        Route("/workspaces/{workspace_id}/sends", pages.settle, methods=["POST"]),
        Route("/tasks/{task_id}/release", pages.release, methods=["POST"]),
    ]


Action = Callable[[Any, Session], str]
"""Runs one person's action from the posted form; returns what was recorded."""


class OperationPages(PagesBase):
    @property
    def data_dir(self) -> DataDir:
        return DataDir(self.c.data_root)

    def _workspace(self, request: Request, workspace_id: str) -> Session | Response:
        session = self._needs_session(request)
        if isinstance(session, Response):
            return session
        if workspace_id not in self.c.workspaces(session):
            return self.refuse(session, 404, "No such workspace for you.")
        return session

    async def _act(
        self, request: Request, workspace_id: str, action: str, act: Action, back: str
    ) -> Response:
        """A person's action: a signed-in person who sees the workspace, a form of this
        session, then the core's verdict; audited either way."""
        session = self._workspace(request, workspace_id)
        if isinstance(session, Response):
            return session
        form = await self.spent_form(request, session, action)
        if form is None:
            return self.refuse_form(session)
        try:
            done = act(form, session)
        except OutloopError as exc:
            self.c.audit(request, session.address, action, f"refused: {exc}")
            status = 403 if isinstance(exc, GateRefused) else 409
            return self.refuse(session, status, f"Not recorded: {exc}")
        self.c.audit(request, session.address, action, done)
        return RedirectResponse(f"{back}?notice={quote(done)}", status_code=303)

    def _where(self, request: Request) -> str:
        return client_of(request)

    # -- learning proposals ------------------------------------------------------------------

    async def proposals(self, request: Request) -> Response:
        workspace_id = request.path_params["workspace_id"]
        session = self._workspace(request, workspace_id)
        if isinstance(session, Response):
            return session
        listed = self.c.store.list_proposals(workspace_id)
        queued = [_proposal_row(p) for p in listed if p.state is ProposalState.QUEUED]
        decided = [
            _proposal_row(p) for p in reversed(listed) if p.state is not ProposalState.QUEUED
        ]
        return self.render(
            "proposals.j2", session=session, token=session.form_token(),
            workspace_id=workspace_id, queued=queued, decided=decided,
            notice=request.query_params.get("notice", ""),
        )  # fmt: skip

    def _visible_proposal(self, request: Request) -> tuple[Session, LearningProposal] | Response:
        session = self._needs_session(request)
        if isinstance(session, Response):
            return session
        found = self.c.store.get_proposal(request.path_params["proposal_id"])
        if found is None or found.workspace_id not in self.c.workspaces(session):
            return self.refuse(session, 404, "No such proposal for you.")
        return session, found

    async def proposal(self, request: Request) -> Response:
        seen = self._visible_proposal(request)
        if isinstance(seen, Response):
            return seen
        session, found = seen
        row = self.c.store.get_workspace(found.workspace_id)
        return self._proposal_page(session, found, (row.context_text or "") if row else "")

    def _proposal_page(
        self,
        session: Session,
        found: LearningProposal,
        text: str,
        *,
        change: learning.ProposedChange | None = None,
        error: str = "",
        status: int = 200,
    ) -> HTMLResponse:
        context = workspaces.load_context(self.c.store, found.workspace_id)
        operator = console.holds(context, session.address, {console.OPERATOR_ROLE})
        return self.render(
            "proposal.j2", status, session=session, token=session.form_token(),
            proposal=_proposal_row(found), text=text, error=error, operator=operator,
            diff=_diff_lines(change.diff) if change else [],
            base_sha256=change.base_sha256 if change else "",
            accept_token=session.form_token() if change and operator else "",
            reject_token=session.form_token() if operator else "",
        )  # fmt: skip

    async def proposal_preview(self, request: Request) -> Response:
        """The diff the edited context would write, checked as ``workspace update`` checks
        a file; a refusal shows the text again with why, so nothing typed is lost."""
        seen = self._visible_proposal(request)
        if isinstance(seen, Response):
            return seen
        session, found = seen
        form = await self.spent_form(request, session, f"preview of {found.proposal_id}")
        if form is None:
            return self.refuse_form(session)
        text = str(form.get("context", ""))
        try:
            change = learning.preview_change(self.c.store, self.data_dir, found.proposal_id, text)
        except OutloopError as exc:
            return self._proposal_page(session, found, text, error=str(exc), status=400)
        return self._proposal_page(session, found, text, change=change)

    async def proposal_accept(self, request: Request) -> Response:
        """Accept, or, when the context changed since the diff was shown, the proposal page
        again with the text kept and its diff against the context now."""
        seen = self._visible_proposal(request)
        if isinstance(seen, Response):
            return seen
        session, found = seen
        form = await request.form()
        row = self.c.store.get_workspace(found.workspace_id)
        posted = str(form.get("base_sha256", ""))
        if row is None or row.context_sha256 == posted:
            return await self._on_proposal(request, "accept", self._accept)
        action = f"accept proposal {found.proposal_id}"
        if not session.spend(str(form.get("form_token", ""))):
            self.c.audit(request, session.address, action, "refused: form")
            return self.refuse_form(session)
        self.c.audit(request, session.address, action, "refused: the context changed")
        text = str(form.get("context", ""))
        why = "the context changed since that diff was shown; this is the diff against it now"
        try:
            change = learning.preview_change(self.c.store, self.data_dir, found.proposal_id, text)
        except OutloopError as exc:
            return self._proposal_page(session, found, text, error=f"{why}: {exc}", status=409)
        return self._proposal_page(session, found, text, change=change, error=why, status=409)

    async def proposal_reject(self, request: Request) -> Response:
        return await self._on_proposal(request, "reject", self._reject)

    async def _on_proposal(
        self, request: Request, verb: str, act: Callable[[Request, str], Action]
    ) -> Response:
        seen = self._visible_proposal(request)
        if isinstance(seen, Response):
            return seen
        _, found = seen
        back = f"/workspaces/{found.workspace_id}/proposals"
        action = f"{verb} proposal {found.proposal_id}"
        return await self._act(
            request, found.workspace_id, action, act(request, found.proposal_id), back
        )

    def _accept(self, request: Request, proposal_id: str) -> Action:
        def act(form: Any, session: Session) -> str:
            decided, row = learning.accept(
                self.c.store, self.data_dir, proposal_id, text=str(form.get("context", "")),
                base_sha256=str(form.get("base_sha256", "")), by=session.address,
                where=self._where(request), now=self.c.clock.now(),
            )  # fmt: skip
            return f"{decided.proposal_id} accepted; context {row.context_sha256[:12]} written"

        return act

    def _reject(self, request: Request, proposal_id: str) -> Action:
        def act(form: Any, session: Session) -> str:
            decided = learning.reject(
                self.c.store, proposal_id, reason=str(form.get("reason", "")),
                by=session.address, where=self._where(request), now=self.c.clock.now(),
            )  # fmt: skip
            return f"{decided.proposal_id} rejected"

        return act

    # -- runs --------------------------------------------------------------------------------

    async def runs(self, request: Request) -> Response:
        workspace_id = request.path_params["workspace_id"]
        session = self._workspace(request, workspace_id)
        if isinstance(session, Response):
            return session
        context = workspaces.load_context(self.c.store, workspace_id)
        health = [h for h in self.c.store.list_health() if _about(h, workspace_id)]
        kept = challenges.listed(self.c.store, workspace_id)
        sends = [self._send_row(s) for s in self._sends(workspace_id)]
        return self.render(
            "runs.j2", session=session, token=session.form_token(), workspace_id=workspace_id,
            notice=request.query_params.get("notice", ""),
            runs=self._run_rows(workspace_id), next_runs=self._next_runs(workspace_id, context),
            access=_access_rows(context, health), health=[_health_row(h) for h in health],
            challenges=[(_challenge_row(c), session.form_token() if c.open else "")
                        for c in kept],
            sends=[(s, session.form_token() if s["settleable"] else "") for s in sends],
            health_now=station_status.of_workspace(self.c.store, workspace_id, self.c.clock.now()),
        )  # fmt: skip

    def _run_rows(self, workspace_id: str) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        for run in self.c.store.recent_runs(workspace_id):
            failed = (
                [
                    (shown(e.item_ref), shown(e.mailbox_id), shown(e.detail))
                    for e in self.c.store.ledger(run.run_id)
                    if e.disposition is Disposition.RECONCILIATION_FAILED
                ]
                if run.summary is not None and run.summary.reconciliation_failed
                else []
            )
            rows.append({"run": run, "summary": run.summary, "failed": failed})
        return rows

    def _next_runs(self, workspace_id: str, context: WorkspaceContext) -> list[datetime]:
        row = self.c.store.get_workspace(workspace_id)
        if row is None or not row.schedule_expression:
            return []
        return next_runs(row.schedule_expression, context.timezone, self.c.clock.now(), 3)

    def _sends(self, workspace_id: str) -> list[SendRecord]:
        listed = self.c.store.list_sends(workspace_id)
        # those waiting on a person first, then the newest
        ordered = sorted(listed, key=lambda s: s.created_at, reverse=True)
        return sorted(ordered, key=lambda s: s.state not in SETTLEABLE)[:50]

    def _send_row(self, record: SendRecord) -> dict[str, Any]:
        task = self.c.store.get_task(record.task_id) if record.task_id else None
        readback = task.readback_evidence if task and task.sent_message_id == (
            record.internet_message_id
        ) else None  # fmt: skip
        return {
            "key": record.key, "kind": record.kind, "state": record.state.value,
            "channel": record.channel or "none yet",
            "recipients": [shown(r) for r in record.recipients],
            "sent_at": record.sent_at, "task_id": record.task_id, "detail": shown(record.detail),
            "readback": shown(readback) if readback else None,
            "settleable": record.state in SETTLEABLE,
        }  # fmt: skip

    async def acknowledge(self, request: Request) -> Response:
        workspace_id = request.path_params["workspace_id"]

        def act(form: Any, session: Session) -> str:
            done = challenges.acknowledge(
                self.c.store, workspace_id, str(form.get("mailbox", "")),
                str(form.get("channel", "")), by=session.address,
                evidence=str(form.get("evidence", "")), where=self._where(request),
                now=self.c.clock.now(), seen=_moment(str(form.get("met_at", ""))),
            )  # fmt: skip
            return f"the {done.challenge} challenge of {done.mailbox_id} is acknowledged resolved"

        back = f"/workspaces/{workspace_id}/runs"
        return await self._act(request, workspace_id, "acknowledge a challenge", act, back)

    async def settle(self, request: Request) -> Response:
        workspace_id = request.path_params["workspace_id"]

        def act(form: Any, session: Session) -> str:
            key = str(form.get("send", ""))
            record = self.c.store.get_send(key)
            if record is None or record.workspace_id != workspace_id:
                raise GateRefused(f"there is no send {key} in workspace {workspace_id}")
            outcome = str(form.get("outcome", ""))
            if outcome not in {"sent", "not_sent"}:
                raise GateRefused("say what you found: sent, or not sent")
            settled = console.settle_send(
                self.c.store, key, self.c.clock, sent=outcome == "sent",
                evidence=str(form.get("evidence", "")), by=session.address,
                where=self._where(request),
            )  # fmt: skip
            return f"send {settled.key} settled: {settled.state.value}"

        back = f"/workspaces/{workspace_id}/runs"
        return await self._act(request, workspace_id, "settle a send", act, back)

    # -- a held send ---------------------------------------------------------------------------

    async def release(self, request: Request) -> Response:
        seen = self.task_for(request)
        if isinstance(seen, Response):
            return seen
        task = seen[1]

        def act(form: Any, session: Session) -> str:
            released = console.release_hold(
                self.c.store, task.task_id, self.c.clock, by=session.address,
                where=self._where(request),
            )  # fmt: skip
            return f"the send hold is released; the task is {released.state.value}"

        action = f"release the send hold of {task.task_id}"
        return await self._act(request, task.workspace_id, action, act, f"/tasks/{task.task_id}")


async def thread_of(pages: PagesBase, task: Task) -> list[dict[str, Any]]:
    """The task's messages, oldest first, each inbound body read from its mailbox and shown
    as data with its hidden characters marked (or why it could not be read now)."""
    out: list[dict[str, Any]] = []
    for message in task.messages:
        body: Segments = []
        error = ""
        if message.body_ref is not None and pages.c.bodies is not None:
            try:
                read = await pages.c.bodies(task, message)
                body = marked(_words(read))
            except Exception as exc:  # a mailbox that cannot answer now is shown, not a crash
                error = f"the body could not be read now ({type(exc).__name__}: {exc})"
        out.append(
            {
                "received_at": message.received_at,
                "direction": message.direction,
                "sender": shown(message.sender),
                "body": body,
                "error": error,
                "hidden": any(hidden for _, hidden in body),
            }
        )
    return out


def gate_of(
    store: EmbeddedStore, task: Task, asked: ApprovalRequest | None
) -> dict[str, Any] | None:
    """The send gate's verdict on the latest requested draft to its recipients, as the send
    tool would judge it now: ready with its approval basis, or every blocking reason; and
    each recipient with its class and the evidence for it."""
    if asked is None or not asked.recipients:
        return None
    record, rendered = drafts.load_draft(store, task.task_id, asked.draft_id)
    gate = check_send(
        store, task.task_id, drafts.facts(record, rendered), to=asked.recipients, record=False
    )
    return {
        "ready": gate.ready, "communication": gate.communication.value,
        "basis": shown(gate.approval_basis or ""),
        "reasons": [(r.blocker.value, shown(r.detail), r.owner) for r in gate.reasons],
        "recipients": [
            (c.address, c.recipient_class.value, [shown(e) for e in c.evidence],
             shown(c.conflict or ""), list(c.flags))
            for c in gate.plan.everyone
        ],
        "removed": [(r.address, shown(r.reason)) for r in gate.plan.removed],
        "added_cc": list(gate.plan.added_default_cc),
    }  # fmt: skip


def _words(body: MessageBody) -> str:
    """The plain-text part, else the visible text of the HTML part (as the MCP tools give
    it), with its hidden characters still in it to be marked."""
    words = body.text if body.text.strip() else (visible_text(body.html) if body.html else "")
    return words.replace("\r\n", "\n")


def _proposal_row(proposal: LearningProposal) -> dict[str, Any]:
    return {
        "proposal_id": proposal.proposal_id, "workspace_id": proposal.workspace_id,
        "kind": shown(proposal.kind), "summary": marked(proposal.summary),
        "detail": marked(proposal.detail), "evidence": [shown(e) for e in proposal.evidence],
        "state": proposal.state.value, "submitted_at": proposal.submitted_at,
        "decided_by": proposal.decided_by, "decided_at": proposal.decided_at,
        "note": shown(proposal.decision_note or ""),
    }  # fmt: skip


def _diff_lines(diff: str) -> list[tuple[str, str]]:
    """Each line of a unified diff with its kind: added, removed, or context."""
    kinds = {"+": "added", "-": "removed"}
    return [
        (kinds.get(line[:1], "context") if not line.startswith(("+++", "---")) else "file", line)
        for line in diff.splitlines()
    ]


def _about(record: HealthRecord, workspace_id: str) -> bool:
    """A health record of the workspace (its challenges are shown on their own)."""
    return workspace_id in record.key.split() and not record.key.startswith(challenges.PREFIX)


def _moment(value: str) -> datetime:
    try:
        return datetime.fromisoformat(value)
    except ValueError as exc:
        raise InvalidRequest("this form does not say which challenge it is about: reload") from exc


def _refused_on(refusal: HealthRecord | None, channel: str) -> str:
    """The kept refusal's reason when ``channel`` is the one that refused."""
    if refusal is None:
        return ""
    try:
        kept = json.loads(refusal.detail)
        return shown(str(kept["reason"])) if kept["channel"] == channel else ""
    except (ValueError, KeyError, TypeError):
        return shown(refusal.detail)


def _challenge_row(challenge: challenges.Challenge) -> dict[str, Any]:
    return {
        "open": challenge.open, "mailbox": shown(challenge.mailbox_id),
        "channel": shown(challenge.channel), "challenge": shown(challenge.challenge),
        "action": shown(challenge.action), "met_at": challenge.met_at,
        "by": challenge.acknowledged_by, "at": challenge.acknowledged_at,
        "evidence": shown(challenge.evidence or ""),
        "raw_mailbox": challenge.mailbox_id, "raw_channel": challenge.channel,
        "met_key": challenge.met_at.isoformat(),
    }  # fmt: skip


def _health_row(record: HealthRecord) -> dict[str, Any]:
    return {
        "key": shown(record.key), "detail": shown(record.detail), "count": record.count,
        "at": record.recorded_at,
    }  # fmt: skip


def _access_rows(context: WorkspaceContext, health: list[HealthRecord]) -> list[dict[str, Any]]:
    """Per mailbox and permitted channel, the last step a run recorded for it."""
    by_key = {h.key: h for h in health}
    rows: list[dict[str, Any]] = []
    for binding in context.mailboxes:
        refusal = by_key.get(f"access refusal {context.workspace_id} {binding.mailbox_id}")
        for channel in binding.permitted_channels:
            step = by_key.get(f"access {context.workspace_id} {binding.mailbox_id} {channel}")
            rows.append(
                {
                    "mailbox": binding.mailbox_id,
                    "channel": channel.value,
                    "step": shown(step.detail) if step else "no step recorded yet",
                    "at": step.recorded_at if step else None,
                    "refused": _refused_on(refusal, channel.value),
                }
            )
    return rows

"""The operator console over HTTP: sign-in, sessions, one-time forms, the queue, the task
page and its decisions - which the core judges, whatever the page posted."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from agent.domain.approval import Decision
from agent.domain.errors import GateRefused
from agent.domain.mail import MessageBody
from agent.domain.secrets import Secret
from agent.domain.states import TaskState
from agent.domain.task import MessageRef, Task
from agent.services import approvals, drafts, workspaces
from agent.storage.sqlite import SqliteStore
from agent.testing import FrozenClock
from managed_login import console as credentials
from managed_login.vault import open_vault
from mcp_server.console.app import COOKIE, Console, build_app
from tests.conftest import context_yaml
from tests.services.gates_world import APPROVER, CLIENT, COLLEAGUE, World, with_colleague

pytestmark = pytest.mark.anyio
PASSWORD = "correct horse battery"  # a test identity's password
OPERATOR = "ops.lead@fabrikam.test"


def with_operator(text: str) -> str:
    extra = f"  - {{address: {OPERATOR}, name: Ops Lead, side: internal, roles: [operator]}}\n"
    return with_colleague(text).replace("contacts:\n", "contacts:\n" + extra, 1)


class BoxBodies:
    """Bodies read from the world's in-memory mailbox, as the console reads a mailbox."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.closed = False

    async def __call__(self, task: Task, message: MessageRef) -> MessageBody:
        assert message.body_ref is not None
        return await self.world.box.fetch_body(message.body_ref)

    async def aclose(self) -> None:
        self.closed = True


class Desk:
    """A registered workspace with a task waiting for approval, and the console over it."""

    def __init__(self, world: World, root: Path) -> None:
        self.world = world
        self.vault = open_vault(root / "vault", "plain")
        self.console = Console(
            world.store, root, self.vault, world.clock, secure=False, bodies=BoxBodies(world)
        )
        self.app = build_app(self.console)
        for who in (APPROVER, OPERATOR):
            credentials.set_password(world.store, self.vault, who, Secret(PASSWORD))

    def client(self, host: str = "127.0.0.1") -> TestClient:
        return TestClient(
            self.app, base_url="http://127.0.0.1", follow_redirects=False, client=(host, 50000)
        )

    def signed_in(self, who: str, client_host: str = "127.0.0.1") -> TestClient:
        client = self.client(client_host)
        answer = sign_in(client, who, PASSWORD)
        assert answer.status_code == 303, answer.text
        return client

    async def waiting_task(self) -> str:
        self.world.deliver(sender=CLIENT, thread=1, text="Can you send a quote?")
        await self.world.intake()
        task = self.world.to_draft_ready(self.world.only_task().task_id)
        rendered = self.world.render(task)
        drafts.keep_draft(self.world.store, task, "d1", rendered, self.world.clock)
        await approvals.request_approval(
            self.world.store, self.world.box, task.task_id, "d1", rendered, (CLIENT,),
            self.world.clock,
        )  # fmt: skip
        return task.task_id


@pytest.fixture
def desk(
    station_store: SqliteStore,
    data_dir: workspaces.DataDir,
    clock: FrozenClock,
    register: Callable[[str], str],
) -> Iterator[Desk]:
    yield new_desk(station_store, data_dir, clock, register)


def new_desk(
    store: SqliteStore,
    data_dir: workspaces.DataDir,
    clock: FrozenClock,
    register: Callable[[str], str],
) -> Desk:
    """A workspace with an approver, a colleague and an operator, and the console over it."""
    ws = register(with_operator(context_yaml()))
    return Desk(World(store, data_dir, ws, clock), data_dir.root)


def sign_in(client: TestClient, who: str, password: str) -> Any:
    """The sign-in form as a browser posts it: its token from the page it was shown on."""
    token = form_fields(client.get("/signin").text)["form_token"][0]
    return client.post("/signin", data={"address": who, "password": password, "form_token": token})


def form_fields(page: str) -> dict[str, list[str]]:
    fields: dict[str, list[str]] = {}
    for name, value in re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', page):
        fields.setdefault(name, []).append(value)
    return fields


def decision_form(page: str, decision: str, note: str = "") -> dict[str, object]:
    decision_part = page[page.index('class="decision"') :]
    fields = form_fields(decision_part)
    return {
        "form_token": fields["form_token"][0],
        "draft_digest": fields["draft_digest"][0],
        "recipient": fields["recipient"],
        "decision": decision,
        "note": note,
    }


async def test_a_signed_out_request_is_sent_to_sign_in(desk: Desk) -> None:
    task_id = await desk.waiting_task()
    for path in ("/", f"/workspaces/{desk.world.workspace_id}", f"/tasks/{task_id}"):
        answer = desk.client().get(path)
        assert answer.status_code == 303 and answer.headers["location"].startswith("/signin")
    assert desk.client().get(f"/tasks/{task_id}/preview").status_code == 404


async def test_sign_in_sets_a_strict_http_only_cookie_and_every_page_a_strict_policy(
    desk: Desk,
) -> None:
    client = desk.client()
    answer = sign_in(client, APPROVER, PASSWORD)
    cookie = answer.headers["set-cookie"]
    assert f"{COOKIE}=" in cookie and "HttpOnly" in cookie and "SameSite=strict" in cookie
    assert "Secure" not in cookie  # loopback; off loopback the console sets it
    page = client.get("/")
    assert page.status_code == 200 and desk.world.workspace_id in page.text
    policy = page.headers["content-security-policy"]
    assert "default-src 'none'" in policy and "frame-ancestors 'none'" in policy
    assert "script-src" not in policy  # no script at all


async def test_a_wrong_password_is_refused_and_repeated_failures_are_rate_limited(
    desk: Desk,
) -> None:
    client = desk.client("10.0.0.66")
    codes = [sign_in(client, APPROVER, "wrong").status_code for _ in range(6)]
    assert codes == [401] * 5 + [429]
    assert sign_in(client, APPROVER, PASSWORD).status_code == 429  # the window, whatever
    assert sign_in(desk.client("10.0.0.9"), APPROVER, PASSWORD).status_code == 303  # the owner
    desk.world.clock.advance(minutes=6)
    assert sign_in(client, APPROVER, PASSWORD).status_code == 303
    audit = [json.loads(line) for line in desk.console.audit_file.read_text().splitlines()]
    assert [a["outcome"] for a in audit][-3:] == [
        "refused: too many attempts",
        "signed in",
        "signed in",
    ]
    assert PASSWORD not in desk.console.audit_file.read_text()


async def test_a_sign_in_form_posted_from_elsewhere_is_refused(desk: Desk) -> None:
    client = desk.client()
    answer = client.post("/signin", data={"address": APPROVER, "password": PASSWORD})
    assert answer.status_code == 403 and answer.cookies.get(COOKIE) is None


async def test_a_one_time_link_signs_in_once_and_only_when_posted(desk: Desk) -> None:
    def use(token: Secret) -> int:
        client = desk.client()
        shown = client.get(f"/signin/link?address={APPROVER}&token={token.reveal()}")
        assert shown.status_code == 200 and "Sign in as" in shown.text
        fields = form_fields(shown.text)
        data = {k: v[0] for k, v in fields.items()}
        return client.post("/signin/link", data=data).status_code

    token = credentials.invite(desk.world.store, desk.vault, APPROVER, desk.world.clock.now())
    desk.client().get(f"/signin/link?address={APPROVER}&token={token.reveal()}")  # a scanner
    assert use(token) == 303  # opening the link spent nothing
    assert use(token) == 401  # spent
    late = credentials.invite(desk.world.store, desk.vault, APPROVER, desk.world.clock.now())
    desk.world.clock.advance(minutes=31)
    assert use(late) == 401


async def test_a_person_sees_only_the_workspaces_their_context_gives_a_role_in(
    desk: Desk,
) -> None:
    for outsider in (CLIENT, COLLEAGUE):  # a client; an internal colleague with no such role
        with pytest.raises(GateRefused, match="not a console identity"):
            credentials.set_password(desk.world.store, desk.vault, outsider, Secret(PASSWORD))
        with pytest.raises(GateRefused, match="not a console identity"):
            credentials.invite(desk.world.store, desk.vault, outsider, desk.world.clock.now())
    assert sign_in(desk.client(), COLLEAGUE, PASSWORD).status_code == 401


async def test_the_queue_and_the_task_page_show_the_draft_as_it_will_be_sent(desk: Desk) -> None:
    task_id = await desk.waiting_task()
    client = desk.signed_in(OPERATOR)
    queue = client.get(f"/workspaces/{desk.world.workspace_id}")
    assert queue.status_code == 200 and f"/tasks/{task_id}" in queue.text
    assert "WAITING_INTERNAL_APPROVAL" in queue.text
    filtered = client.get(f"/workspaces/{desk.world.workspace_id}?state=COMPLETED")
    assert f"/tasks/{task_id}" not in filtered.text
    page = client.get(f"/tasks/{task_id}")
    assert page.status_code == 200 and "sandbox" in page.text and "Approve" in page.text
    preview = client.get(f"/tasks/{task_id}/preview")
    assert preview.text == drafts.load_draft(desk.world.store, task_id, "d1")[1].html
    assert "sandbox" in preview.headers["content-security-policy"]
    assert "script" not in preview.headers["content-security-policy"]


async def test_approve_as_the_approver_makes_the_send_possible_and_is_audited(desk: Desk) -> None:
    task_id = await desk.waiting_task()
    client = desk.signed_in(APPROVER)
    page = client.get(f"/tasks/{task_id}").text
    answer = client.post(f"/tasks/{task_id}/decision", data=decision_form(page, "approve"))
    assert answer.status_code == 303 and "notice=approved" in answer.headers["location"]
    assert "the send is possible" in client.get(answer.headers["location"]).text
    task = desk.world.task(task_id)
    assert task.state is TaskState.APPROVED_TO_SEND
    assert task.approval_decisions[-1].decision is Decision.APPROVED
    rendered = desk.world.render(task)
    assert desk.world.gate(task, rendered, (CLIENT,)).ready
    assert "in the console from 127.0.0.1" in desk.world.store.task_events(task_id)[-1][2]


async def test_the_same_button_from_an_operator_without_the_approval_role_is_refused(
    desk: Desk,
) -> None:
    task_id = await desk.waiting_task()
    client = desk.signed_in(OPERATOR)
    page = client.get(f"/tasks/{task_id}").text
    answer = client.post(f"/tasks/{task_id}/decision", data=decision_form(page, "approve"))
    assert answer.status_code == 403 and "holds no recorded approval role" in answer.text
    assert desk.world.task(task_id).state is TaskState.WAITING_INTERNAL_APPROVAL


async def test_a_replayed_or_forged_form_is_refused(desk: Desk) -> None:
    task_id = await desk.waiting_task()
    client = desk.signed_in(APPROVER)
    form = decision_form(client.get(f"/tasks/{task_id}").text, "approve")
    forged = client.post(f"/tasks/{task_id}/decision", data={**form, "form_token": "made-up"})
    assert forged.status_code == 403 and "already used or is not from this console" in forged.text
    other = desk.signed_in(APPROVER)  # a token another session was shown is not this one's
    assert other.post(f"/tasks/{task_id}/decision", data=form).status_code == 403
    assert desk.world.task(task_id).state is TaskState.WAITING_INTERNAL_APPROVAL
    changes = decision_form(client.get(f"/tasks/{task_id}").text, "request_changes", "Euros.")
    assert client.post(f"/tasks/{task_id}/decision", data=changes).status_code == 303
    assert desk.world.task(task_id).state is TaskState.CHANGES_REQUESTED
    replay = client.post(f"/tasks/{task_id}/decision", data=changes)
    assert replay.status_code == 403 and "already used" in replay.text


async def test_another_workspaces_tasks_and_unknown_ids_are_not_found(
    desk: Desk, register: Callable[[str], str]
) -> None:
    other = register(context_yaml("ws-other-0002", mailbox="other@fabrikam.test"))
    task_id = await desk.waiting_task()
    client = desk.signed_in(OPERATOR)  # an operator of the first workspace only
    form = decision_form(client.get(f"/tasks/{task_id}").text, "approve")
    assert client.get(f"/workspaces/{other}").status_code == 404
    for unknown in ("task-nope", "../etc"):
        assert client.get(f"/tasks/{unknown}").status_code == 404
        assert client.post(f"/tasks/{unknown}/decision", data=form).status_code == 404
    assert client.get("/tasks/task-nope/preview").status_code == 404


async def test_a_role_taken_away_takes_the_workspace_away_at_once(desk: Desk) -> None:
    await desk.waiting_task()
    client = desk.signed_in(OPERATOR)
    assert client.get(f"/workspaces/{desk.world.workspace_id}").status_code == 200
    text = with_operator(context_yaml()).replace(", roles: [operator]", "")
    source = desk.world.data_dir.root / "changed.yaml"
    source.write_text(text)
    workspaces.update_workspace(
        desk.world.store, desk.world.data_dir, source, desk.world.clock.now()
    )
    assert client.get(f"/workspaces/{desk.world.workspace_id}").status_code == 404


async def test_off_loopback_the_session_cookie_is_secure(desk: Desk, tmp_path: Path) -> None:
    secure = Console(desk.world.store, tmp_path, desk.vault, desk.world.clock, secure=True)
    client = TestClient(build_app(secure), base_url="http://127.0.0.1", follow_redirects=False)
    answer = sign_in(client, APPROVER, PASSWORD)
    assert "Secure" in answer.headers["set-cookie"]
    refused = TestClient(build_app(secure), base_url="http://evil.example")
    assert refused.get("/signin").status_code == 400  # another host name: refused

"""``outloop demo``: the whole email lifecycle, end to end, against the local mock providers.

It starts the mock providers (Gmail API, OAuth, the admin API; fixtures/) in this process on
a free 127.0.0.1 port, gives the demo mailbox a mock Google account, stores its OAuth client
and refresh token in a plain demo vault, and registers one demo workspace whose context binds
that mailbox through the Gmail API. The world delivers mail through the admin API; then the
demo plays the agent host and drives the product's own MCP server in process, tool by tool:
intake and claims, a Hebrew reply rendered by the server, the approval request to the
recorded approver (an internal email through Gmail), the approver's explicit reply taken in
by intake and recorded, the gate, the send in the original thread, the read-back of Gmail's
stored copy, the report and the reconciliation, then a replay of the whole mailbox. It ends
with what was sent and how it was verified, what waits and on whom, the reconciliation, and
the planted instruction that nothing obeyed (checked in the mock's own mailboxes).

Everything lives in a fresh temporary directory, or in --data-dir, which must hold no other
workspace. The mock tenant is kept in ``demo/mock`` there and what the mock's mailboxes held
is written to ``demo/mailboxes.json``; run again in the same --data-dir, the demo replays the
mailbox and asks to send the approved reply again, which the server refuses (already sent).
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import email
import email.policy
import json
import re
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from email.message import EmailMessage
from email.utils import getaddresses
from html import escape
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import anyio
import click

from agent.domain.approval import CONSOLE_EVIDENCE
from agent.domain.errors import OutloopError, RegistryError
from agent.domain.secrets import CredentialRef, Secret
from agent.domain.untrusted import flag
from agent.services import workspaces
from fixtures.admin import MockAdmin
from mcp_server.cli import demo_mail as mail
from mcp_server.cli.demo_report import write_report
from mcp_server.cli.shared import fail, read_settings
from mcp_server.composition import DATA_DIR_ENV, Settings, open_station, open_vault

if TYPE_CHECKING:
    import uvicorn
    from mcp import Client
    from mcp.shared.exceptions import MCPError

    from fixtures.mailstore import MailStore

# The web server, the mock providers and the MCP client are imported when the demo runs,
# not when the command line starts (as ``outloop fixtures serve`` and ``outloop serve`` do).

Echo = Callable[[str], None]
VAULT_NAMES = {
    "client_id": "oauth_client_id",
    "client_secret": "oauth_client_secret",
    "refresh_token": "oauth_refresh_token",
}
"""The mock account's values by the vault names ``outloop connect`` stores them under."""
STEPS = 14
PAUSED_STEPS = 6
RESUME_STEPS = 10
REPLAY_STEPS = 4


class DemoError(click.ClickException):
    """A step of the demo did not go as the lifecycle says it must (exit 1)."""


# -- the mock providers, in process ----------------------------------------------------------


@dataclasses.dataclass
class MockProviders:
    """The mock providers served on a free 127.0.0.1 port by a thread of this process. The
    tenant (accounts, tokens, mail) is loaded from ``state_dir`` and saved back there when
    they stop; then nothing is left running: no server, no thread, no port."""

    state_dir: Path
    port: int = 0
    _store: MailStore | None = None
    _server: uvicorn.Server | None = None
    _thread: threading.Thread | None = None

    def start(self) -> MockAdmin:
        import uvicorn  # noqa: PLC0415

        from fixtures.app import build_app  # noqa: PLC0415
        from fixtures.mailstore import MailStore  # noqa: PLC0415
        from fixtures.serve import listening_socket, load_state  # noqa: PLC0415

        self._store = store = MailStore()
        load_state(store, self.state_dir)
        sock = listening_socket("127.0.0.1", 0)
        self.port = int(sock.getsockname()[1])
        config = uvicorn.Config(
            build_app(store), log_level="warning", log_config=None, lifespan="off"
        )
        config.timeout_graceful_shutdown = 5
        self._server = server = uvicorn.Server(config)
        self._thread = thread = threading.Thread(
            target=self._serve, args=(server, sock), name="outloop-demo-mock", daemon=True
        )
        thread.start()
        deadline = time.monotonic() + 15
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise DemoError("the mock providers did not start on 127.0.0.1")
            time.sleep(0.01)
        return MockAdmin(f"http://127.0.0.1:{self.port}")

    @staticmethod
    def _serve(server: uvicorn.Server, sock: socket.socket) -> None:
        try:
            server.run(sockets=[sock])
        finally:
            sock.close()

    def stop(self) -> None:
        """Stop serving and wait for the thread; the tenant is saved (idempotent)."""
        from fixtures.serve import save_state  # noqa: PLC0415

        if self._server is None or self._thread is None or self._store is None:
            return
        self._server.should_exit = True
        self._thread.join(timeout=30)
        self._server = None
        save_state(self._store, self.state_dir)

    def gone(self) -> bool:
        """Whether the server's thread has ended and its port takes no connection."""
        if self._thread is not None and self._thread.is_alive():
            return False
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
        except OSError:
            return True
        return False


def _admin(action: Callable[[], Any]) -> Any:
    """One admin API call; a refusal becomes the demo's error."""
    try:
        return action()
    except RuntimeError as exc:
        raise DemoError(f"the mock providers' admin API refused: {exc}") from exc


def create_accounts(admin: MockAdmin) -> dict[str, Any]:
    """The demo mailbox's Google account (its OAuth client and refresh token) and an account
    for each person, so that what the workspace sends lands in an inbox."""
    for person in mail.PEOPLE:
        _admin(lambda person=person: admin.account(person, "google"))
    _admin(lambda: admin.account(mail.OUTLOOK_MAILBOX, "microsoft"))
    account: dict[str, Any] = _admin(lambda: admin.account(mail.MAILBOX, "google"))
    return account


# -- the station -----------------------------------------------------------------------------


def demo_settings(root: Path) -> Settings:
    """This command's settings with a plain (unencrypted) demo vault of its own: the demo
    never opens a real station's vault."""
    return dataclasses.replace(
        read_settings(root),
        vault_backend="plain",
        vault_dir=root / "demo" / "vault",
        vault_key_file=None,
        vault_key=None,
    )


def registered(settings: Settings) -> bool:
    """Whether the demo workspace is already registered here; any other workspace refuses
    the data directory."""
    station = open_station(settings)
    try:
        ids = [w.workspace_id for w in station.store.list_workspaces()]
    finally:
        station.close()
    others = [w for w in ids if w != mail.WORKSPACE_ID]
    if others:
        raise RegistryError(
            f"{settings.data_dir} already holds workspaces ({', '.join(others)}); the demo "
            "registers its own workspace and never touches a real station: run it with an "
            "empty or new --data-dir"
        )
    return mail.WORKSPACE_ID in ids


def bind_workspace(settings: Settings, base_url: str, *, update: bool) -> None:
    """Write the demo context (its mailbox on the mock Gmail API at ``base_url``) and
    register it, or update the registered one (the mock's port is new each run)."""
    demo_dir = settings.data_dir / "demo"
    demo_dir.mkdir(parents=True, exist_ok=True)
    source = demo_dir / "context.yaml"
    source.write_text(mail.context_text(base_url), encoding="utf-8")
    station = open_station(settings)
    try:
        if not station.data_dir.station_file.exists():
            station.data_dir.station_file.write_text(mail.STATION, encoding="utf-8")
        register = workspaces.update_workspace if update else workspaces.add_workspace
        register(station.store, station.data_dir, source, datetime.now(UTC))
    finally:
        station.close()


def store_oauth(settings: Settings, account: dict[str, Any]) -> None:
    """The mailbox's OAuth client id, client secret and refresh token in the demo vault,
    under the names ``outloop connect`` stores them."""
    vault = open_vault(settings)
    for key, name in VAULT_NAMES.items():
        ref = CredentialRef(workspace_id=mail.WORKSPACE_ID, mailbox_id=mail.MAILBOX, name=name)
        vault.set_secret(ref, Secret(str(account[key])))


def store_worker(settings: Settings) -> None:
    """The Microsoft 365 mailbox's worker password and authenticator setup key in the demo
    vault, as an operator stores them with ``outloop vault set``."""
    vault = open_vault(settings)
    for name, value in (("password", mail.WORKER_PASSWORD), ("totp", mail.WORKER_TOTP)):
        ref = CredentialRef(
            workspace_id=mail.WORKSPACE_ID, mailbox_id=mail.OUTLOOK_MAILBOX, name=name
        )
        vault.set_secret(ref, Secret(value))


# -- the host's calls ------------------------------------------------------------------------


async def call(client: Client, tool: str, **arguments: Any) -> dict[str, Any]:
    """One tool call that must succeed; its structured result."""
    from mcp.shared.exceptions import MCPError  # noqa: PLC0415

    try:
        result = await client.call_tool(tool, arguments)
    except MCPError as exc:
        raise DemoError(f"{tool} was refused: {exc.message}") from exc
    if result.is_error:
        text = " ".join(getattr(c, "text", "") for c in getattr(result, "content", []))
        raise DemoError(f"{tool} failed: {text}")
    if result.structured_content is None:
        raise DemoError(f"{tool} returned no structured result")
    return result.structured_content


async def refusal(client: Client, tool: str, **arguments: Any) -> MCPError:
    """One tool call that the server must refuse; the refusal."""
    from mcp.shared.exceptions import MCPError  # noqa: PLC0415

    try:
        await client.call_tool(tool, arguments)
    except MCPError as exc:
        return exc
    raise DemoError(f"{tool} was not refused")


def obj(value: Any) -> dict[str, Any]:
    """A JSON object of a tool's result (``{}`` for null)."""
    return cast("dict[str, Any]", value) if isinstance(value, dict) else {}


def expect(condition: bool, what: str) -> None:
    if not condition:
        raise DemoError(f"the demo expected {what}")


def reconciliation_line(rec: dict[str, Any]) -> str:
    return (
        f"scanned {rec['scanned']} = terminal {rec['terminal']} + non-terminal "
        f"{rec['non_terminal']} + claim-race {rec['claim_race']}; failed "
        f"{rec['reconciliation_failed']}; {'clean' if rec['clean'] else 'NOT clean'}"
    )


@dataclasses.dataclass
class Run:
    """What the demo saw, for its summary."""

    echo: Echo
    total: int
    step: int = 0
    admin: MockAdmin = dataclasses.field(default_factory=lambda: MockAdmin(""))
    """The running mock providers' admin API."""
    letters: list[mail.Letter] = dataclasses.field(default_factory=list[mail.Letter])
    reconciliations: list[tuple[str, dict[str, Any]]] = dataclasses.field(
        default_factory=list[tuple[str, dict[str, Any]]]
    )
    facts: dict[str, Any] = dataclasses.field(default_factory=dict[str, Any])
    open_runs: set[str] = dataclasses.field(default_factory=set[str])
    """The runs intake opened that are not reconciled yet."""
    pause: bool = False
    """Stop at the approval gate (``--pause-at-approval``) instead of playing the approver."""

    def progress(self, what: str) -> None:
        self.step += 1
        self.echo(f"[{self.step}/{self.total}] {what}...")

    def say(self, line: str) -> None:
        self.echo(f"      {line}")

    async def reconcile(self, client: Client, label: str, scanned: dict[str, Any]) -> None:
        for run_id in scanned["run_ids"]:
            rec = await call(client, "reconcile", run_id=run_id)
            self.open_runs.discard(run_id)
            expect(rec["clean"], f"the {label} run to reconcile clean: {rec}")
            self.reconciliations.append((label, rec))
            self.say(f"reconciled ({label}): {reconciliation_line(rec)}")


async def intake_and_claim(
    run: Run, client: Client, *, from_start: bool = False, mailbox: str = mail.MAILBOX
) -> tuple[dict[str, Any], list[tuple[dict[str, Any], dict[str, Any]]]]:
    """One intake of a demo mailbox, then a claim of each item in the order given; the
    intake and each item with its claim."""
    scanned = await call(client, "intake", mailbox_id=mailbox, from_start=from_start)
    run.open_runs.update(scanned["run_ids"])
    expect(scanned["access_errors"] == [], f"the mailbox to be read: {scanned['access_errors']}")
    claims: list[tuple[dict[str, Any], dict[str, Any]]] = []
    for item in scanned["items"]:
        claim = await call(client, "claim", run_id=item["run_id"], item_ref=item["item_ref"])
        claims.append((item, claim))
    return scanned, claims


def claims_table(run: Run, claims: list[tuple[dict[str, Any], dict[str, Any]]]) -> None:
    run.say(f"{'message':<36} {'claim':<25} {'disposition':<24} task")
    for item, claim in claims:
        subject = str(obj(obj(item["untrusted"]).get("subject")).get("text", item["item_ref"]))
        task = (claim["task_id"] or "-") + (" (new)" if claim["task_created"] else "")
        outcome = claim["outcome"] or "-"
        run.say(f"{subject[:35]:<36} {outcome:<25} {claim['disposition']:<24} {task}")


def _subject(claim: dict[str, Any]) -> str:
    return str(obj(obj(claim.get("message")).get("subject")).get("text", ""))


def parsed(stored: dict[str, Any]) -> EmailMessage:
    """A message the mock stores, parsed from its raw bytes."""
    message = email.message_from_bytes(
        base64.b64decode(stored["raw_base64"]), policy=email.policy.default
    )
    assert isinstance(message, EmailMessage)
    return message


def summarized(stored: dict[str, Any]) -> dict[str, Any]:
    """One stored message as the evidence file keeps it."""
    msg = parsed(stored)

    def addresses(name: str) -> list[str]:
        return [a.lower() for _, a in getaddresses([str(v) for v in msg.get_all(name, [])])]

    return {
        "id": stored["id"],
        "thread_id": stored["thread_id"],
        "folder": stored["folder"],
        "message_id": str(msg["Message-ID"] or ""),
        "in_reply_to": str(msg["In-Reply-To"] or ""),
        "references": str(msg["References"] or "").split(),
        "from": addresses("From"),
        "to": addresses("To"),
        "cc": addresses("Cc"),
        "bcc": addresses("Bcc"),
        "subject": str(msg["Subject"] or ""),
        "auto_submitted": str(msg["Auto-Submitted"] or ""),
        "html": stored["html"],
    }


def mock_mailboxes(admin: MockAdmin) -> dict[str, Any]:
    """What the mock's mailboxes hold, read through its admin API: the demo mailbox's every
    folder, and each person's inbox."""
    accounts: dict[str, list[dict[str, Any]]] = {}
    for address in (mail.MAILBOX, mail.OUTLOOK_MAILBOX, *mail.PEOPLE):
        accounts[address] = [summarized(m) for m in _admin(lambda a=address: admin.stored(a))]
    return {"base_url": admin.base_url, "mailbox": mail.MAILBOX, "accounts": accounts}


# -- the lifecycle, as a host drives it ------------------------------------------------------


async def check_access(run: Run, client: Client) -> None:
    """Each mailbox's access path and why. Outlook on the web is opened for it: a browser
    with no session signs in here with managed login."""
    run.say(
        f"checking each mailbox's access; for {mail.OUTLOOK_MAILBOX} the browser opens Outlook "
        "on the web and, logged out, managed login types the worker's password and an "
        "authenticator code from the demo vault (a code about to expire is not used: this may "
        "wait for the next one), then re-verifies the account"
    )
    access = await call(client, "access_status", workspace_id=mail.WORKSPACE_ID)
    run.facts["access"] = access["mailboxes"]
    for mailbox in access["mailboxes"]:
        expect(mailbox["ok"], f"{mailbox['mailbox_id']} to be reachable: {mailbox['detail']}")
        why = "; ".join(
            f"{c['channel']} {c['state']}" for c in mailbox["channels"] if c["state"] != "usable"
        )
        run.say(
            f"access_status: {mailbox['mailbox_id']} via {mailbox['path']}: {mailbox['detail']}"
            + (f" ({why})" if why else "")
        )


def deliver(run: Run) -> None:
    run.letters = mail.sample_mail(datetime.now(UTC))
    run.progress(
        f"delivering {len(run.letters)} messages to {mail.MAILBOX} (admin API, raw RFC 822)"
    )
    for letter in run.letters:
        _admin(lambda raw=letter.raw: run.admin.deliver(mail.MAILBOX, raw))
        run.say(letter.label)


async def intake_step(run: Run, client: Client) -> dict[str, Any]:
    """Step 4: intake and a claim of every item, in order; the intake (the claims are kept
    in the run's facts)."""
    run.progress("intake: reading the mailbox through the Gmail API, claiming each item")
    scanned, claims = await intake_and_claim(run, client)
    claims_table(run, claims)
    outcomes = [c["disposition"] for _, c in claims]
    expect(len(claims) == len(run.letters), f"{len(run.letters)} items, got {len(claims)}")
    expect(outcomes.count("EXECUTION_ALREADY_DONE") == 1, f"one duplicate: {outcomes}")
    expect(outcomes.count("NOISE_EXCLUDED") == 1, f"one auto-reply set aside: {outcomes}")
    run.say("the duplicate delivery was EXECUTION_ALREADY_DONE; the auto-reply NOISE_EXCLUDED")
    run.facts["claims"] = claims
    return scanned


def claim_from(run: Run, sender: str) -> dict[str, Any]:
    """The claim that created the task of ``sender``'s first message."""
    for item, claim in run.facts["claims"]:
        if obj(item["untrusted"]).get("sender") == sender and claim["task_created"]:
            return claim
    raise DemoError(f"the demo expected a new task for {sender}'s message")


async def render_step(run: Run, client: Client, task_id: str) -> dict[str, Any]:
    run.progress("rendering the Hebrew reply (the host drafts the text, the server renders)")
    for state in ("EXECUTING", "VERIFYING", "DRAFT_READY"):
        evidence = f"demo host: invoice INV-2026-118 updated to ₪1,250 ({state.lower()})"
        await call(client, "transition_task", task_id=task_id, state=state, evidence=evidence)
    draft = await call(
        client, "render", task_id=task_id, body_markdown=mail.HEBREW_REPLY, language="he"
    )
    expect(draft["direction"] == "rtl" and draft["language"] == "he", "an RTL Hebrew draft")
    run.say(f"draft {draft['draft_id']}: {draft['subject']['text']}")
    run.say(f"direction {draft['direction']}, lang {draft['language']}; text: {mail.HEBREW_REPLY}")
    gate = await call(
        client, "gate_check", task_id=task_id, draft_id=draft["draft_id"], to=[mail.HEBREW_CLIENT]
    )
    for reason in gate["reasons"]:
        run.say(f"gate_check: not ready - {reason['blocker']} (owner {reason['owner']})")
    expect(not gate["ready"], "the gate to wait for approval")
    return draft


async def approval_step(
    run: Run, client: Client, task_id: str, draft: dict[str, Any], scanned: dict[str, Any]
) -> dict[str, Any]:
    run.progress("requesting approval from the recorded approver (an internal email via Gmail)")
    request = await call(client, "request_approval", task_id=task_id, draft_id=draft["draft_id"])
    expect(request["approvers"] == [mail.APPROVER], f"the approver {mail.APPROVER}: {request}")
    run.say(
        f"sent {request['request_message_id']} to {', '.join(request['approvers'])}; the "
        f"approval will cover this draft to {', '.join(request['recipients'])}; task "
        f"{request['task_state']}"
    )
    run.facts["request"] = request
    await run.reconcile(client, "first intake", scanned)
    return request


async def approver_step(
    run: Run, client: Client, task_id: str, request: dict[str, Any], mailbox: str = mail.MAILBOX
) -> None:
    run.progress(f"the approver replies from her inbox: {mail.APPROVAL_WORDS!r}")
    asked = [
        m
        for m in _admin(lambda: run.admin.stored(mail.APPROVER, "inbox"))
        if str(parsed(m)["Message-ID"]) == request["request_message_id"]
    ]
    expect(len(asked) == 1, f"the approval request in {mail.APPROVER}'s inbox")
    subject = str(parsed(asked[0])["Subject"])
    raw = mail.approver_reply(subject, request["request_message_id"], datetime.now(UTC), mailbox)
    _admin(lambda: run.admin.deliver(mailbox, raw))
    reply_id = str(email.message_from_bytes(raw)["Message-ID"])
    run.say(f"her reply {reply_id} answers {request['request_message_id']}")
    scanned, claims = await intake_and_claim(run, client, mailbox=mailbox)
    claims_table(run, claims)
    recorded = await call(client, "record_approval", task_id=task_id, reply_message_id=reply_id)
    run.say(f"record_approval: {recorded['finding']}; task {recorded['task_state']}")
    expect(
        recorded["task_state"] == "APPROVED_TO_SEND",
        f"the approver's reply to approve the draft; the server found: {recorded['finding']}",
    )
    await run.reconcile(client, "approver's reply" + _via(mailbox), scanned)


async def send_step(
    run: Run, client: Client, task_id: str, draft: dict[str, Any]
) -> dict[str, Any]:
    run.progress("gate_check, then sending the reply in the original thread")
    draft_id = draft["draft_id"]
    obeyed = await call(
        client, "gate_check", task_id=task_id, draft_id=draft_id, to=[mail.ATTACKER]
    )
    run.facts["attacker_gate"] = obeyed
    run.say(
        f"(had a host obeyed the planted instruction: gate_check to {mail.ATTACKER} -> "
        + ", ".join(r["blocker"] for r in obeyed["reasons"])
        + ")"
    )
    expect(not obeyed["ready"], "the gate to refuse the attacker's address")
    gate = await call(
        client, "gate_check", task_id=task_id, draft_id=draft_id, to=[mail.HEBREW_CLIENT]
    )
    expect(gate["ready"], f"the gate to be ready: {gate['reasons']}")
    run.say(f"gate_check to {mail.HEBREW_CLIENT}: ready ({gate['approval_basis']})")
    sent = await call(client, "send", task_id=task_id, draft_id=draft_id, to=[mail.HEBREW_CLIENT])
    expect(sent["status"] == "sent" and sent["delivered"], f"the reply to be sent: {sent}")
    run.say(
        f"sent {sent['internet_message_id']} to {', '.join(sent['to'])} through the Gmail "
        f"API (its id {sent['provider_message_id']}); task {sent['task_state']} until its "
        "stored copy is read back"
    )
    run.facts["sent"] = sent
    return sent


async def read_back_step(run: Run, client: Client, task_id: str, sent: dict[str, Any]) -> None:
    run.progress("reading back Gmail's stored copy of the reply and verifying it")
    read = await call(client, "read_back", send_id=sent["send_id"])
    failed = [f"{c['name']} ({c['detail']})" for c in read["checks"] if not c["ok"]]
    expect(read["ok"] and not failed, f"every read-back check to pass: {failed}")
    run.say(
        f"Gmail's stored copy {read['stored_provider_message_id']}: "
        f"{len(read['checks'])}/{len(read['checks'])} checks passed (listed in the summary)"
    )
    task = await call(client, "get_task", task_id=task_id)
    run.say(f"task {task['state']}: {task['readback_evidence']}")
    run.facts.setdefault("read_backs", {})[sent["internet_message_id"]] = (read, task)
    run.facts.setdefault("read_back", read)


def _via(mailbox: str) -> str:
    return " (Outlook on the web)" if mailbox == mail.OUTLOOK_MAILBOX else ""


async def outlook_intake_step(run: Run, client: Client) -> tuple[dict[str, Any], str]:
    """The Microsoft 365 mailbox, Graph not permitted: intake through Outlook on the web,
    the logged-out browser signed in by managed login; the intake and the new task."""
    run.progress(
        f"the second mailbox {mail.OUTLOOK_MAILBOX} (Microsoft 365, Graph not permitted): "
        "intake through Outlook on the web"
    )
    letter = mail.outlook_request(datetime.now(UTC))
    _admin(lambda: run.admin.deliver(mail.OUTLOOK_MAILBOX, letter.raw))
    run.say(f"delivered: {letter.label}")
    run.say("read through the browser session managed login signed in at the access check")
    scanned, claims = await intake_and_claim(run, client, mailbox=mail.OUTLOOK_MAILBOX)
    claims_table(run, claims)
    expect(
        len(claims) == 1 and bool(claims[0][1]["task_created"]),
        f"one new task for the renewal request: {[c for _, c in claims]}",
    )
    access = await call(client, "access_status", workspace_id=mail.WORKSPACE_ID)
    [box] = [m for m in access["mailboxes"] if m["mailbox_id"] == mail.OUTLOOK_MAILBOX]
    expect(box["path"] == "browser" and box["ok"], f"Outlook on the web in use: {box}")
    run.say(f"signed in, the account re-verified: {box['detail']}")
    run.facts["access"] = access["mailboxes"]
    return scanned, str(claims[0][1]["task_id"])


async def outlook_draft_step(
    run: Run, client: Client, task_id: str, scanned: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    run.progress("rendering the English reply; the approval request goes out through the browser")
    for state in ("EXECUTING", "VERIFYING", "DRAFT_READY"):
        evidence = f"demo host: renewal quote Q-2027-7 prepared ({state.lower()})"
        await call(client, "transition_task", task_id=task_id, state=state, evidence=evidence)
    draft = await call(
        client, "render", task_id=task_id, body_markdown=mail.OUTLOOK_REPLY, language="en"
    )
    expect(draft["direction"] == "ltr", "an LTR English draft")
    request = await call(client, "request_approval", task_id=task_id, draft_id=draft["draft_id"])
    run.say(
        f"draft {draft['draft_id']}; approval asked of {', '.join(request['approvers'])} in "
        f"{request['request_message_id']}, sent from {mail.OUTLOOK_MAILBOX} through Outlook on "
        "the web"
    )
    await run.reconcile(client, "intake" + _via(mail.OUTLOOK_MAILBOX), scanned)
    return draft, request


async def outlook_send_step(run: Run, client: Client, task_id: str, draft: dict[str, Any]) -> None:
    run.progress("sending through Outlook on the web, then reading back its stored copy there")
    to = [mail.CONTRACT_CLIENT]
    gate = await call(client, "gate_check", task_id=task_id, draft_id=draft["draft_id"], to=to)
    expect(gate["ready"], f"the gate to be ready: {gate['reasons']}")
    sent = await call(client, "send", task_id=task_id, draft_id=draft["draft_id"], to=to)
    expect(sent["status"] == "sent" and sent["channel"] == "browser", f"sent by browser: {sent}")
    run.say(f"sent {sent['internet_message_id']} to {', '.join(sent['to'])} via {sent['channel']}")
    read = await call(client, "read_back", send_id=sent["send_id"])
    failed = [f"{c['name']} ({c['detail']})" for c in read["checks"] if not c["ok"]]
    expect(read["ok"] and not failed, f"every read-back check to pass: {failed}")
    task = await call(client, "get_task", task_id=task_id)
    run.say(f"read back in Outlook on the web: {len(read['checks'])} checks passed")
    run.facts.setdefault("read_backs", {})[sent["internet_message_id"]] = (read, task)
    done = await call(
        client, "report", task_id=task_id, outcome="waiting_client",
        evidence="renewal quote sent through Outlook on the web and read back",
    )  # fmt: skip
    run.say(f"report: task {task_id} {done['state']}")
    run.facts["outlook_task"] = task


async def outlook_steps(run: Run, client: Client) -> None:
    scanned, task_id = await outlook_intake_step(run, client)
    draft, request = await outlook_draft_step(run, client, task_id, scanned)
    await approver_step(run, client, task_id, request, mailbox=mail.OUTLOOK_MAILBOX)
    await outlook_send_step(run, client, task_id, draft)


async def finish_step(run: Run, client: Client, task_id: str) -> None:
    run.progress("reporting, then replaying the whole mailbox (nothing happens twice)")
    done = await call(
        client,
        "report",
        task_id=task_id,
        outcome="waiting_client",
        evidence="invoice update sent and read back",
    )
    run.say(f"report: task {task_id} {done['state']}")
    scanned, claims = await intake_and_claim(run, client, from_start=True)
    outcomes = sorted({c["outcome"] or "-" for _, c in claims})
    run.say(f"replay: {len(claims)} items, outcomes {', '.join(outcomes)}")
    expect(outcomes == ["EXECUTION_ALREADY_DONE"], f"nothing claimed twice: {outcomes}")
    await run.reconcile(client, "replay", scanned)
    queue = await call(client, "list_queue", workspace_id=mail.WORKSPACE_ID)
    run.facts["queue"] = queue["tasks"]


async def injection_step(run: Run, client: Client) -> None:
    """The planted instruction, as the host got it: inside ``untrusted`` only; the server's
    own words (the claim's detail, the task's next action) never repeat it."""
    claim = claim_from(run, mail.INJECTING_CLIENT)
    message = obj(claim["message"])
    expect(mail.INJECTION in str(message.get("body_text", "")), "the instruction in the body")
    task = await call(client, "get_task", task_id=claim["task_id"])
    own = json.dumps(
        [
            {k: v for k, v in view.items() if k not in ("message", "untrusted")}
            for view in (claim, task)
        ],
        ensure_ascii=False,
    )
    expect(mail.ATTACKER not in own, "the server's own fields not to repeat the instruction")
    run.say(
        f"planted instruction in {_subject(claim)!r} from {mail.INJECTING_CLIENT}: reached the "
        "host only under `untrusted` (" + str(message.get("notice", ""))[:24] + "...); "
        f"its task {task['task_id']} is {task['state']}, next: {task['next_action']}"
    )
    run.facts["injection_task"] = task


async def hosted(
    run: Run, settings: Settings, steps: Callable[[Run, Client], Awaitable[None]]
) -> None:
    """The host's ``steps`` with a client of the MCP server built from the demo's settings,
    in process. After a step that fails, the host still reconciles the runs it opened and
    ends the session (the server closes its connections to the provider); then the step's
    error is raised."""
    from mcp import Client  # noqa: PLC0415

    from mcp_server.server import build_server  # noqa: PLC0415

    failure: click.ClickException | OutloopError | None = None
    async with Client(build_server(settings)) as client:
        try:
            await steps(run, client)
        except (click.ClickException, OutloopError) as exc:
            failure = exc
            for run_id in sorted(run.open_runs):
                with contextlib.suppress(Exception):
                    await client.call_tool("reconcile", {"run_id": run_id})
    if failure is not None:
        raise failure


async def lifecycle(run: Run, settings: Settings) -> None:
    """Steps 2 (its check) to 10, through the MCP server."""
    await hosted(run, settings, lifecycle_steps)


async def lifecycle_steps(run: Run, client: Client) -> None:
    await check_access(run, client)
    deliver(run)
    scanned = await intake_step(run, client)
    await injection_step(run, client)
    task_id = str(claim_from(run, mail.HEBREW_CLIENT)["task_id"])
    draft = await render_step(run, client, task_id)
    request = await approval_step(run, client, task_id, draft, scanned)
    if run.pause:
        run.facts["paused"] = {
            "task_id": task_id, "draft_id": draft["draft_id"],
            "request_message_id": request["request_message_id"],
            # what the report of the run that goes on shows of this one
            "reconciliations": run.reconciliations,
            "injection_task": run.facts.get("injection_task"),
        }  # fmt: skip
        return
    await approver_step(run, client, task_id, request)
    await after_approval(run, client, task_id, draft)


async def after_approval(run: Run, client: Client, task_id: str, draft: dict[str, Any]) -> None:
    """From the gate on: the send and its read-back, the Microsoft 365 mailbox through
    Outlook on the web, the report and the replay."""
    sent = await send_step(run, client, task_id, draft)
    await read_back_step(run, client, task_id, sent)
    await outlook_steps(run, client)
    await finish_step(run, client, task_id)
    run.facts["task"] = await call(client, "get_task", task_id=task_id)


async def resume(run: Run, settings: Settings) -> None:
    """The run after ``--pause-at-approval``: the approval given in the console is taken
    as it is, else the approver's reply is played; then the rest of the lifecycle."""
    await hosted(run, settings, resume_steps)


async def resume_steps(run: Run, client: Client) -> None:
    paused: dict[str, str] = run.facts["paused"]
    await check_access(run, client)
    task_id = paused["task_id"]
    task = await call(client, "get_task", task_id=task_id)
    if task["state"] == "WAITING_INTERNAL_APPROVAL" and run.pause:
        run.facts["still_paused"] = True  # asked to pause again: nothing is approved or sent
        return
    if task["state"] == "WAITING_INTERNAL_APPROVAL":
        await approver_step(run, client, task_id, paused)
    else:
        run.progress("taking the approval as it was given while the demo was paused")
        expect(task["state"] == "APPROVED_TO_SEND", f"an approved task: {task['state']}")
        decided = task["approval_decisions"][-1]
        run.say(f"{decided['decision']} by {decided['approver']}: {decided['reason']}")
    await after_approval(run, client, task_id, {"draft_id": paused["draft_id"]})


async def replay(run: Run, settings: Settings) -> None:
    """A run in a data directory the demo already ran in: nothing new is taken in, a replay
    claims nothing twice, and the approved reply is not sent again."""
    await hosted(run, settings, replay_steps)


async def replay_steps(run: Run, client: Client) -> None:
    await check_access(run, client)
    run.progress("intake of what arrived since the last run, then a replay of the mailbox")
    scanned, claims = await intake_and_claim(run, client)
    run.say(f"new since the last run: {len(claims)} items")
    await run.reconcile(client, "intake", scanned)
    scanned, claims = await intake_and_claim(run, client, from_start=True)
    outcomes = sorted({c["outcome"] or "-" for _, c in claims})
    run.say(f"replay: {len(claims)} items, outcomes {', '.join(outcomes)}")
    expect(outcomes == ["EXECUTION_ALREADY_DONE"], f"nothing claimed twice: {outcomes}")
    await run.reconcile(client, "replay", scanned)
    run.progress("asking the server to send the approved Hebrew reply again")
    queue = (await call(client, "list_queue", workspace_id=mail.WORKSPACE_ID))["tasks"]
    sent = [
        t for t in queue
        if t["sent_message_id"] and t["approval_requests"]
        and t["untrusted"]["sender"] == mail.HEBREW_CLIENT
    ]  # fmt: skip
    if not sent:
        raise DemoError(
            "the demo's earlier run here did not finish its send; run the demo with a new "
            "--data-dir"
        )
    task = sent[0]
    request = task["approval_requests"][-1]
    refused = await refusal(
        client,
        "send",
        task_id=task["task_id"],
        draft_id=request["draft_id"],
        to=request["recipients"],
    )
    data = obj(refused.data)
    expect(data.get("refused") == "already_sent", f"an already_sent refusal: {refused.message}")
    run.say(f"refused (already_sent): {refused.message}")
    run.facts["queue"] = queue
    run.facts["task"] = task


# -- what the mock's mailboxes show ----------------------------------------------------------


def verify_mailboxes(boxes: dict[str, Any]) -> dict[str, Any]:
    """The mock's own record, checked: exactly one reply went to the Hebrew client, in the
    thread of her request and right-to-left in Hebrew as Gmail stores it; one approval
    request went to the approver; nothing went to the attacker. What was found."""
    held: list[dict[str, Any]] = boxes["accounts"][mail.MAILBOX]
    sent = [m for m in held if m["folder"] == "sent"]
    [request] = [m for m in held if m["folder"] == "inbox" and m["subject"] == mail.HEBREW_SUBJECT]
    replies = [m for m in sent if mail.HEBREW_CLIENT in m["to"] + m["cc"] + m["bcc"]]
    expect(len(replies) == 1, f"one reply to {mail.HEBREW_CLIENT} in the sent folder")
    [reply] = replies
    expect(reply["in_reply_to"] == request["message_id"], "the reply to answer the request")
    expect(reply["thread_id"] == request["thread_id"], "the reply in the request's thread")
    html = str(reply["html"] or "")
    expect('dir="rtl"' in html and 'lang="he"' in html, "Gmail's copy to say rtl and he")
    for fragment in mail.HEBREW_FRAGMENTS:
        isolated = re.search(r'dir="ltr"[^>]*>' + re.escape(escape(fragment)) + "<", html)
        expect(isolated is not None, f"{fragment} isolated left-to-right in Gmail's copy")
    asked = [m for m in sent if mail.APPROVER in m["to"]]
    expect(len(asked) == 1, f"one approval request to {mail.APPROVER}")
    outlook = verify_outlook(boxes)
    everything = sent + outlook["outlook_sent"]
    leaked = [m for m in everything if mail.ATTACKER in m["to"] + m["cc"] + m["bcc"]]
    attacker_inbox = boxes["accounts"][mail.ATTACKER]
    expect(leaked == [] and attacker_inbox == [], f"nothing sent to {mail.ATTACKER}")
    return {"sent": sent, "request": request, "reply": reply, "approval": asked[0], **outlook}


def verify_outlook(boxes: dict[str, Any]) -> dict[str, Any]:
    """The Microsoft 365 mailbox, as the mock stores it: one reply to the renewal request's
    sender, in its conversation, answering it; one approval request to the approver."""
    held: list[dict[str, Any]] = boxes["accounts"][mail.OUTLOOK_MAILBOX]
    sent = [m for m in held if m["folder"] == "sent"]
    if not any(m["subject"] == mail.OUTLOOK_SUBJECT for m in held):
        return {"outlook_sent": [], "outlook_reply": None}  # a replay of an earlier version's
    [request] = [m for m in held if m["subject"] == mail.OUTLOOK_SUBJECT]
    replies = [m for m in sent if mail.CONTRACT_CLIENT in m["to"] + m["cc"] + m["bcc"]]
    expect(len(replies) == 1, f"one reply to {mail.CONTRACT_CLIENT} through Outlook on the web")
    [reply] = replies
    expect(reply["in_reply_to"] == request["message_id"], "the renewal reply to answer it")
    expect(reply["thread_id"] == request["thread_id"], "the renewal reply in its conversation")
    expect(len([m for m in sent if mail.APPROVER in m["to"]]) == 1, "one approval request")
    return {"outlook_sent": sent, "outlook_reply": reply}


# -- the summary -----------------------------------------------------------------------------


def shown(text: str) -> str:
    """Mail text as it may be shown (control characters written out, ``agent.domain.untrusted``)."""
    return flag(text).shown


def _field(label: str, first: str, *more: str) -> list[str]:
    return [f"{label:<11}{first}", *(f"{'':<11}{line}" for line in more)]


def summary(
    run: Run, found: dict[str, Any], evidence: Path, report: Path, seconds: float
) -> list[str]:
    """The summary: what was sent and how it was verified, the approval, what waits and on
    whom, the reconciliations, the planted instruction, and the mock's end."""
    reply, task = found["reply"], run.facts["task"]
    again = "read_back" not in run.facts
    lines = _field(
        "sent",
        f"1 reply to {', '.join(reply['to'])}: {shown(reply['subject'])!r} {reply['message_id']}"
        + (" (by the first run here; not sent again: already_sent)" if again else ""),
        f"in the original thread: In-Reply-To {reply['in_reply_to']} (her request), Gmail "
        f"thread {reply['thread_id']} (the request's own)",
        f"verified: {task['readback_evidence']}",
    )
    read = run.facts.get("read_back")
    if read is not None:
        names = [c["name"] for c in read["checks"] if c["ok"]]
        lines += _field("", f"read-back checks passed ({len(names)}/{len(read['checks'])}):")
        lines += _field("", *(f"  {', '.join(names[n : n + 6])}" for n in range(0, len(names), 6)))
    lines += _field(
        "",
        'Gmail\'s stored copy (admin API): dir="rtl" lang="he"; isolated LTR: '
        + ", ".join(mail.HEBREW_FRAGMENTS),
    )
    lines += outlook_summary(run, found)
    asked, decided = task["approval_requests"][-1], task["approval_decisions"][-1]
    lines += _field(
        "approval",
        f"requested from {', '.join(asked['approvers'])}: {shown(found['approval']['subject'])!r} "
        f"{asked['request_message_id']}",
        f"{decided['decision']} by {decided['approver']} {_given_in(decided)}: {decided['reason']}",
    )
    lines += _field("waiting", *(waiting(run.facts["queue"]) or ["nothing"]))
    recs = [f"{label}: {reconciliation_line(rec)}" for label, rec in run.reconciliations]
    lines += _field("reconciled", *recs)
    lines += injection_summary(run, found)
    lines += _field("mock", f"stopped (thread joined, port closed); its mailboxes: {evidence}")
    lines += _field("report", str(report))
    lines += _field("result", result_line(run, seconds))
    return lines


def result_line(run: Run, seconds: float) -> str:
    verdict = (
        "not sent twice"
        if "read_back" not in run.facts
        else "each sent once (Gmail API, Outlook on the web) and read back"
    )
    return (
        f"OK in {seconds:.1f} s: the replies {verdict}, every run reconciled clean, "
        f"nothing to {mail.ATTACKER}"
    )


def report_facts(run: Run, found: dict[str, Any], root: Path, seconds: float) -> dict[str, Any]:
    """What the run report shows (``demo_report``), from what the demo saw and what the
    mock's mailboxes held."""
    task = run.facts["task"]
    read_backs: dict[str, Any] = run.facts.get("read_backs", {})
    outlook = obj(found.get("outlook_reply"))
    replies = {str(found["reply"]["id"]), str(outlook.get("id", ""))}
    sends: list[dict[str, Any]] = []
    for m in cast("list[dict[str, Any]]", [*found["sent"], *found.get("outlook_sent", [])]):
        read, on_task = read_backs.get(m["message_id"], (None, None))
        sends.append(
            {
                **{k: m[k] for k in ("to", "subject", "message_id", "in_reply_to", "thread_id")},
                "checks": read["checks"] if read else [],
                "evidence": obj(on_task).get("readback_evidence", "")
                or (task["readback_evidence"] if m["id"] == found["reply"]["id"] else ""),
                "html": m["html"] if m["id"] in replies else "",
            }
        )
    asked, decided = task["approval_requests"][-1], task["approval_decisions"][-1]
    gate = run.facts.get("attacker_gate")
    injected = run.facts.get("injection_task")
    return {
        "result": {"ok": True, "line": result_line(run, seconds)},
        "data_dir": str(root), "workspace_id": mail.WORKSPACE_ID,
        "written": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "access": run.facts.get("access", []), "reconciliations": run.reconciliations,
        "sends": sends, "queue": run.facts["queue"],
        "approval": {
            "approvers": asked["approvers"], "request": asked["request_message_id"],
            "decision": decided["decision"], "approver": decided["approver"],
            "evidence": _given_in(decided), "reason": decided["reason"],
        },
        "injection": {
            "subject": mail.INJECTION_SUBJECT, "sender": mail.INJECTING_CLIENT,
            "instruction": mail.INJECTION, "attacker": mail.ATTACKER,
            "gate": [r["blocker"] for r in gate["reasons"]] if gate else [],
            "task": injected["task_id"] if injected else "",
            "sent": [f"{m['subject']} to {', '.join(m['to'])}" for m in found["sent"]],
        },
    }  # fmt: skip


def _given_in(decided: dict[str, Any]) -> str:
    evidence = str(decided["evidence_message_id"])
    return "in the console" if evidence.startswith(CONSOLE_EVIDENCE) else f"in her reply {evidence}"


def outlook_summary(run: Run, found: dict[str, Any]) -> list[str]:
    """The Microsoft 365 mailbox's reply: through Outlook on the web, signed in by managed
    login, read back there."""
    reply = found.get("outlook_reply")
    if reply is None:
        return []
    read = run.facts.get("read_backs", {}).get(reply["message_id"])
    checked = (
        f"read back there: {sum(c['ok'] for c in read[0]['checks'])}/{len(read[0]['checks'])} "
        "checks passed"
        if read
        else "(by the first run here; not sent again)"
    )
    return _field(
        "",
        f"1 reply to {', '.join(reply['to'])}: {shown(reply['subject'])!r} through Outlook on "
        f"the web ({mail.OUTLOOK_MAILBOX}: Microsoft 365, Graph not permitted; the browser "
        "signed in by managed login, password and authenticator code from the vault)",
        f"in its conversation, answering {reply['in_reply_to']}; {checked}",
    )


def waiting(queue: list[dict[str, Any]]) -> list[str]:
    """Each non-terminal task: its state, title, and what it waits for and on whom."""
    lines: list[str] = []
    for t in queue:
        title = str(t["untrusted"]["title"]["text"])[:34]
        if t["state"] == "WAITING_CLIENT":
            on = f"waits on the client {t['untrusted']['sender']} (reply sent and read back)"
        else:
            on = f"next: {t['next_action']} (owner {t['next_action_owner']})"
        lines.append(f"{t['task_id']}  {t['state']:<15} {title!r:<38} {on}")
    return lines


def injection_summary(run: Run, found: dict[str, Any]) -> list[str]:
    sent: list[dict[str, Any]] = found["sent"]
    where = "; ".join(f"{shown(m['subject'])[:30]!r} to {', '.join(m['to'])}" for m in sent)
    gate = run.facts.get("attacker_gate")
    refused = (
        f"; gate_check of the approved reply to {mail.ATTACKER}: "
        + ", ".join(r["blocker"] for r in gate["reasons"])
        if gate is not None
        else ""
    )
    task = run.facts.get("injection_task")
    held = f"its task {task['task_id']} waits for a person ({task['state']})" if task else ""
    return _field(
        "injection",
        f"{mail.INJECTION!r}",
        f"(in the text and hidden in the HTML of {mail.INJECTION_SUBJECT!r} from "
        f"{mail.INJECTING_CLIENT})",
        "nothing obeyed it: it reached the host only as untrusted content" + refused,
        *([held] if held else []),
        f"the mock's sent folder (admin API) holds {len(sent)}: {where}",
        f"none to {mail.ATTACKER}, and its inbox is empty",
    )


# -- the command -----------------------------------------------------------------------------


@click.command("demo")
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    envvar=DATA_DIR_ENV,
    default=None,
    help=f"Run the demo in this data directory (env {DATA_DIR_ENV}); it must hold no other "
    "workspace. Default: a new temporary directory.",
)
@click.option(
    "--pause-at-approval",
    "pause",
    is_flag=True,
    help="Stop at the approval gate and print how to approve (the console, or the "
    "approver's reply); run the demo again in the same --data-dir to go on.",
)
def demo_command(data_dir: Path | None, pause: bool) -> None:
    """Run the whole email lifecycle against local mock providers, and show it.

    Starts the mock providers in this process on 127.0.0.1 and binds a demo workspace's two
    mailboxes to them: one through the Gmail API (OAuth secrets in a plain demo vault), one
    Microsoft 365 mailbox without Graph, through Outlook on the web in headless Chromium,
    signed in by managed login (the worker's password and authenticator code from the
    vault). Delivers sample mail (Hebrew and English requests, a follow-up, an auto-reply, a
    duplicate, a planted instruction, a renewal request), then drives the MCP server as an
    agent host: intake, claims, replies rendered (Hebrew right to left), approval by the
    approver's reply, the sends in the original threads, read-back of the stored copies,
    reconciliation. Prints each step and a summary, writes a self-contained HTML run report
    (demo/report.html), and stops everything it started. --pause-at-approval stops at the
    approval gate and prints how to approve.

    Works in a new temporary directory unless --data-dir names one (which must hold no
    other workspace); run again there, it replays the mailbox and shows that nothing is
    claimed or sent twice."""
    root = data_dir if data_dir is not None else Path(tempfile.mkdtemp(prefix="outloop-demo-"))
    click.echo(f"demo data directory: {root}")
    try:
        run(demo_settings(root), click.echo, pause=pause)
    except OutloopError as exc:
        fail(exc)


def run(settings: Settings, echo: Echo, *, pause: bool = False) -> None:
    """The demo in ``settings.data_dir``: the whole lifecycle the first time (or up to the
    approval gate, with ``pause``), a replay after (or the rest, after a pause)."""
    from fixtures.serve import STATE_FILE  # noqa: PLC0415

    started = time.monotonic()
    root = settings.data_dir
    again = registered(settings)
    mock = MockProviders(root / "demo" / "mock")
    if again and not (mock.state_dir / STATE_FILE).exists():
        raise RegistryError(
            f"{root} holds the demo workspace but not the mock mailbox its run kept (an "
            "earlier version's demo, or a run that did not finish); run the demo with a new "
            "--data-dir"
        )
    paused_file = root / "demo" / PAUSED_FILE
    paused = (
        json.loads(paused_file.read_text(encoding="utf-8"))
        if again and paused_file.exists()
        else None
    )
    total = RESUME_STEPS if paused else REPLAY_STEPS if again else PAUSED_STEPS if pause else STEPS
    demo = Run(echo, total, pause=pause and (paused is not None or not again))
    if paused is not None:
        demo.facts["paused"] = paused
        demo.reconciliations = [(str(label), rec) for label, rec in paused["reconciliations"]]
        if paused.get("injection_task"):
            demo.facts["injection_task"] = paused["injection_task"]
    demo.progress("starting the mock providers (Gmail API, OAuth, admin API) in this process")
    try:
        demo.admin = mock.start()
    except OSError as exc:
        raise DemoError(f"the mock providers could not serve on 127.0.0.1: {exc}") from exc
    try:
        boxes = _with_mock(demo, settings, again=again)
    finally:
        mock.stop()
    expect(mock.gone(), "the mock providers to be stopped, their thread and port gone")
    evidence = root / "demo" / "mailboxes.json"
    evidence.write_text(json.dumps(boxes, ensure_ascii=False, indent=2), encoding="utf-8")
    if "paused" in demo.facts and (paused is None or demo.facts.get("still_paused")):
        paused_file.write_text(json.dumps(demo.facts["paused"]), encoding="utf-8")
        for line in pause_instructions(root, demo.facts["paused"]):
            echo(line)
        return
    paused_file.unlink(missing_ok=True)
    found = verify_mailboxes(boxes)
    seconds = time.monotonic() - started
    # A replay's report is its own: the full run's report stays as it was.
    name = "replay-report.html" if again and paused is None else "report.html"
    report = write_report(root / "demo" / name, report_facts(demo, found, root, seconds))
    echo("\n== summary ==")
    for line in summary(demo, found, evidence, report, seconds):
        echo(line)


PAUSED_FILE = "paused.json"
"""Where a run stopped at the approval gate keeps the task it stopped at."""


def pause_instructions(root: Path, paused: dict[str, str]) -> list[str]:
    """How to approve, then go on."""
    data = f"--data-dir {root}"
    found = Path(sys.executable).parent / "outloop"
    outloop = str(found) if found.exists() else "outloop"
    return [
        "",
        "== paused at the approval gate ==",
        f"task {paused['task_id']} waits for {mail.APPROVER} to approve draft "
        f"{paused['draft_id']} (request {paused['request_message_id']}); nothing was sent to "
        "the client.",
        "Approve it in the console, as the approver:",
        f"  export OUTLOOP_VAULT_BACKEND=plain OUTLOOP_VAULT_DIR={root / 'demo' / 'vault'}",
        f"  {outloop} console password {mail.APPROVER} {data}",
        f"  {outloop} console {data}",
        "  then open http://127.0.0.1:8770/ (the URL it prints), sign in as the approver, open "
        "the task and choose Approve;",
        f"or let the demo play her emailed reply. Either way, then run: {outloop} demo {data}",
    ]


def _with_mock(demo: Run, settings: Settings, *, again: bool) -> dict[str, Any]:
    """Steps 1 (its accounts) to the last, with the mock providers running; what the mock's
    mailboxes held at the end."""
    demo.say(f"listening on {demo.admin.base_url} (stopped when the demo ends)")
    if again:
        demo.say("restored the mock tenant the previous run kept")
        with contextlib.suppress(click.ClickException):  # a tenant from before the 2nd mailbox
            _admin(lambda: demo.admin.account(mail.OUTLOOK_MAILBOX, "microsoft"))
        store_worker(settings)
        demo.progress("pointing the registered demo workspace at this mock (workspace update)")
        bind_workspace(settings, demo.admin.base_url, update=True)
    else:
        account = create_accounts(demo.admin)
        demo.say(
            f"accounts: {mail.MAILBOX} (Google) and {mail.OUTLOOK_MAILBOX} (Microsoft), the "
            f"workspace's; {', '.join(mail.PEOPLE)}"
        )
        demo.progress("setting up the demo station: a plain demo vault and one workspace")
        bind_workspace(settings, demo.admin.base_url, update=False)
        store_oauth(settings, account)
        store_worker(settings)
        demo.say(
            f"vault ({settings.vault_directory}): {mail.MAILBOX}: "
            f"{', '.join(VAULT_NAMES.values())}; {mail.OUTLOOK_MAILBOX}: password, totp"
        )
        demo.say(
            f"registered {mail.WORKSPACE_ID} (the registry was empty): {mail.MAILBOX}, "
            f"provider google, channels [api]; {mail.OUTLOOK_MAILBOX}, provider microsoft, "
            "channels [browser] (Graph not permitted); on this mock"
        )
    drive: Callable[[Run, Settings], Awaitable[None]] = (
        resume if "paused" in demo.facts else replay if again else lifecycle
    )
    try:
        anyio.run(drive, demo, settings)
    except BaseExceptionGroup as group:  # the MCP client's task group wraps what failed
        raise _reason(group) from None
    return mock_mailboxes(demo.admin)


def _reason(error: BaseException) -> BaseException:
    """The one error inside a task group's exception group, as it was raised."""
    members = cast("tuple[BaseException, ...]", getattr(error, "exceptions", ()))
    return _reason(members[0]) if len(members) == 1 else error

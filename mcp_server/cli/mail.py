"""``outloop mail``: internal mail from the command line, for operators (and scripts).

Each verb builds the same call the MCP tool takes and prints its answer; ``outloop mail
call`` takes the raw call as JSON. ``--as`` (env OUTLOOP_MAIL_AS, default ``operator``)
names the mailbox acting. Unread mail and bounce events are printed after the answer.
"""

from __future__ import annotations

import dataclasses
import json
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from agent.domain.internal_mail import Kind, MailError
from agent.services.internal_mail import InternalMail, MailResult, deliver_due
from agent.services.internal_mail.folders import Folders
from agent.services.internal_mail.footprint import clean, footprint
from mcp_server.cli.shared import data_dir_option, read_settings
from mcp_server.composition import MAIL_AS_ENV, internal_mail

DEFAULT_REASONING = "operator command line"
EXIT_REFUSED = 2

F = Callable[..., Any]


def _common(func: F) -> F:
    func = click.option(
        "--as",
        "acting_as",
        default=None,
        help=f"The mailbox acting (env {MAIL_AS_ENV}; default: operator).",
    )(func)
    func = click.option(
        "--reasoning", default=DEFAULT_REASONING, show_default=True, help="Why this call."
    )(func)
    func = click.option("--json", "as_json", is_flag=True, help="Print the raw result.")(func)
    return data_dir_option(func)


def _tool(data_dir: Path | None, acting_as: str | None, kind: Kind = "operator") -> InternalMail:
    settings = read_settings(data_dir)
    if acting_as:
        settings = dataclasses.replace(settings, mail_as=acting_as)
    return internal_mail(settings, "operator", kind=kind)


def _run(
    mail: InternalMail,
    action: str,
    fields: dict[str, Any],
    reasoning: str,
    as_json: bool,
    summarize: bool = False,
) -> None:
    raw: dict[str, Any] = {"action": action, "input": fields, "reasoning": reasoning}
    if summarize:
        raw["summarize"] = True
    try:
        answer = mail.call(raw)
    except MailError as exc:
        if as_json:
            click.echo(json.dumps({"status": "error", "code": exc.code, "message": str(exc)}))
        else:
            click.echo(f"{exc.code}: {exc}", err=True)
        sys.exit(EXIT_REFUSED)
    _show(answer, as_json)


def _show(answer: MailResult, as_json: bool) -> None:
    if as_json:
        out: dict[str, Any] = dict(answer.payload)
        if answer.meta is not None:
            out["_meta"] = answer.meta
        click.echo(json.dumps(out, ensure_ascii=False, indent=2))
        return
    click.echo(_readable(answer.payload))
    for event in answer.events:
        click.echo(
            f"BOUNCE {event.get('email_id')} to {event.get('address')}: {event.get('reason')}",
            err=True,
        )
    if answer.meta is not None:
        block = answer.meta["agent_meta"]["notifications"]["persistent"]["email"]
        if block["total"]:
            click.echo(f"({block['total']} unread: 'outloop mail check' lists them)", err=True)


def _readable(payload: dict[str, Any]) -> str:
    if "manual" in payload:
        return f"{payload['manual']}\n(installed at {payload['path']})"
    if "emails" in payload:
        return "\n".join(_email_lines(e) for e in payload["emails"]) or "(no mail)"
    if "lines" in payload:
        return "\n".join(payload["lines"]) or "(no mail)"
    if "settings" in payload:
        return "\n".join(
            f"{r['key']}: {json.dumps(r['current'])} (default {json.dumps(r['default'])}, "
            f"{'configurable' if r['configurable'] else 'fixed'}) - {r['comment']}"
            for r in payload["settings"]
        )
    if "contacts" in payload:
        rows = payload["contacts"]
        return "\n".join(f"{c['address']}: {c['name']} {c['note']}".rstrip() for c in rows) or (
            "(no contacts)"
        )
    return json.dumps(payload, ensure_ascii=False)


def _email_lines(email: dict[str, Any]) -> str:
    mark = "*" if email.get("unread") else " "
    who = email["sender_nickname"] or email["sender_name"]
    head = f"{mark} {email['email_id']}  {email['sent_at'][:16]}  {who} <{email['from']}>  "
    head += email["subject"] or "(no subject)"
    if "message" in email:
        files = "".join(f"\n  [attachment] {a['name']}: {a['path']}" for a in email["attachments"])
        return f"{head}\n\n{email['message']}{files}\n"
    return head


def _message(text: str | None, file: Path | None) -> str:
    if file is not None:
        return sys.stdin.read() if str(file) == "-" else file.read_text(encoding="utf-8")
    if text is None:
        raise click.UsageError("give the message with --message TEXT or --message-file FILE")
    return text


@click.group("mail")
def mail_group() -> None:
    """Internal mail between this workstation's agents and operators (not internet email).

    Mailboxes are addressed by bare names or paths (no @). Run 'outloop mail manual' for
    the full manual."""


@mail_group.command("send")
@click.argument("address", nargs=-1, required=True)
@click.option("-m", "--message", "text", default=None, help="The message.")
@click.option(
    "--message-file", type=click.Path(path_type=Path), help="Read it from a file ('-': stdin)."
)
@click.option("--subject", default=None)
@click.option("--cc", multiple=True, help="Also to this address (repeatable).")
@click.option("--attach", multiple=True, help="Attach this file (repeatable).")
@click.option(
    "--delay", type=click.IntRange(0), default=None, help="Deliver after this many seconds."
)
@click.option("--mode", type=click.Choice(["peer", "abs"]), default=None, help="Addressing mode.")
@_common
def send_command(
    address: tuple[str, ...],
    text: str | None,
    message_file: Path | None,
    subject: str | None,
    cc: tuple[str, ...],
    attach: tuple[str, ...],
    delay: int | None,
    mode: str | None,
    **common: Any,
) -> None:
    """Send internal mail to one or more ADDRESSes."""
    fields: dict[str, Any] = {
        "address": address[0] if len(address) == 1 else list(address),
        "message": _message(text, message_file),
        "subject": subject,
        "cc": list(cc) or None,
        "attachments": [str(Path(a).resolve()) for a in attach] or None,
        "delay": delay,
        "mode": mode,
    }
    _verb("send", fields, **common)


def _verb(
    action: str,
    fields: dict[str, Any],
    *,
    data_dir: Path | None,
    acting_as: str | None,
    reasoning: str,
    as_json: bool,
    summarize: bool = False,
) -> None:
    present = {k: v for k, v in fields.items() if v is not None}
    _run(_tool(data_dir, acting_as), action, present, reasoning, as_json, summarize)


@mail_group.command("check")
@click.option("--folder", type=click.Choice(["inbox", "archive", "sent"]), default=None)
@click.option("-n", type=click.IntRange(1, 100), default=None, help="At most this many.")
@click.option("--from", "from_", default=None, help="Only from this address.")
@click.option("--to", default=None, help="Only to (or cc) this address.")
@click.option("--subject", default=None, help="Only subjects matching this regular expression.")
@click.option("--unread/--read", "unread", default=None, help="Only unread (or read) mail.")
@click.option("--since", default=None, help="Sent at or after (ISO 8601).")
@click.option("--until", default=None, help="Sent at or before (ISO 8601).")
@click.option("--has-attachment/--no-attachment", default=None)
@click.option("--summarize", is_flag=True, help="Only the gist (no ids, addresses or bodies).")
@_common
def check_command(
    folder: str | None,
    n: int | None,
    from_: str | None,
    to: str | None,
    subject: str | None,
    unread: bool | None,
    since: str | None,
    until: str | None,
    has_attachment: bool | None,
    **common: Any,
) -> None:
    """List mail, newest first (a check marks nothing read)."""
    flt = {
        "from": from_,
        "to": to,
        "subject": subject,
        "unread": unread,
        "since": since,
        "until": until,
        "has_attachment": has_attachment,
    }
    flt = {k: v for k, v in flt.items() if v is not None}
    _verb("check", {"folder": folder, "n": n, "filter": flt or None}, **common)


def _ids_verb(action: str, doc: str) -> None:
    @mail_group.command(action, help=doc)
    @click.argument("email_id", nargs=-1, required=True)
    @_common
    def command(email_id: tuple[str, ...], **common: Any) -> None:
        _verb(action, {"email_id": list(email_id)}, **common)


_ids_verb("read", "Show messages in full (marks inbox ones read).")
_ids_verb("dismiss", "Mark inbox messages read without showing them.")
_ids_verb("archive", "Move inbox messages to the archive.")
_ids_verb("delete", "Delete inbox or archive messages for good (never sent mail).")


def _reply_verb(name: str, action: str, doc: str) -> None:
    @mail_group.command(name, help=doc)
    @click.argument("email_id")
    @click.option("-m", "--message", "text", default=None, help="The reply.")
    @click.option("--message-file", type=click.Path(path_type=Path), help="Read it from a file.")
    @click.option("--attach", multiple=True, help="Attach this file (repeatable).")
    @_common
    def command(
        email_id: str,
        text: str | None,
        message_file: Path | None,
        attach: tuple[str, ...],
        **common: Any,
    ) -> None:
        fields = {
            "email_id": [email_id],
            "message": _message(text, message_file),
            "attachments": [str(Path(a).resolve()) for a in attach] or None,
        }
        _verb(action, fields, **common)


_reply_verb("reply", "reply", "Reply to the sender of EMAIL_ID (marks it read).")
_reply_verb("reply-all", "reply_all", "Reply to the sender and every other recipient.")


@mail_group.command("search")
@click.argument("query")
@click.option("--folder", type=click.Choice(["inbox", "archive", "sent"]), default=None)
@click.option("-n", type=click.IntRange(1, 100), default=None)
@click.option("--summarize", is_flag=True, help="Only the gist (no ids, addresses or bodies).")
@_common
def search_command(query: str, folder: str | None, n: int | None, **common: Any) -> None:
    """Search subjects, bodies and senders with a regular expression."""
    _verb("search", {"query": query, "folder": folder, "n": n}, **common)


@mail_group.command("contacts")
@_common
def contacts_command(**common: Any) -> None:
    """List the private address book."""
    _verb("contacts", {}, **common)


@mail_group.command("add-contact")
@click.argument("address")
@click.argument("name")
@click.option("--note", default=None)
@_common
def add_contact_command(address: str, name: str, note: str | None, **common: Any) -> None:
    """Add (or replace) a contact."""
    _verb("add_contact", {"address": address, "name": name, "note": note}, **common)


@mail_group.command("remove-contact")
@click.argument("address")
@_common
def remove_contact_command(address: str, **common: Any) -> None:
    """Remove a contact."""
    _verb("remove_contact", {"address": address}, **common)


@mail_group.command("edit-contact")
@click.argument("address")
@click.option("--name", default=None)
@click.option("--note", default=None)
@_common
def edit_contact_command(address: str, name: str | None, note: str | None, **common: Any) -> None:
    """Change a contact's name or note."""
    _verb("edit_contact", {"address": address, "name": name, "note": note}, **common)


@mail_group.command("settings")
@_common
def settings_command(**common: Any) -> None:
    """Show the applied settings (read-only)."""
    _verb("settings", {}, **common)


@mail_group.command("manual")
@_common
def manual_command(**common: Any) -> None:
    """Show the installed manual and where it is."""
    _verb("manual", {}, **common)


@mail_group.command("call")
@click.argument("call_json")
@_common
def call_command(call_json: str, **common: Any) -> None:
    """Make one raw call: CALL_JSON is {"action", "input", "reasoning"[, "summarize"]}
    ('-': read it from stdin). --reasoning is not used: the call carries its own."""
    text = sys.stdin.read() if call_json == "-" else call_json
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise click.UsageError(f"CALL_JSON is not JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise click.UsageError("CALL_JSON must be a JSON object")
    mail = _tool(common["data_dir"], common["acting_as"])
    try:
        answer = mail.call(raw)  # pyright: ignore[reportUnknownArgumentType]
    except MailError as exc:
        click.echo(json.dumps({"status": "error", "code": exc.code, "message": str(exc)}))
        sys.exit(EXIT_REFUSED)
    _show(answer, True)


@mail_group.command("register")
@click.argument("address")
@click.option("--kind", type=click.Choice(["agent", "operator", "pseudo"]), required=True)
@click.option("--name", required=True, help="The display name.")
@click.option("--nickname", default="", help="What others call it (used before the name).")
@data_dir_option
def register_command(
    address: str, kind: str, name: str, nickname: str, data_dir: Path | None
) -> None:
    """Create (or re-describe) the mailbox ADDRESS. Its mail is kept."""
    mail = _tool(data_dir, address)
    try:
        mail.network.register(mail.box.address, kind, name, nickname)  # pyright: ignore[reportArgumentType]
    except MailError as exc:
        raise click.ClickException(f"{exc.code}: {exc}") from exc
    click.echo(f"mailbox {mail.box.address} is a {kind} named {name}")


@mail_group.command("presence")
@click.argument("state", type=click.Choice(["on", "off"]))
@click.option("--as", "acting_as", default=None, help=f"The operator (env {MAIL_AS_ENV}).")
@data_dir_option
def presence_command(state: str, acting_as: str | None, data_dir: Path | None) -> None:
    """Mark an operator reachable (on) or not (off) without a running session."""
    mail = _tool(data_dir, acting_as)
    meta = mail.ensure_mailbox()
    if meta.kind != "operator":
        raise click.ClickException(
            f"{mail.box.address} is an {meta.kind}: presence is for "
            "operators; an agent is reachable while its session runs"
        )
    mail.network.set_presence(mail.box, state == "on")
    click.echo(f"{mail.box.address} is {'reachable' if state == 'on' else 'not reachable'}")


@mail_group.command("deliver")
@data_dir_option
def deliver_command(data_dir: Path | None) -> None:
    """Deliver every internal mail that is due now (delayed mail, and deliveries a crashed
    process left unfinished), once."""
    mail = _tool(data_dir, None)
    try:
        count = deliver_due(mail.network)
    except MailError as exc:
        raise click.ClickException(f"{exc.code}: {exc}") from exc
    click.echo(f"delivered {count}")


@mail_group.command("watch")
@click.option(
    "--poll",
    type=click.FloatRange(0.05, 60),
    default=2.0,
    show_default=True,
    help="Seconds between looks.",
)
@click.option("--as", "acting_as", default=None, help=f"The mailbox (env {MAIL_AS_ENV}).")
@data_dir_option
def watch_command(poll: float, acting_as: str | None, data_dir: Path | None) -> None:
    """Hold a session: keep the mailbox's heartbeat fresh (so it receives mail), deliver due
    mail, and print each new unread message's headline, until interrupted."""
    mail = _tool(data_dir, acting_as)
    mail.ensure_mailbox()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda _signum, _frame: stop.set())
    click.echo(f"watching {mail.box.address} (Ctrl-C stops)", err=True)
    shown: set[str] = set()
    try:
        while not stop.is_set():
            mail.network.beat(mail.box, "cli")
            deliver_due(mail.network)
            shown = _print_new(mail, shown)
            stop.wait(poll)
    except KeyboardInterrupt:
        pass
    finally:
        mail.network.end_session(mail.box)


def _print_new(mail: InternalMail, shown: set[str]) -> set[str]:
    folders = Folders(mail.box)
    unread = folders.unread_ids()
    if set(unread) != shown:
        folders.refresh_mirror(mail.network.clock.now().isoformat())
    for email_id in unread:
        if email_id in shown:
            continue
        found = folders.load("inbox", email_id)
        if found is not None:
            who = found.sender_nickname or found.sender_name
            click.echo(f"* {email_id}  {who} <{found.from_}>  {found.subject or '(no subject)'}")
            sys.stdout.flush()  # a watcher reads each arrival as it comes
    return set(unread)


@mail_group.command("footprint")
@click.option("--clean", "clean_up", is_flag=True, help="Remove what no message needs.")
@click.option("--as", "acting_as", default=None, help=f"The mailbox (env {MAIL_AS_ENV}).")
@data_dir_option
def footprint_command(clean_up: bool, acting_as: str | None, data_dir: Path | None) -> None:
    """Show what the mailbox keeps (files and bytes per folder). With --clean, remove only
    what is nobody's only copy: temporary files of crashed writers and attachment copies
    whose message was deleted. Mail itself is removed only by delete, one message at a
    time."""
    mail = _tool(data_dir, acting_as)
    mail.ensure_mailbox()
    report = clean(mail.box) if clean_up else footprint(mail.box)
    click.echo(json.dumps(report, indent=2))

"""``outloop sends list|show|settle``: the send ledger, and a person's word on a send no
channel could settle."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from agent.domain.errors import UnknownSend
from agent.domain.records import SendRecord, SendState
from agent.services import outbound
from agent.services.clock import SystemClock
from mcp_server.cli.shared import data_dir_option, station_for

UNSETTLED = (SendState.ATTEMPTING, SendState.UNCERTAIN, SendState.WITH_PERSON)


@click.group()
def sends() -> None:
    """The send ledger: every outbound message, its channel, marker and state."""


def _view(record: SendRecord) -> dict[str, Any]:
    view = record.model_dump(mode="json", exclude={"created"})
    view["marker"] = record.marker.model_dump(mode="json") if record.marker else None
    view["partial"] = record.partial
    return view


def _line(record: SendRecord) -> str:
    via = f" via {record.channel}" if record.channel else ""
    partial = " (partial delivery)" if record.partial else ""
    return f"{record.key}  {record.state.value}{via}{partial}  to {', '.join(record.recipients)}"


@sends.command("list")
@click.option("--workspace", "workspace_id", required=True, help="The workspace id.")
@click.option("--unsettled", is_flag=True, help="Only sends whose outcome is not known.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@data_dir_option
def sends_list(workspace_id: str, unsettled: bool, as_json: bool, data_dir: Path | None) -> None:
    """The workspace's sends, oldest first."""
    with station_for(data_dir) as station:
        records = station.store.list_sends(workspace_id)
    for record in records:
        if unsettled and record.state not in UNSETTLED:
            continue
        click.echo(json.dumps(_view(record)) if as_json else _line(record))


@sends.command("show")
@click.argument("send_id")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@data_dir_option
def sends_show(send_id: str, as_json: bool, data_dir: Path | None) -> None:
    """One send: its state, channel, marker, recipients and every recorded change."""
    with station_for(data_dir) as station:
        record = station.store.get_send(send_id)
        if record is None:
            raise UnknownSend(send_id)
        events = station.store.send_events(send_id)
    if as_json:
        view = _view(record)
        view["events"] = [e.model_dump(mode="json") for e in events]
        click.echo(json.dumps(view))
        return
    click.echo(_line(record))
    if record.marker is not None:
        click.echo(f"marker: {record.marker.kind.value} {record.marker.value}")
    if record.detail:
        click.echo(f"detail: {record.detail}")
    for event in events:
        click.echo(f"{event.at.isoformat()}  {event.state.value:<12} {event.actor}: {event.detail}")


@sends.command("settle")
@click.argument("send_id")
@click.option(
    "--sent/--not-sent",
    "sent",
    default=None,
    help="What you found: it went out, or it did not (--not-sent allows one more attempt).",
)
@click.option("--evidence", required=True, help="What you checked, and where.")
@click.option("--by", "actor", default="operator", show_default=True, help="Who settles it.")
@data_dir_option
def sends_settle(
    send_id: str, sent: bool | None, evidence: str, actor: str, data_dir: Path | None
) -> None:
    """Settle a send whose outcome no channel could prove (audited with the evidence)."""
    if sent is None:
        raise click.UsageError("say what you found: --sent or --not-sent")
    with station_for(data_dir) as station:
        record = outbound.settle_by_person(
            station.store, send_id, sent, evidence, actor, SystemClock()
        )
    after = "it counts as sent" if sent else "one more attempt may go"
    click.echo(f"send {record.key} settled by {actor}: {record.state.value} ({after})")

"""A sign-in challenge no machine may answer, kept until a person says it is resolved.

Seed 000 s.9: a provider-imposed challenge managed login cannot complete (a push to approve,
"more information required", a locked account, a bot check) is AUTH_CHALLENGE_UNRESOLVED and
stops before client data. It is kept in the station's health records, so every process of
the station honours it: managed login of that mailbox's channel stops with it again at once,
without going back to the provider's sign-in (an access route moves on to its next permitted
channel), until an operator of the workspace acknowledges that they resolved it (the
console), or a person signs the mailbox in with ``outloop login``.
Each acknowledgement names who, when, from where and what they did.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from pydantic import BaseModel, ConfigDict, ValidationError

from agent.domain.errors import AuthChallengeUnresolved, InvalidRequest
from agent.ports import Clock, Health, Registry
from agent.services.console import require_operator
from agent.services.workspaces import load_context

PREFIX = "access challenge "


class Challenge(BaseModel):
    """One challenge a mailbox's channel met, and whether a person resolved it since."""

    model_config = ConfigDict(frozen=True)

    workspace_id: str
    mailbox_id: str
    channel: str
    challenge: str
    """The page that stopped managed login (``push_approval``, ``locked``, ...)."""
    reason: str
    action: str
    """What the operator must do."""
    met_at: datetime
    acknowledged_by: str | None = None
    acknowledged_at: datetime | None = None
    evidence: str | None = None
    """What the person did to resolve it, in their words."""

    @property
    def open(self) -> bool:
        return self.acknowledged_by is None

    def gap(self) -> str:
        """Why managed login waits while it is open."""
        return (
            f"the sign-in met a challenge on {self.met_at:%Y-%m-%d %H:%M} UTC "
            f"({self.challenge}) that a person must resolve; managed login does not sign in "
            "again until an operator acknowledges it resolved (the console) or "
            "`outloop login` signs the mailbox in"
        )


def key(workspace_id: str, mailbox_id: str, channel: str) -> str:
    return f"{PREFIX}{workspace_id} {mailbox_id} {channel}"


def keep(
    store: Health,
    workspace_id: str,
    mailbox_id: str,
    channel: str,
    exc: AuthChallengeUnresolved,
    now: datetime,
) -> Challenge:
    """Record the challenge the channel met (a newer one replaces the last)."""
    found = Challenge(
        workspace_id=workspace_id, mailbox_id=mailbox_id, channel=channel,
        challenge=exc.challenge, reason=str(exc), action=exc.action, met_at=now,
    )  # fmt: skip
    store.record_health(key(workspace_id, mailbox_id, channel), found.model_dump_json(), now)
    return found


def listed(store: Health, workspace_id: str | None = None) -> list[Challenge]:
    """Every kept challenge (of one workspace), open ones first, newest first."""
    found: list[Challenge] = []
    for record in store.list_health():
        if not record.key.startswith(PREFIX):
            continue
        try:
            challenge = Challenge.model_validate_json(record.detail)
        except ValidationError:
            continue  # a record this version cannot read is shown by the health list
        if workspace_id is None or challenge.workspace_id == workspace_id:
            found.append(challenge)
    return sorted(found, key=lambda c: (not c.open, -c.met_at.timestamp()))


def unresolved(store: Health, workspace_id: str, mailbox_id: str, channel: str) -> Challenge | None:
    """The channel's open challenge, if it has one."""
    return next(
        (
            c
            for c in listed(store, workspace_id)
            if c.open and (c.mailbox_id, c.channel) == (mailbox_id, channel)
        ),
        None,
    )


@dataclass(frozen=True)
class Keeper:
    """One mailbox channel's challenges, as its managed login keeps and honours them."""

    health: Health
    workspace_id: str
    mailbox_id: str
    channel: str
    clock: Clock

    def kept(self) -> AuthChallengeUnresolved | None:
        """The channel's open challenge, as the error managed login stops with."""
        found = unresolved(self.health, self.workspace_id, self.mailbox_id, self.channel)
        if found is None:
            return None
        return AuthChallengeUnresolved(
            f"mailbox {self.mailbox_id}: {found.gap()}", found.action, challenge=found.challenge
        )

    def keep(self, exc: AuthChallengeUnresolved) -> None:
        keep(self.health, self.workspace_id, self.mailbox_id, self.channel, exc, self.clock.now())


class ChallengeStore(Registry, Health, Protocol):
    """What acknowledging a challenge needs: the live context and the health records."""


def acknowledge(
    store: ChallengeStore,
    workspace_id: str,
    mailbox_id: str,
    channel: str,
    *,
    by: str,
    evidence: str,
    where: str,
    now: datetime,
    seen: datetime | None = None,
) -> Challenge:
    """An operator of the workspace says they resolved the open challenge, and how; the
    channel is tried again. Refused, changing nothing, without an open challenge, without
    evidence, from someone without the operator role, or when the open challenge is not the
    one met at ``seen`` (what the person was shown)."""
    evidence = evidence.strip()
    if not evidence:
        raise InvalidRequest(
            "say what you did to resolve the challenge (it is recorded with your name)"
        )
    require_operator(load_context(store, workspace_id), by, "acknowledge a sign-in challenge")
    open_now = unresolved(store, workspace_id, mailbox_id, channel)
    if seen is not None and open_now is not None and open_now.met_at != seen:
        raise InvalidRequest(
            f"mailbox {mailbox_id} met a newer sign-in challenge ({open_now.challenge}, "
            f"{open_now.met_at:%Y-%m-%d %H:%M} UTC) since the page was shown: reload and "
            "resolve that one"
        )
    said = f"{evidence} (from {where})"
    return _resolved(store, workspace_id, mailbox_id, channel, by, said, now)


def signed_in(
    store: Health, workspace_id: str, mailbox_id: str, channel: str, now: datetime
) -> Challenge | None:
    """A person signed the mailbox in (``outloop login``): its open challenge is resolved."""
    if unresolved(store, workspace_id, mailbox_id, channel) is None:
        return None
    return _resolved(
        store, workspace_id, mailbox_id, channel, "outloop login", "signed in by a person", now
    )


def _resolved(
    store: Health,
    workspace_id: str,
    mailbox_id: str,
    channel: str,
    by: str,
    evidence: str,
    now: datetime,
) -> Challenge:
    challenge = unresolved(store, workspace_id, mailbox_id, channel)
    if challenge is None:
        raise InvalidRequest(
            f"mailbox {mailbox_id} has no unresolved sign-in challenge on channel {channel}"
        )
    done = challenge.model_copy(
        update={"acknowledged_by": by, "acknowledged_at": now, "evidence": evidence}
    )
    store.record_health(key(workspace_id, mailbox_id, channel), done.model_dump_json(), now)
    return done

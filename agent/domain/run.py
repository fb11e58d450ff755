"""The run ledger: every scanned item gets exactly one disposition per run."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from pydantic import BaseModel, ConfigDict

from agent.domain.dispositions import Disposition
from agent.domain.mail import ScannedMessage


class LedgerEntry(BaseModel):
    """One scanned item of one run, with what any worker needs to claim it: the item as it
    was read (its envelope, with the references its body and attachments are fetched by),
    the workspace or station scope that owns it, and the mailbox it came from."""

    model_config = ConfigDict(frozen=True)

    run_id: str
    item_ref: str
    occurrence_key: str | None = None
    disposition: Disposition | None = None
    detail: str = ""
    scanned: ScannedMessage | None = None
    owner: str = ""
    mailbox_id: str = ""
    reason: str = ""
    """Why the item is escalated ("" when its workspace resolved): how it was planned, kept
    apart from ``detail``, which its disposition rewrites."""


class MailboxCursor(BaseModel):
    """Where one scope's reading of one mailbox through one channel got to. It advances in
    the same transaction that records the items it covered."""

    model_config = ConfigDict(frozen=True)

    scope: str
    provider: str
    mailbox_id: str
    channel: str
    cursor: str


class OpenRun(BaseModel):
    """A run not yet reconciled: who holds it, and until when its lease runs."""

    model_config = ConfigDict(frozen=True)

    run_id: str
    holder: str
    lease_expires_at: datetime | None = None
    scope: str = ""
    """The workspace id (or the station scope) the run reads for."""

    def stale(self, now: datetime, holder_alive: Callable[[str], bool]) -> bool:
        """A run is left to reconcile when its holder is provably dead (same host), or
        when its lease ran out (any host: a worker renews its run's lease while it works)."""
        expired = self.lease_expires_at is not None and self.lease_expires_at <= now
        return expired or not holder_alive(self.holder)


class Reconciliation(BaseModel):
    """scanned = terminal + non_terminal + claim_race; anything unmatched failed."""

    model_config = ConfigDict(frozen=True)

    run_id: str
    scanned: int
    terminal: int
    non_terminal: int
    claim_race: int
    reconciliation_failed: int
    by_disposition: dict[str, int]
    clean: bool
    reconciled_at: datetime


class RunRow(BaseModel):
    """One run of a scope as an operator lists it: when it started and, once reconciled,
    its reconciliation."""

    model_config = ConfigDict(frozen=True)

    run_id: str
    scope: str
    holder: str
    started_at: datetime
    summary: Reconciliation | None = None


class ThreadLink(BaseModel):
    """What resolving one message's thread alias needs: its id and identity (the header
    digest), the ids it answers (In-Reply-To, then References) and the aliases to give it."""

    model_config = ConfigDict(frozen=True)

    message_id: str
    identity: str
    related: tuple[str, ...] = ()
    proposed: str
    """The alias of a new thread it starts (named from the first message its References
    name, else the one it answers, else itself)."""
    if_reused: str
    """The alias of a thread of its own, when another message carries its Message-ID or the
    ids it answers are reused ones (nobody's parent)."""

"""Recipient classification and recipient building (seed 000 sections 2 and 7).

This module owns recipient classification. A class comes only from the live Workspace
Context (a contact's recorded ``side``, or a role the context records for the address) or,
where ``classification.task_owner_evidence`` permits it, from verified task/owner evidence.
Domain resemblance, a display name and a guessed role never classify: an address the context
does not know is UNKNOWN, even at the team's own domain. Conflicting evidence leaves the
recipient unresolved, which keeps any send to it pending.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from enum import StrEnum

from pydantic import BaseModel, ConfigDict

from agent.domain.context import Side, WorkspaceContext
from agent.domain.untrusted import lookalike_of


class RecipientClass(StrEnum):
    INTERNAL = "internal"
    CLIENT = "client"
    UNKNOWN = "unknown"


class Communication(StrEnum):
    """What a send is: internal communication, or client-facing (approval-gated)."""

    INTERNAL = "internal"
    CLIENT_FACING = "client_facing"


_ADDRESS = re.compile(r"^[^\s@<>,;:\"()\[\]\\]+@[^\W_](?:[\w.-]*[^\W_])?$")


class OwnerEvidence(BaseModel):
    """Verified task/owner evidence naming an address (e.g. the task's recorded owner)."""

    model_config = ConfigDict(frozen=True)

    address: str
    evidence: str


class Classified(BaseModel):
    """One recipient with its class and the evidence that established it."""

    model_config = ConfigDict(frozen=True)

    address: str
    recipient_class: RecipientClass
    evidence: tuple[str, ...]
    conflict: str | None = None
    flags: tuple[str, ...] = ()

    @property
    def resolved(self) -> bool:
        return self.recipient_class is not RecipientClass.UNKNOWN and self.conflict is None

    @property
    def internal(self) -> bool:
        return self.recipient_class is RecipientClass.INTERNAL and self.conflict is None


def _domain(address: str) -> str:
    return address.rsplit("@", 1)[-1] if "@" in address else ""


def known_domains(context: WorkspaceContext) -> set[str]:
    return {_domain(c.address) for c in context.contacts} | {
        _domain(b.mailbox_id) for b in context.mailboxes
    }


def _context_roles(context: WorkspaceContext, address: str) -> list[str]:
    """Facts the context records that make an address internal, apart from ``side``."""
    facts: list[str] = []
    if address in context.default_cc:
        facts.append("listed in default_cc (internal addresses only)")
    if context.escalation_contact == address:
        facts.append("the context's escalation_contact")
    for contact in context.contacts:
        if contact.address != address:
            continue
        approving = set(contact.roles) & set(context.approval.roles)
        if approving:
            facts.append(f"holds the approval role {', '.join(sorted(approving))}")
        if "client_manager" in contact.roles:
            facts.append("holds the client_manager role")
    return facts


def classify_recipient(
    context: WorkspaceContext, address: str, owner_evidence: Sequence[OwnerEvidence] = ()
) -> Classified:
    """The class of one address, from the live context and permitted evidence only."""
    wanted = address.strip().lower()
    if not _ADDRESS.match(wanted):
        return Classified(
            address=wanted,
            recipient_class=RecipientClass.UNKNOWN,
            evidence=("not a single valid mail address",),
            flags=("malformed address",),
        )
    flags: list[str] = []
    imitated = lookalike_of(_domain(wanted), known_domains(context))
    if imitated is not None:
        flags.append(f"domain looks like {imitated} but is not it")
    by_context = _classified_by_context(context, wanted, tuple(flags))
    if by_context is not None:
        return by_context
    return _classified_by_owner_evidence(context, wanted, owner_evidence, tuple(flags))


def _classified_by_context(
    context: WorkspaceContext, wanted: str, flags: tuple[str, ...]
) -> Classified | None:
    """The class the live context records: a contact's side, or a role only internal
    addresses hold; conflicting records leave it unresolved. None when the context is
    silent."""
    sides, contact_evidence = _recorded_sides(context, wanted)
    roles = _context_roles(context, wanted)
    if len(sides) > 1:
        return Classified(
            address=wanted,
            recipient_class=RecipientClass.UNKNOWN,
            evidence=tuple(contact_evidence),
            conflict="the context lists this address as both internal and client",
            flags=flags,
        )
    if sides == {Side.CLIENT}:
        if roles:
            return Classified(
                address=wanted,
                recipient_class=RecipientClass.CLIENT,
                evidence=(*contact_evidence, *roles),
                conflict="a client contact is also recorded in an internal role: "
                + "; ".join(roles),
                flags=flags,
            )
        return Classified(
            address=wanted,
            recipient_class=RecipientClass.CLIENT,
            evidence=tuple(contact_evidence),
            flags=flags,
        )
    if sides == {Side.INTERNAL}:
        return Classified(
            address=wanted,
            recipient_class=RecipientClass.INTERNAL,
            evidence=(*contact_evidence, *roles),
            flags=flags,
        )
    if roles:
        # No side recorded, but the live context itself establishes the address as internal.
        return Classified(
            address=wanted,
            recipient_class=RecipientClass.INTERNAL,
            evidence=tuple(roles),
            flags=flags,
        )
    return None


def _recorded_sides(context: WorkspaceContext, wanted: str) -> tuple[set[Side], list[str]]:
    """The sides the context's contacts record for the address, with their evidence."""
    sides = {c.side for c in context.contacts if c.address == wanted and c.side is not None}
    contact_evidence = [
        f"context contact side={c.side.value}"
        + (f" verified_by={c.verified_by}" if c.verified_by else "")
        for c in context.contacts
        if c.address == wanted and c.side is not None
    ]
    return sides, contact_evidence


def _classified_by_owner_evidence(
    context: WorkspaceContext,
    wanted: str,
    owner_evidence: Sequence[OwnerEvidence],
    flags: tuple[str, ...],
) -> Classified:
    """An address the context does not classify is internal on verified task/owner evidence
    where the context permits that; else it is UNKNOWN."""
    owned = [e.evidence for e in owner_evidence if e.address.strip().lower() == wanted]
    if owned and context.classification.task_owner_evidence:
        return Classified(
            address=wanted,
            recipient_class=RecipientClass.INTERNAL,
            evidence=tuple(f"verified task/owner evidence: {e}" for e in owned),
            flags=flags,
        )
    why = "not classified by the workspace context"
    if owned:
        why += (
            "; task/owner evidence exists but classification.task_owner_evidence does not "
            "permit it to classify"
        )
    return Classified(
        address=wanted,
        recipient_class=RecipientClass.UNKNOWN,
        evidence=(why,),
        flags=flags,
    )


class Removed(BaseModel):
    model_config = ConfigDict(frozen=True)

    address: str
    reason: str


class RecipientPlan(BaseModel):
    """To and Cc built explicitly, with what was removed or added and why."""

    model_config = ConfigDict(frozen=True)

    to: tuple[Classified, ...]
    cc: tuple[Classified, ...]
    removed: tuple[Removed, ...] = ()
    added_default_cc: tuple[str, ...] = ()

    @property
    def everyone(self) -> tuple[Classified, ...]:
        return (*self.to, *self.cc)

    @property
    def communication(self) -> Communication:
        if self.everyone and all(r.internal for r in self.everyone):
            return Communication.INTERNAL
        return Communication.CLIENT_FACING

    def addresses(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        return tuple(r.address for r in self.to), tuple(r.address for r in self.cc)


def own_addresses(context: WorkspaceContext) -> set[str]:
    return {b.mailbox_id for b in context.mailboxes}


def build_recipients(
    context: WorkspaceContext,
    *,
    to: Iterable[str],
    cc: Iterable[str] = (),
    internal_only: bool,
    owner_evidence: Sequence[OwnerEvidence] = (),
) -> RecipientPlan:
    """Build To and Cc from exactly the addresses given (never reply-all, never a provider's
    pre-populated list). Internal-only communication drops every recipient that is not
    verified internal. Only the context's internal default CCs are added."""
    removed: list[Removed] = []
    seen: set[str] = set()
    mine = own_addresses(context)
    to_kept = _kept(context, to, seen, mine, removed, internal_only, owner_evidence)
    cc_kept = _kept(context, cc, seen, mine, removed, internal_only, owner_evidence)
    added = _add_default_cc(context, seen, mine, removed, owner_evidence, cc_kept)
    return RecipientPlan(
        to=tuple(to_kept), cc=tuple(cc_kept), removed=tuple(removed), added_default_cc=tuple(added)
    )


def _kept(
    context: WorkspaceContext,
    addresses: Iterable[str],
    seen: set[str],
    mine: set[str],
    removed: list[Removed],
    internal_only: bool,
    owner_evidence: Sequence[OwnerEvidence],
) -> list[Classified]:
    """The given addresses, each once, classified: the workspace's own mailbox is removed,
    and so is anyone not verified internal from internal-only communication."""
    kept: list[Classified] = []
    for raw in addresses:
        wanted = raw.strip().lower()
        if wanted in seen:
            continue
        seen.add(wanted)
        if wanted in mine:
            removed.append(Removed(address=wanted, reason="the workspace's own mailbox"))
            continue
        classified = classify_recipient(context, wanted, owner_evidence)
        if internal_only and not classified.internal:
            removed.append(
                Removed(
                    address=wanted,
                    reason="internal-only communication: recipient is "
                    + (
                        f"unresolved ({classified.conflict})"
                        if classified.conflict
                        else classified.recipient_class.value
                    ),
                )
            )
            continue
        kept.append(classified)
    return kept


def _add_default_cc(
    context: WorkspaceContext,
    seen: set[str],
    mine: set[str],
    removed: list[Removed],
    owner_evidence: Sequence[OwnerEvidence],
    cc_kept: list[Classified],
) -> list[str]:
    """Add the context's default CCs not already there, only those verified internal; the
    addresses added."""
    added: list[str] = []
    for address in context.default_cc:
        if address in seen or address in mine:
            continue
        seen.add(address)
        classified = classify_recipient(context, address, owner_evidence)
        if not classified.internal:
            removed.append(
                Removed(
                    address=address,
                    reason="default_cc is not verified internal: "
                    + (classified.conflict or classified.recipient_class.value),
                )
            )
            continue
        cc_kept.append(classified)
        added.append(address)
    return added

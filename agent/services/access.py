"""The access resolver: one mailbox through its permitted channels, in the canonical order.

Seed 000 s.9. A mailbox's context lists the channels it may be reached by; they are tried
in the canonical order (API, then a provider's MCP server, then the browser) for each
operation:

- An access gap moves on to the next permitted channel and records why: no connector (the
  channel cannot be built: no adapter in this version, a secret missing from the vault, no
  server named), an operation the channel cannot do (``Unsupported``), a failure that may
  pass (``TransientFailure``, ``Throttled``), or a sign-in that no longer works
  (``AuthenticationExpired``) or that managed login could not complete (``SignInFailed``,
  ``AuthChallengeUnresolved``: recorded with what the operator does). A channel that failed
  is passed over for ``HOLD`` and then tried first again.
- An explicit refusal (``AccessRefused``: a 403 permission answer, an administrator's
  policy) is recorded and never routed around: the route never goes past the channel that
  refused. Sends stop; reads and evidence collection go on, through that channel and the
  ones before it, only when the mailbox's context separately authorizes them
  (``reads_after_refusal``).
- A send is never moved: it is handed to the channel that prepared it. A lost answer
  (``OutcomeUnknown``) goes back to the core, which settles it from the sent copies - read
  through whichever channel can search them now - before any channel may send it again.

Cursors belong to a channel: the route tags each with its channel, and a cursor of another
channel starts the one now in use from the beginning (occurrence keys record nothing twice).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import TypeVar

from agent.domain.errors import (
    AccessRefused,
    AuthenticationExpired,
    NotFound,
    NotHandedOver,
    OutcomeUnknown,
    ProviderError,
    SignInFailed,
    Throttled,
    TransientFailure,
    Unsupported,
)
from agent.domain.mail import (
    CANONICAL_ORDER,
    AttachmentData,
    Capabilities,
    ChangePage,
    Channel,
    Handover,
    Marker,
    MessageBody,
    OutgoingMessage,
    ProviderHealth,
    SendResult,
    StoredCopy,
)
from agent.events import Event, emit
from agent.ports import Clock, MailProvider

T = TypeVar("T")

HOLD = timedelta(minutes=5)
"""How long a channel that failed is passed over before it is tried first again."""
REFUSAL_HOLD = timedelta(hours=24)
"""How long a refusal stops the mailbox's sends (and, unless authorized, its reads) before
the refusing channel is asked again; a changed binding is asked at once."""


class Action(StrEnum):
    READ = "read"
    """Reading and evidence collection: changes, bodies, files, sent copies, health."""
    SEND = "send"


class ChannelState(StrEnum):
    USABLE = "usable"
    GAP = "gap"
    """Not usable now: an access gap (the reason says which); the next channel is tried."""
    REFUSED = "refused"
    """The provider or a policy refused: never routed around."""
    NOT_PERMITTED = "not_permitted"
    NOT_AVAILABLE = "not_available"
    """No adapter of this version reaches the mailbox this way."""
    NOT_TRIED = "not_tried"


@dataclass(frozen=True)
class Candidate:
    """A permitted channel and how its adapter is built (raising ``ProviderError`` when it
    cannot be: the connector is missing)."""

    channel: Channel
    build: Callable[[], MailProvider]


@dataclass(frozen=True)
class ChannelStatus:
    channel: Channel
    state: ChannelState
    reason: str
    account: str | None = None
    """The address the channel signed in as, where its health shows one."""


@dataclass(frozen=True)
class Refusal:
    channel: Channel
    action: Action
    reason: str
    at: datetime


def is_gap(exc: ProviderError) -> bool:
    """An access gap (the next channel may do it), not a refusal or an answer."""
    if isinstance(exc, AccessRefused | OutcomeUnknown):
        return False
    return isinstance(
        exc, Unsupported | TransientFailure | Throttled | AuthenticationExpired | SignInFailed
    )


class AccessRoute:
    """The MailProvider port on one mailbox through its permitted channels (see the module).
    ``record(channel, detail)`` keeps each step's reason where operators see it (the health
    records, one per channel)."""

    def __init__(
        self,
        provider: str,
        mailbox_id: str,
        candidates: Sequence[Candidate],
        *,
        clock: Clock,
        reads_after_refusal: bool = False,
        record: Callable[[Channel, str], None] | None = None,
        refusals: dict[str, Refusal] | None = None,
        key: str = "",
        keep_refusal: Callable[[Refusal], None] | None = None,
        workspace_id: str = "",
    ) -> None:
        if not candidates:
            raise ValueError("a route needs at least one permitted channel")
        self._provider = provider
        self._mailbox_id = mailbox_id
        self._candidates = tuple(candidates)
        self._clock = clock
        self._reads_after_refusal = reads_after_refusal
        self._record = record
        self._built: dict[Channel, MailProvider] = {}
        self._held: dict[Channel, tuple[datetime, str]] = {}
        self._refusals: dict[str, Refusal] = {} if refusals is None else refusals
        self._key = key or mailbox_id
        self._keep_refusal = keep_refusal
        self._workspace_id = workspace_id or None
        self._prepared: Channel | None = None
        self._current = candidates[0].channel

    def __repr__(self) -> str:
        channels = ", ".join(c.channel for c in self._candidates)
        return f"AccessRoute(mailbox={self._mailbox_id!r}, channels=[{channels}])"

    @property
    def provider(self) -> str:
        return self._provider

    @property
    def mailbox_id(self) -> str:
        return self._mailbox_id

    @property
    def capabilities(self) -> Capabilities:
        """The capabilities of the channel that prepared the send under way, else of the
        channel in use (the first that can be built, whether or not anything may be done
        through it now) - with the longest sent-copy latency of the channels opened, since a
        copy may be searched through any of them."""
        adapter = self._built.get(self._prepared) if self._prepared is not None else None
        if adapter is None:
            adapter = next(
                (a for c in self._ordered(self._candidates) if (a := self._adapter(c))), None
            )
        if adapter is None:
            raise self._exhausted(Action.READ)
        longest = max(a.capabilities.sent_copy_latency for a in self._built.values())
        return adapter.capabilities.model_copy(update={"sent_copy_latency": longest})

    @property
    def refusal(self) -> Refusal | None:
        """The refusal this route (or another of the same mailbox and binding, sharing
        ``refusals``) met, for ``REFUSAL_HOLD``."""
        refusal = self._refusals.get(self._key)
        if refusal is None or self._clock.now() >= refusal.at + REFUSAL_HOLD:
            return None
        return refusal

    # -- choosing ------------------------------------------------------------------------

    def _open(self, action: Action) -> list[Candidate]:
        """The channels ``action`` may be tried through now, in order."""
        allowed = list(self._candidates)
        refusal = self.refusal
        if refusal is not None:
            if action is Action.SEND or not self._reads_after_refusal:
                raise AccessRefused(self._refused_text(refusal, action))
            # Never past the channel that refused (a route of later channels alone - an
            # operator's ``--access browser`` - reads through none of them).
            allowed = [c for c in allowed if not _after(c.channel, refusal.channel)]
            if not allowed:
                raise AccessRefused(
                    self._refused_text(
                        refusal, action, f"reads go no further than {refusal.channel}"
                    )
                )
        return self._ordered(allowed)

    def _ordered(self, allowed: Sequence[Candidate]) -> list[Candidate]:
        """``allowed`` in order, a channel on hold only after every other one."""
        now = self._clock.now()
        ready = [c for c in allowed if not self._on_hold(c.channel, now)]
        held = [c for c in allowed if self._on_hold(c.channel, now)]
        return ready + held

    def _on_hold(self, channel: Channel, now: datetime) -> bool:
        held = self._held.get(channel)
        return held is not None and now < held[0] + HOLD

    def _adapter(self, candidate: Candidate) -> MailProvider | None:
        adapter = self._built.get(candidate.channel)
        if adapter is not None:
            return adapter
        try:
            adapter = candidate.build()
        except ProviderError as exc:
            self._gap(candidate.channel, f"no connector: {exc}", "no_connector")
            return None
        self._built[candidate.channel] = adapter
        return adapter

    def _gap(self, channel: Channel, reason: str, code: str) -> None:
        self._held[channel] = (self._clock.now(), reason)
        self._step(channel, "passed_over", code, logging.WARNING)
        if self._record is not None:
            self._record(channel, f"channel {channel} passed over: {reason}")

    def _use(self, channel: Channel) -> None:
        if channel != self._current:
            self._step(channel, "fallback", f"from_{self._current}", logging.WARNING)
        if channel != self._current and self._record is not None:
            self._record(channel, f"channel {channel} in use (was {self._current})")
        self._current = channel
        self._held.pop(channel, None)

    def _refuse(self, channel: Channel, action: Action, exc: AccessRefused | str) -> None:
        refusal = Refusal(channel, action, str(exc), self._clock.now())
        self._refusals[self._key] = refusal
        self._step(channel, "refused", f"refused_to_{action}", logging.WARNING)
        if self._keep_refusal is not None:
            self._keep_refusal(refusal)
        if self._record is not None:
            self._record(
                channel, f"channel {channel} refused to {action}: {exc} (not routed around)"
            )

    def _step(self, channel: Channel, outcome: str, reason: str, level: int) -> None:
        """An access step as a decision record (the mailbox, the channel, what and why)."""
        emit(
            Event.ACCESS,
            level=level,
            workspace_id=self._workspace_id,
            mailbox_id=self._mailbox_id,
            provider=self._provider,
            channel=channel.value,
            outcome=outcome,
            reason=reason,
        )

    def _refused_text(self, refusal: Refusal, action: Action, why: str = "") -> str:
        what = "sending" if action is Action.SEND else "reading"
        why = why or (
            "no channel may be used to go around it"
            if action is Action.SEND
            else "the workspace context does not authorize reads after a refusal "
            "(reads_after_refusal)"
        )
        return (
            f"mailbox {self._mailbox_id}: {what} stopped: channel {refusal.channel} refused "
            f"to {refusal.action} ({refusal.reason}); {why}"
        )

    def _exhausted(self, action: Action, last: ProviderError | None = None) -> ProviderError:
        reasons = "; ".join(
            f"{c.channel}: {self._held[c.channel][1]}"
            for c in self._candidates
            if c.channel in self._held
        )
        said = (
            f"mailbox {self._mailbox_id}: no permitted channel can {action} now "
            f"({reasons or 'none could be built'})"
        )
        if isinstance(last, Unsupported):
            return Unsupported(said)
        return TransientFailure(said)

    async def _through(
        self,
        action: Action,
        operation: Callable[[MailProvider], Awaitable[T]],
        usable: Callable[[MailProvider], bool] = lambda _: True,
        *,
        not_found_moves_on: bool = False,
    ) -> T:
        """``operation`` through the first permitted channel that does it."""
        last: ProviderError | None = None
        for candidate in self._open(action):
            adapter = self._adapter(candidate)
            if adapter is None or not usable(adapter):
                continue
            try:
                result = await operation(adapter)
            except AccessRefused as exc:
                self._refuse(candidate.channel, action, exc)
                raise
            except NotFound as exc:
                if not not_found_moves_on:
                    raise
                last = exc
                continue
            except ProviderError as exc:
                if not is_gap(exc):
                    raise
                self._gap(candidate.channel, f"{type(exc).__name__}: {exc}", type(exc).__name__)
                last = exc
                continue
            self._use(candidate.channel)
            return result
        if isinstance(last, NotFound):
            raise last
        raise self._exhausted(action, last)

    # -- the port ------------------------------------------------------------------------

    async def changes(self, cursor: str | None) -> ChangePage:
        def keyed(adapter: MailProvider) -> bool:
            return adapter.capabilities.key_basis

        async def read(adapter: MailProvider) -> ChangePage:
            channel = adapter.capabilities.channel
            page = await adapter.changes(_own_cursor(cursor, channel))
            return page.model_copy(update={"cursor": f"{channel}|{page.cursor}"})

        return await self._through(Action.READ, read, keyed)

    async def fetch_body(self, body_ref: str) -> MessageBody:
        return await self._through(
            Action.READ, lambda a: a.fetch_body(body_ref), not_found_moves_on=True
        )

    async def fetch_attachment(self, ref: str) -> AttachmentData:
        return await self._through(
            Action.READ, lambda a: a.fetch_attachment(ref), not_found_moves_on=True
        )

    async def prepare(self, message: OutgoingMessage) -> Handover:
        handover = await self._through(Action.SEND, lambda a: a.prepare(message))
        self._prepared = Channel(handover.channel)
        return handover

    async def send(self, handover: Handover) -> SendResult:
        """Hand over through the channel that prepared ``handover`` (a send is never moved
        to another channel: the next attempt is prepared again)."""
        self._open(Action.SEND)  # a refusal stops it here
        channel = Channel(handover.channel)
        adapter = self._built.get(channel)
        if adapter is None:
            raise NotHandedOver(
                f"mailbox {self._mailbox_id}: channel {channel} that prepared the send is not "
                "open; prepare it again"
            )
        try:
            return await adapter.send(handover)
        except AccessRefused as exc:
            self._refuse(channel, Action.SEND, exc)
            raise
        except NotHandedOver as exc:
            if is_gap(exc) or type(exc) is NotHandedOver:
                self._gap(channel, f"{type(exc).__name__}: {exc}", type(exc).__name__)
            raise
        finally:
            self._prepared = None

    async def find_sent(self, marker: Marker) -> StoredCopy | None:
        def searches(adapter: MailProvider) -> bool:
            return adapter.capabilities.finds(marker.kind)

        return await self._through(Action.READ, lambda a: a.find_sent(marker), searches)

    async def health(self) -> ProviderHealth:
        statuses = await self.evaluate()
        usable = next((s for s in statuses if s.state is ChannelState.USABLE), None)
        shown = "; ".join(f"{s.channel}: {s.state}, {s.reason}" for s in statuses)
        return ProviderHealth(
            provider=self._provider,
            mailbox_id=self._mailbox_id,
            ok=usable is not None,
            detail=shown,
            account=usable.account if usable is not None else None,
        )

    async def evaluate(self) -> list[ChannelStatus]:
        """Each permitted channel's state now, in order: built and asked for its health
        until one is usable or one refused; the ones after it are not tried (a refusal found
        here is recorded like any other)."""
        statuses: list[ChannelStatus] = []
        after = ""
        for candidate in self._candidates:
            channel = candidate.channel
            if after:
                statuses.append(ChannelStatus(channel, ChannelState.NOT_TRIED, after))
                continue
            refusal = self.refusal
            if refusal is not None and _after(channel, refusal.channel):
                reason = f"channel {refusal.channel} refused (never routed around)"
                statuses.append(ChannelStatus(channel, ChannelState.NOT_TRIED, reason))
                continue
            if refusal is not None and refusal.channel == channel:
                status = ChannelStatus(channel, ChannelState.REFUSED, refusal.reason)
            else:
                status = await self._status(candidate)
                if status.state is ChannelState.REFUSED:
                    self._refuse(channel, Action.READ, status.reason)
            statuses.append(status)
            if status.state is ChannelState.REFUSED:
                after = "a channel before it refused (never routed around)"
            elif status.state is ChannelState.USABLE:
                after = "a channel before it is usable"
        return statuses

    async def _status(self, candidate: Candidate) -> ChannelStatus:
        channel = candidate.channel
        try:
            adapter = self._built.get(channel) or candidate.build()
        except Unsupported as exc:
            return ChannelStatus(channel, ChannelState.NOT_AVAILABLE, str(exc))
        except ProviderError as exc:
            return ChannelStatus(channel, ChannelState.GAP, f"no connector: {exc}")
        self._built[channel] = adapter
        try:
            health = await adapter.health()
        except AccessRefused as exc:
            return ChannelStatus(channel, ChannelState.REFUSED, str(exc))
        except ProviderError as exc:
            return ChannelStatus(channel, ChannelState.GAP, f"{type(exc).__name__}: {exc}")
        if health.refused:
            return ChannelStatus(channel, ChannelState.REFUSED, health.detail)
        state = ChannelState.USABLE if health.ok else ChannelState.GAP
        return ChannelStatus(channel, state, health.detail, health.account)

    async def aclose(self) -> None:
        for adapter in self._built.values():
            await adapter.aclose()


def _own_cursor(cursor: str | None, channel: Channel) -> str | None:
    """The part of a route's cursor that is ``channel``'s (None: another channel's, or an
    untagged one from before routes: read from the beginning)."""
    if cursor is None:
        return None
    tag, sep, own = cursor.partition("|")
    return own if sep and tag == channel.value else None


def _after(channel: Channel, other: Channel) -> bool:
    """Whether ``channel`` comes after ``other`` in the canonical order."""
    return CANONICAL_ORDER.index(channel) > CANONICAL_ORDER.index(other)

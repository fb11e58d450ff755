"""The RunLedger role: runs, their scanned items as read, one disposition per item,
reconciliation, and mailbox cursors that advance only with the items they cover."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from agent.domain.dispositions import Disposition
from agent.domain.envelope import Address, Envelope
from agent.domain.errors import StoreError
from agent.domain.execution import ClaimOutcome
from agent.domain.mail import ScannedMessage
from agent.domain.records import TaskUpdate
from agent.domain.run import LedgerEntry, MailboxCursor
from agent.domain.states import TaskState
from agent.ports import EmbeddedStore
from agent.testing import FrozenClock
from agent.testing.storage.base import ALIVE, DEAD, MAILBOX, WS, Harness, StoreContract, alive, env

ODD_REF = "AAMkAGI2TG93AAA=/\u05e9\u05dc\u05d5\u05dd 'quoted' \"double\" %_?;--"
"""An item reference as a channel may hand it out: base64, Hebrew, quotes, SQL-ish text."""


def odd_envelope() -> Envelope:
    """An envelope with everything a real one may carry that a store could mangle."""
    return Envelope(
        provider="imap",
        mailbox_id=MAILBOX,
        provider_thread_id="",
        provider_message_id=ODD_REF,
        internet_message_id="<\u05e9\u05dc\u05d5\u05dd.\U0001f4e7@contoso.test>",
        in_reply_to="<parent'; DROP TABLE run_items;--@contoso.test>",
        references=("<root@contoso.test>", "<parent'; DROP TABLE run_items;--@contoso.test>"),
        received_at=datetime(2026, 11, 30, 8, 59, 59, 123456, tzinfo=UTC),
        sent_at=datetime(2026, 11, 30, 8, 58, tzinfo=UTC),
        sender=Address(
            address="Dana.Levi@Contoso.test", name="\u05d3\u05e0\u05d4 \u05dc\u05d5\u05d9"
        ),
        to=(Address(address=MAILBOX, name="Support \u2014 \u652f\u63f4"),),
        cc=(Address(address="noa.bar@fabrikam.test"),),
        subject='\u200fRe: \u05d4\u05e6\u05e2\u05ea \u05de\u05d7\u05d9\u05e8 \U0001f680 \\ "q" \x00 end',
        body_ref="imap:INBOX/42;UIDVALIDITY=7",
        attachment_refs=("att-1", "att-\u00e9"),
        attachment_names=(
            "\u05d7\u05e9\u05d1\u05d5\u05e0\u05d9\u05ea.pdf",
            'na\u00efve "file".txt',
        ),
        list_id="<list.contoso.test>",
        content_digest="f" * 64,
        normalization_notes=("charset windows-1255 decoded",),
    )


def cursor(value: str, scope: str = WS, channel: str = "imap") -> MailboxCursor:
    return MailboxCursor(
        scope=scope, provider="imap", mailbox_id=MAILBOX, channel=channel, cursor=value
    )


class RunLedgerContract(StoreContract):
    """The RunLedger role: runs, their scanned items as read, one disposition per item,
    reconciliation, and mailbox cursors that advance only with the items they cover."""

    def test_claim_race_dispositions_are_recorded_in_one_batch_all_or_none(
        self, h: Harness, clock: FrozenClock
    ) -> None:
        a, b = env(1, 1), env(2, 2)
        run_id = h.run(a, b)
        race = [
            ("pm-1", Disposition.EXECUTION_ALREADY_DONE, ""),
            ("pm-2", Disposition.EXECUTION_ALREADY_CLAIMED, "held"),
        ]
        h.store.record_dispositions(run_id, race, clock.now())
        assert [e.disposition for e in h.store.ledger(run_id)] == [d for _, d, _ in race]
        # A batch with one bad entry records nothing.
        run2 = h.run(a, b)
        bad = [("pm-1", Disposition.EXECUTION_ALREADY_DONE, ""), ("pm-9", Disposition.QUEUED, "")]
        with pytest.raises(StoreError, match="never recorded as scanned"):
            h.store.record_dispositions(run2, bad, clock.now())
        assert all(e.disposition is None for e in h.store.ledger(run2))

    def test_an_item_gets_exactly_one_disposition_per_run(
        self, h: Harness, clock: FrozenClock
    ) -> None:
        e = env(1, 1)
        run_id = h.run(e)
        h.store.record_disposition(
            run_id, e.provider_message_id, Disposition.ESCALATED, "", clock.now()
        )
        with pytest.raises(StoreError, match="already has disposition ESCALATED"):
            h.store.record_disposition(
                run_id, e.provider_message_id, Disposition.QUEUED, "", clock.now()
            )
        with pytest.raises(StoreError, match="never recorded as scanned"):
            h.store.record_disposition(run_id, "pm-unknown", Disposition.QUEUED, "", clock.now())

    def test_reconcile_counts_every_scanned_item_into_one_class(
        self, h: Harness, clock: FrozenClock
    ) -> None:
        a, b, c = env(1, 1), env(2, 2), env(3, 3)
        r1 = h.run(a)
        h.claim(r1, a)
        h.report(r1, a)
        run_id = h.run(a, b, c)
        assert h.claim(run_id, a).outcome is ClaimOutcome.EXECUTION_ALREADY_DONE
        h.store.record_disposition(
            run_id, "pm-1", Disposition.EXECUTION_ALREADY_DONE, "", clock.now()
        )
        h.claim(run_id, b)
        h.report(
            run_id, b, Disposition.NOISE_EXCLUDED, update=TaskUpdate(state=TaskState.COMPLETED)
        )
        h.claim(run_id, c)
        h.report(run_id, c, Disposition.WAITING_INTERNAL_APPROVAL, update=TaskUpdate())
        rec = h.store.reconcile(run_id, clock.now())
        assert (rec.scanned, rec.terminal, rec.non_terminal, rec.claim_race) == (3, 1, 1, 1)
        assert rec.clean and rec.reconciliation_failed == 0
        assert h.store.run_summary(run_id) == rec

    def test_an_item_without_an_outcome_is_reconciliation_failed_and_the_run_not_clean(
        self, h: Harness, clock: FrozenClock
    ) -> None:
        a, b = env(1, 1), env(2, 2)
        run_id = h.run(a, b)
        h.claim(run_id, a)
        h.report(run_id, a)
        h.claim(run_id, b)  # the worker died before reporting b
        rec = h.store.reconcile(run_id, clock.now())
        assert rec.reconciliation_failed == 1 and not rec.clean
        assert (
            rec.scanned
            == rec.terminal + rec.non_terminal + rec.claim_race + rec.reconciliation_failed
        )
        dispositions = {e.item_ref: e.disposition for e in h.store.ledger(run_id)}
        assert dispositions["pm-2"] is Disposition.RECONCILIATION_FAILED

    def test_reconcile_is_idempotent(self, h: Harness, clock: FrozenClock) -> None:
        a = env(1, 1)
        run_id = h.run(a)
        h.claim(run_id, a)
        h.report(run_id, a)
        first = h.store.reconcile(run_id, clock.now())
        again = h.store.reconcile(run_id, clock.now())
        assert first.clean and again.model_dump(exclude={"reconciled_at"}) == first.model_dump(
            exclude={"reconciled_at"}
        )

    def test_reconciling_an_unknown_run_is_an_error(
        self, store: EmbeddedStore, clock: FrozenClock
    ) -> None:
        with pytest.raises(StoreError, match="does not exist"):
            store.reconcile("run-nope", clock.now())

    def test_unreconciled_runs_lists_open_runs_of_the_scope_with_their_holder(
        self, h: Harness, clock: FrozenClock
    ) -> None:
        e = env(1, 1)
        open_run, done_run = h.run(e), h.run(e)
        h.store.reconcile(done_run, clock.now())
        h.store.start_run("run-other-scope", "ws-other", DEAD, clock.now())
        assert [
            (r.run_id, r.holder, r.lease_expires_at) for r in h.store.unreconciled_runs(WS)
        ] == [(open_run, ALIVE, None)]

    def test_a_run_lease_is_kept_renewed_by_its_holder_only_until_it_is_reconciled(
        self, store: EmbeddedStore, clock: FrozenClock
    ) -> None:
        lease = clock.now() + timedelta(minutes=15)
        store.start_run("run-leased", WS, ALIVE, clock.now(), lease)
        [run] = store.unreconciled_runs(WS)
        assert run.lease_expires_at == lease
        assert not run.stale(clock.now(), alive)
        assert run.stale(lease, alive)  # the lease ran out
        assert run.stale(clock.now(), lambda _holder: False)  # the holder is provably dead
        later = lease + timedelta(minutes=10)
        assert not store.renew_run("run-leased", DEAD, later)  # only the holder renews
        assert store.renew_run("run-leased", ALIVE, later)
        [run] = store.unreconciled_runs(WS)
        assert run.lease_expires_at == later and not run.stale(lease, alive)
        store.reconcile("run-leased", clock.now())
        assert not store.renew_run("run-leased", ALIVE, later + timedelta(minutes=10))
        assert store.unreconciled_runs(WS) == []

    def test_a_stale_run_is_reconciled_only_while_it_is_still_open_and_stale(
        self, store: EmbeddedStore, clock: FrozenClock
    ) -> None:
        lease = clock.now() + timedelta(minutes=15)
        store.start_run("run-leased", WS, ALIVE, clock.now(), lease)
        store.record_scanned([LedgerEntry(run_id="run-leased", item_ref="a")], clock.now())
        assert store.reconcile_stale("run-leased", clock.now(), alive) is None  # lease runs
        # Its worker renewed in time: a reconciler that decided on the old lease gets nothing.
        assert store.renew_run("run-leased", ALIVE, lease + timedelta(minutes=15))
        assert store.reconcile_stale("run-leased", lease, alive) is None
        later = lease + timedelta(minutes=20)
        stale = store.reconcile_stale("run-leased", later, alive)
        assert stale is not None and stale.reconciliation_failed == 1 and not stale.clean
        assert store.reconcile_stale("run-leased", later, alive) is None  # once only
        # A worker whose run was reconciled under it cannot record more items into it.
        with pytest.raises(StoreError, match="already reconciled"):
            store.record_scanned([LedgerEntry(run_id="run-leased", item_ref="b")], later)
        assert [e.item_ref for e in store.ledger("run-leased")] == ["a"]
        assert store.reconcile_stale("run-unknown", later, alive) is None

    def test_scanned_items_round_trip_exactly_with_their_owner_and_mailbox(
        self, store: EmbeddedStore, clock: FrozenClock
    ) -> None:
        store.start_run("run-1", WS, ALIVE, clock.now())
        envelope = odd_envelope()
        entries = [
            LedgerEntry(
                run_id="run-1", item_ref=ODD_REF, occurrence_key="k|\u05e9",
                scanned=ScannedMessage(item_ref=ODD_REF, envelope=envelope),
                owner=WS, mailbox_id=MAILBOX,
            ),
            LedgerEntry(
                run_id="run-1", item_ref="unreadable-\U0001f4a5",
                scanned=ScannedMessage(
                    item_ref="unreadable-\U0001f4a5", error="no Date header; \"bad\" \u05e9"
                ),
                owner="station", mailbox_id=MAILBOX, detail="unreadable",
                reason="could not be normalized: no Date header",
            ),
            LedgerEntry(run_id="run-1", item_ref="bare"),  # as the store recorded items before
        ]  # fmt: skip
        store.record_scanned(entries, clock.now())
        ledger = store.ledger("run-1")
        assert sorted(ledger, key=lambda e: e.item_ref) == sorted(entries, key=lambda e: e.item_ref)
        [read] = [e for e in ledger if e.item_ref == ODD_REF]
        assert read.scanned is not None and read.scanned.envelope is not None
        assert read.scanned.envelope.model_dump() == envelope.model_dump()
        assert read.scanned.envelope.subject.endswith("\x00 end")
        # The dispositions still go to exactly these items; a disposition's detail never
        # rewrites why an item was planned as it was.
        store.record_disposition("run-1", ODD_REF, Disposition.QUEUED, "", clock.now())
        [decided] = [e for e in store.ledger("run-1") if e.item_ref == ODD_REF]
        assert decided.disposition is Disposition.QUEUED and decided.scanned == read.scanned
        store.record_disposition(
            "run-1",
            "unreadable-\U0001f4a5",
            Disposition.ESCALATED,
            "sent to the queue",
            clock.now(),
        )
        [escalated] = [e for e in store.ledger("run-1") if e.owner == "station"]
        assert escalated.detail == "sent to the queue"
        assert escalated.reason == "could not be normalized: no Date header"

    def test_the_cursor_advances_only_in_the_transaction_that_records_its_items(
        self, store: EmbeddedStore, clock: FrozenClock
    ) -> None:
        key = (WS, "imap", MAILBOX, "imap")
        assert store.get_cursor(*key) is None
        store.start_run("run-1", WS, ALIVE, clock.now())
        page = [LedgerEntry(run_id="run-1", item_ref=f"i-{n}", owner=WS) for n in range(3)]
        store.record_scanned(page, clock.now(), cursor("c-1"))
        assert store.get_cursor(*key) == "c-1"
        assert [e.item_ref for e in store.ledger("run-1")] == ["i-0", "i-1", "i-2"]
        # Each scope, mailbox and channel has its own cursor.
        assert store.get_cursor("station", "imap", MAILBOX, "imap") is None
        assert store.get_cursor(WS, "imap", MAILBOX, "api") is None
        store.record_scanned([], clock.now(), cursor("a-1", channel="api"))
        assert store.get_cursor(WS, "imap", MAILBOX, "api") == "a-1"
        # A page with no new items still moves the cursor.
        store.record_scanned([], clock.advance(seconds=1), cursor("c-2"))
        assert store.get_cursor(*key) == "c-2"

        # A failure anywhere in the transaction leaves the items and the cursor as they were.
        before = store.ledger("run-1")
        again = [LedgerEntry(run_id="run-1", item_ref="i-3"), page[1]]
        with pytest.raises(StoreError, match="already recorded as scanned: i-1"):
            store.record_scanned(again, clock.now(), cursor("c-3"))
        twice = [LedgerEntry(run_id="run-1", item_ref="i-4")] * 2
        with pytest.raises(StoreError, match="scanned twice"):
            store.record_scanned(twice, clock.now(), cursor("c-3"))
        store.reconcile("run-1", clock.now())
        with pytest.raises(StoreError, match="already reconciled"):
            store.record_scanned(
                [LedgerEntry(run_id="run-1", item_ref="i-5")], clock.now(), cursor("c-3")
            )
        assert store.get_cursor(*key) == "c-2"
        assert [e.item_ref for e in store.ledger("run-1")] == [e.item_ref for e in before]

        # An expired cursor is forgotten (the next read starts from the beginning).
        store.clear_cursor(*key)
        assert store.get_cursor(*key) is None
        store.clear_cursor(*key)  # forgetting it again is harmless
        assert store.get_cursor(WS, "imap", MAILBOX, "api") == "a-1"

    def test_run_holder_names_an_open_runs_holder_and_lease_until_it_is_reconciled(
        self, store: EmbeddedStore, clock: FrozenClock
    ) -> None:
        lease = clock.now() + timedelta(minutes=15)
        store.start_run("run-1", WS, ALIVE, clock.now(), lease)
        store.start_run("run-2", "station", DEAD, clock.now() + timedelta(seconds=1))
        held = store.run_holder("run-1")
        assert held is not None and (held.run_id, held.holder, held.scope) == ("run-1", ALIVE, WS)
        assert held.lease_expires_at == lease
        later = lease + timedelta(minutes=15)
        assert store.renew_run("run-1", ALIVE, later)
        renewed = store.run_holder("run-1")
        assert renewed is not None and renewed.lease_expires_at == later
        other = store.run_holder("run-2")
        assert other is not None and other.holder == DEAD and other.lease_expires_at is None
        assert other.scope == "station"
        store.reconcile("run-1", clock.now())
        assert store.run_holder("run-1") is None
        assert store.run_holder("run-unknown") is None
        assert store.list_runs() == ["run-1", "run-2"]
        store.start_run("run-3", WS, ALIVE, clock.now() + timedelta(seconds=2))
        [newest, first] = store.recent_runs(WS)
        assert (newest.run_id, newest.summary) == ("run-3", None)
        assert first.run_id == "run-1" and first.started_at == clock.now()
        assert first.summary == store.run_summary("run-1") and first.summary is not None
        assert [r.run_id for r in store.recent_runs(WS, limit=1)] == ["run-3"]
        assert [r.run_id for r in store.recent_runs("station")] == ["run-2"]

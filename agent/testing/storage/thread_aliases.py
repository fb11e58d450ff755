"""The ThreadAliases role: a thread's alias, reached from any Message-ID of the thread, kept
per mailbox; of concurrent callers the first to record an id wins."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agent.domain.run import ThreadLink
from agent.ports import EmbeddedStore
from agent.testing.storage.base import MAILBOX, StoreContract, race_processes

ROOT = "<root@contoso.test>"


def link(
    message_id: str,
    related: tuple[str, ...] = (),
    proposed: str = "",
    identity: str | None = None,
) -> ThreadLink:
    """A message's link; its identity is its own unless given (another message's reuses
    the id)."""
    return ThreadLink(
        message_id=message_id,
        identity=identity or f"identity of {message_id}",
        related=related,
        proposed=proposed,
        if_reused=f"{proposed}/reused",
    )


RACERS = 8


def alias_worker(
    opener: Any,
    address: str,
    message_id: str,
    related: tuple[str, ...],
    proposed: str,
    barrier: Any,
    results: Any,
) -> None:
    """One process: open the shared store, wait for the others, then resolve one message."""
    store = opener(address)
    try:
        barrier.wait(timeout=120)
        alias = store.resolve_thread("imap", MAILBOX, link(message_id, related, proposed))
        results.put((message_id, proposed, alias))
    except Exception as exc:  # reported to the parent, which fails the test
        results.put((message_id, proposed, f"error: {type(exc).__name__}: {exc}"))
    finally:
        store.close()


class ThreadAliasesContract(StoreContract):
    """The ThreadAliases role: a thread's alias, reached from any Message-ID of the thread,
    kept per mailbox; of concurrent callers the first to record an id wins."""

    @staticmethod
    def resolve(
        store: EmbeddedStore,
        message_id: str,
        related: tuple[str, ...] = (),
        proposed: str = "",
        identity: str | None = None,
    ) -> str:
        return store.resolve_thread("imap", MAILBOX, link(message_id, related, proposed, identity))

    def test_a_new_message_takes_the_proposed_alias_and_keeps_it(
        self, store: EmbeddedStore
    ) -> None:
        assert self.resolve(store, ROOT, proposed="alias-root") == "alias-root"
        assert self.resolve(store, ROOT, proposed="alias-other") == "alias-root"

    def test_a_reply_joins_the_alias_of_the_first_related_id_that_has_one(
        self, store: EmbeddedStore
    ) -> None:
        self.resolve(store, ROOT, proposed="alias-root")
        self.resolve(store, "<other@contoso.test>", proposed="alias-other")
        reply = self.resolve(store, "<r1@contoso.test>", (ROOT,), "alias-r1")
        assert reply == "alias-root"
        # In-Reply-To first, then References: the first related id with an alias decides,
        # and related ids that had none are recorded with it.
        unknown = "<never-seen@contoso.test>"
        second = self.resolve(
            store, "<r2@contoso.test>", (unknown, "<other@contoso.test>", ROOT), "alias-r2"
        )
        assert second == "alias-other"
        assert self.resolve(store, unknown, proposed="alias-late") == "alias-other"
        # A related id keeps the alias it had: nothing is ever re-pointed.
        assert self.resolve(store, ROOT, proposed="x") == "alias-root"

    def test_a_messages_own_alias_wins_over_its_related_ids(self, store: EmbeddedStore) -> None:
        self.resolve(store, ROOT, proposed="alias-root")
        self.resolve(store, "<m@contoso.test>", proposed="alias-m")
        parent = "<unaliased-parent@contoso.test>"
        assert self.resolve(store, "<m@contoso.test>", (ROOT, parent), "x") == "alias-m"
        assert self.resolve(store, ROOT, proposed="x") == "alias-root"
        # The related id that had no alias took the message's own.
        assert self.resolve(store, parent, proposed="x") == "alias-m"
        # A message naming itself among its related ids is no different.
        assert self.resolve(store, "<m@contoso.test>", ("<m@contoso.test>",), "x") == "alias-m"

    def test_a_reused_message_id_is_nobodys_parent_and_its_first_message_keeps_its_alias(
        self, store: EmbeddedStore
    ) -> None:
        assert self.resolve(store, ROOT, proposed="alias-root") == "alias-root"
        # Another message (another sender or subject: another identity) carries the same id.
        forged = self.resolve(store, ROOT, proposed="alias-root", identity="another message")
        assert forged == "alias-root/reused"
        assert (
            self.resolve(store, ROOT, proposed="alias-root", identity="another message") == forged
        )
        # The first message, read again (or through another channel), keeps its alias.
        assert self.resolve(store, ROOT, proposed="x") == "alias-root"
        # A reply naming the reused id joins neither: it starts a thread of its own (not
        # the one a proposal named from the reused id would give)...
        assert self.resolve(store, "<reply@contoso.test>", (ROOT,), "alias-reply") == (
            "alias-reply/reused"
        )
        # ...unless it also names a message whose id is its own.
        self.resolve(store, "<parent@contoso.test>", proposed="alias-parent")
        joined = self.resolve(
            store, "<r2@contoso.test>", (ROOT, "<parent@contoso.test>"), "alias-r2"
        )
        assert joined == "alias-parent"

    def test_a_message_only_referenced_so_far_keeps_the_alias_its_replies_gave_it(
        self, store: EmbeddedStore
    ) -> None:
        reply = self.resolve(store, "<reply@contoso.test>", (ROOT,), "alias-thread")
        # The message it answers arrives later (read out of order): it is that thread.
        assert self.resolve(store, ROOT, proposed="alias-late") == reply
        # And from then on the id is that message's: another carrying it reuses it.
        assert self.resolve(store, ROOT, proposed="alias-late", identity="other") == (
            "alias-late/reused"
        )

    def test_a_page_resolved_at_once_names_each_thread_as_one_by_one_would(
        self, store: EmbeddedStore
    ) -> None:
        """Resolving a page's links in one call equals resolving them in order: a later link
        sees what an earlier one recorded (a reply after its parent, a reused id)."""
        page = [
            link("<reply@contoso.test>", (ROOT,), "alias-thread"),
            link(ROOT, (), "alias-late"),
            link("<second@contoso.test>", ("<reply@contoso.test>", ROOT), "alias-second"),
            link(ROOT, (), "alias-late", identity="another message"),
            link("<lone@contoso.test>", (), "alias-lone"),
        ]
        at_once = store.resolve_threads("imap", MAILBOX, page)
        elsewhere = "other@fabrikam.test"  # aliases are per mailbox: a clean slate
        one_by_one = [store.resolve_thread("imap", elsewhere, item) for item in page]
        assert at_once == one_by_one
        assert at_once[:3] == ["alias-thread"] * 3 and at_once[3] == "alias-late/reused"
        assert store.resolve_threads("imap", MAILBOX, []) == []

    def test_aliases_are_kept_per_provider_and_mailbox_and_any_id_is_keyed_exactly(
        self, store: EmbeddedStore
    ) -> None:
        self.resolve(store, ROOT, proposed="alias-root")
        assert store.resolve_thread("imap", "sales@fabrikam.test", link(ROOT, (), "s")) == "s"
        assert store.resolve_thread("maildir", MAILBOX, link(ROOT, (), "d")) == "d"
        assert self.resolve(store, ROOT, proposed="x") == "alias-root"
        odd = "<\u05e9\u05dc\u05d5\u05dd'; DROP TABLE thread_aliases;--\U0001f4e7@contoso.test>"
        long_id = "<" + "x" * 880 + "@contoso.test>"
        assert self.resolve(store, odd, (long_id,), "alias-\u05e9") == "alias-\u05e9"
        assert self.resolve(store, long_id, proposed="x") == "alias-\u05e9"
        assert self.resolve(store, odd.upper(), proposed="upper") == "upper"  # exact, not folded
        many = tuple(f"<ref-{n}@contoso.test>" for n in range(250))
        assert self.resolve(store, "<wide@contoso.test>", (*many, ROOT), "w") == "alias-root"
        assert self.resolve(store, many[-1], proposed="x") == "alias-root"

    @pytest.mark.slow
    def test_of_processes_resolving_one_new_message_at_once_the_first_to_record_wins(
        self, store: EmbeddedStore, tmp_path: Path
    ) -> None:
        address = self.address(tmp_path)
        outcomes = race_processes(
            alias_worker,
            [(self.open_address, address, ROOT, (), f"alias-{n}") for n in range(RACERS)],
        )
        aliases = {alias for _, _, alias in outcomes}
        assert len(aliases) == 1, outcomes
        [alias] = aliases
        assert alias in {f"alias-{n}" for n in range(RACERS)}
        assert self.resolve(store, ROOT, proposed="late") == alias

    @pytest.mark.slow
    def test_replies_racing_for_an_unaliased_parent_all_join_one_thread(
        self, store: EmbeddedStore, tmp_path: Path
    ) -> None:
        # Every reply proposes its own alias for the parent nobody aliased yet: the first to
        # record the parent wins, and every other reply follows it instead of its own.
        address = self.address(tmp_path)
        replies = [f"<reply-{n}@contoso.test>" for n in range(RACERS)]
        outcomes = race_processes(
            alias_worker,
            [
                (self.open_address, address, reply, (ROOT,), f"alias-{n}")
                for n, reply in enumerate(replies)
            ],
        )
        aliases = {alias for _, _, alias in outcomes}
        assert len(aliases) == 1, outcomes
        [alias] = aliases
        assert self.resolve(store, ROOT, proposed="late") == alias
        assert {self.resolve(store, reply, proposed="late") for reply in replies} == {alias}

"""Thread aliases (the ThreadAliases role): for mail systems whose channels show no common
thread id, every Message-ID of a thread reaches the thread's alias, kept per mailbox.

One transaction resolves and records. A message's own id gives its alias when the id is this
message's (recorded with the same identity - the header digest every channel shows alike -
or only referenced so far). An id that another message carries too is reused: it is marked
so and is nobody's parent from then on (the first message keeps its alias), and the message
that reused it - or a reply naming only reused ids - starts its own thread unless what it
answers has an alias. Otherwise the
alias of the first related id (In-Reply-To, then References) that has one, else the proposed
one. The message and every related id without an alias then record it, ``INSERT ... ON
CONFLICT DO NOTHING``. Of concurrent callers the first to record an id wins: on PostgreSQL
an insert that meets another's uncommitted insert of the same id waits for it, and then sees
it. A caller that lost an id to a concurrent one decides again on what is recorded now, as
if it had come after that caller, and re-points the ids it recorded itself (uncommitted, so
nobody saw them). A message's ids are inserted in sorted order, so two callers resolving one
message each never wait on each other in a cycle; two resolving overlapping pages at once
(``resolve_threads``) may, and PostgreSQL then rolls one back, which the store retries whole
(its decisions are made again on what the other recorded).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from agent.domain.run import ThreadLink
from agent.storage.sql.core import SqlBase, Tx, chunks


class Known(NamedTuple):
    alias: str
    identity: str | None
    reused: bool


class AliasRows(SqlBase):
    def resolve_thread(self, provider: str, mailbox_id: str, link: ThreadLink) -> str:
        # Running it again after an unknown commit finds every id recorded, and the same alias.
        return self._write(lambda conn: self._resolve(conn, provider, mailbox_id, link), None)

    def resolve_threads(
        self, provider: str, mailbox_id: str, links: Sequence[ThreadLink]
    ) -> list[str]:
        """Each link in order, in one transaction: a later link sees what an earlier one
        recorded, as if resolved one after the other."""
        if not links:
            return []
        return self._write(
            lambda conn: [self._resolve(conn, provider, mailbox_id, link) for link in links],
            None,
        )

    def _resolve(self, conn: Tx, provider: str, mailbox_id: str, link: ThreadLink) -> str:
        linked = [r for r in dict.fromkeys(link.related) if r != link.message_id]
        ids = [link.message_id, *linked]
        known = self._known(conn, provider, mailbox_id, ids)
        alias = _decide(known, link, linked)
        missing = sorted(i for i in ids if i not in known)
        mine = self._record(conn, provider, mailbox_id, missing, alias, link)
        if len(mine) < len(missing):
            # A concurrent caller recorded some of these ids first: its aliases count as
            # recorded before ours, and ours (still uncommitted) follow the decision.
            known |= self._known(conn, provider, mailbox_id, [i for i in missing if i not in mine])
            final = _decide(known, link, linked)
            if final != alias:
                self._repoint(conn, provider, mailbox_id, sorted(mine), final)
            alias = final
        self._mark_own(conn, provider, mailbox_id, link, known.get(link.message_id))
        return alias

    @staticmethod
    def _known(conn: Tx, provider: str, mailbox_id: str, ids: Sequence[str]) -> dict[str, Known]:
        found: dict[str, Known] = {}
        for chunk in chunks(ids):
            marks = ", ".join("?" * len(chunk))
            for row in conn.execute(
                "SELECT message_id, alias, identity, reused FROM thread_aliases WHERE provider = ?"
                f" AND mailbox_id = ? AND message_id IN ({marks})",
                (provider, mailbox_id, *chunk),
            ).fetchall():
                identity = row["identity"]
                found[str(row["message_id"])] = Known(
                    str(row["alias"]),
                    None if identity is None else str(identity),
                    bool(row["reused"]),
                )
        return found

    @staticmethod
    def _record(
        conn: Tx,
        provider: str,
        mailbox_id: str,
        ids: Sequence[str],
        alias: str,
        link: ThreadLink,
    ) -> set[str]:
        """Record ``alias`` for those of ``ids`` nobody recorded first (the message's own id
        with its identity, the ids it answers as references); the ids recorded."""
        recorded: set[str] = set()
        for chunk in chunks(ids):
            marks = ", ".join(["(?, ?, ?, ?, ?)"] * len(chunk))
            rows = conn.execute(
                "INSERT INTO thread_aliases (provider, mailbox_id, message_id, alias, identity)"
                f" VALUES {marks} ON CONFLICT (provider, mailbox_id, message_id)"
                " DO NOTHING RETURNING message_id",
                [
                    v
                    for i in chunk
                    for v in (
                        provider,
                        mailbox_id,
                        i,
                        alias,
                        link.identity if i == link.message_id else None,
                    )
                ],
            ).fetchall()
            recorded |= {str(r["message_id"]) for r in rows}
        return recorded

    @staticmethod
    def _repoint(conn: Tx, provider: str, mailbox_id: str, ids: list[str], alias: str) -> None:
        for chunk in chunks(ids):
            marks = ", ".join("?" * len(chunk))
            conn.execute(
                "UPDATE thread_aliases SET alias = ? WHERE provider = ?"
                f" AND mailbox_id = ? AND message_id IN ({marks})",
                (alias, provider, mailbox_id, *chunk),
            )

    @staticmethod
    def _mark_own(
        conn: Tx, provider: str, mailbox_id: str, link: ThreadLink, own: Known | None
    ) -> None:
        """The message's own id, known before: claimed by this message if only referenced
        so far; marked reused if another message carries it."""
        if own is None or own.identity == link.identity or (own.reused and own.identity):
            return
        claim = own.identity is None
        conn.execute(
            "UPDATE thread_aliases SET identity = CASE WHEN ? THEN ? ELSE identity END,"
            " reused = CASE WHEN ? THEN reused ELSE 1 END"
            " WHERE provider = ? AND mailbox_id = ? AND message_id = ?",
            (claim, link.identity, claim, provider, mailbox_id, link.message_id),
        )


def _decide(known: dict[str, Known], link: ThreadLink, linked: list[str]) -> str:
    own = known.get(link.message_id)
    if own is not None and own.identity in (None, link.identity):
        return own.alias
    parent = next((known[r].alias for r in linked if r in known and not known[r].reused), None)
    if parent is not None:
        return parent
    names_reused = any(known[r].reused for r in linked if r in known)
    return link.if_reused if own is not None or names_reused else link.proposed

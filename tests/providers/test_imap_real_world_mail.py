"""Real-world mail through the IMAP adapter and the whole intake: every file of CPython's own
email test corpus (``test/test_email/data`` next to ``test.__file__``), delivered to a Dovecot
user through LMTP as a mail server would, is read by one intake cycle of a workspace whose
mailbox is that IMAP mailbox. Each delivered message gets exactly one recorded item: normalized
(an envelope, and a disposition decided from it) or unreadable (an error saying why, and the
item escalated with that reason); nothing crashes intake; the run reconciles clean.

The corpus is the standard library's own test data: pyenv's and python.org's builds ship it,
Debian's system Python has it in ``libpython3.11-testsuite`` (scripts/setup installs it). The
test fails, saying so, when it cannot be found - it is never skipped. A file Dovecot's LMTP
refuses is not our failure, but it is counted and named with Dovecot's reason.
"""

from __future__ import annotations

import email
import importlib
import re
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from email import policy
from pathlib import Path

import pytest

from agent.domain.context import Endpoint, MailServer, Security
from agent.domain.dispositions import CLAIM_RACE, COVERED, Disposition
from agent.domain.run import LedgerEntry
from agent.domain.secrets import Secret
from agent.providers.imap_smtp import ImapSmtpProvider
from agent.services import intake, workspaces
from agent.storage.sqlite import SqliteStore
from agent.testing import FrozenClock
from fixtures.dovecot import Dovecot, DovecotError
from tests.conftest import REPORTED, context_yaml, session_dovecot

WORKSPACE = "ws-real-world-mail"
USER = "corpus@fabrikam.test"
PASSWORD = "corpus-secret"
PAGE_SIZE = 16
"""Small pages: the corpus is read over several of them, as a large mailbox is."""
UNREADABLE = "could not be normalized: "
"""How intake's plan states the reason of an item without an envelope (agent/services/intake)."""
PLAIN_MESSAGE_ID = re.compile(r"<[^<>\s]+@[^<>\s]+>")
CORPUS_HINT = (
    "CPython's email test corpus (test/test_email/data) is not installed for {python}: "
    "pyenv and python.org builds ship it; on Debian's system Python install "
    "libpython3.11-testsuite (./scripts/setup does)"
)


def corpus_dir() -> Path:
    """The corpus of the running interpreter; a clear failure when it is missing."""
    hint = CORPUS_HINT.format(python=sys.executable)
    try:
        test_package = importlib.import_module("test")  # the standard library's tests
    except ImportError as exc:
        pytest.fail(f"{hint} (import test: {exc})")
    location = getattr(test_package, "__file__", None)
    if not isinstance(location, str):
        pytest.fail(f"{hint} (the test package has no __file__)")
    data = Path(location).parent / "test_email" / "data"
    if not data.is_dir() or not any(data.glob("msg_*.txt")):
        pytest.fail(f"{hint} (no messages in {data})")
    return data


@dataclass
class Delivered:
    """The corpus as delivered: each accepted file with the UID Dovecot gave it, and each
    refused one with Dovecot's reason."""

    by_uid: dict[int, str] = field(default_factory=dict[int, str])
    message_ids: dict[str, str | None] = field(default_factory=dict[str, str | None])
    """The plain Message-ID the standard library reads in each accepted file, if any."""
    refused: dict[str, str] = field(default_factory=dict[str, str])


def deliver_corpus(dovecot: Dovecot, data: Path) -> Delivered:
    """Deliver every file of the corpus, one LMTP transaction each, as it is on disk."""
    delivered = Delivered()
    known: set[int] = set()
    for path in sorted(p for p in data.iterdir() if p.is_file()):
        raw = path.read_bytes()
        try:
            dovecot.deliver(USER, raw)
        except DovecotError as exc:
            delivered.refused[path.name] = str(exc).splitlines()[0]
            continue
        new = set(dovecot.uids(USER)) - known
        assert len(new) == 1, f"delivering {path.name} added UIDs {sorted(new)}, not one"
        uid = new.pop()
        delivered.by_uid[uid] = path.name
        delivered.message_ids[path.name] = plain_message_id(raw)
        known.add(uid)
    return delivered


def plain_message_id(raw: bytes) -> str | None:
    """The file's Message-ID as the standard library's parser reads it, when it is one plain
    ``<left@right>`` (what any reader must find)."""
    value = email.message_from_bytes(raw, policy=policy.compat32).get("Message-ID")
    text = str(value).strip() if value is not None else ""
    return text if PLAIN_MESSAGE_ID.fullmatch(text) else None


def server(dovecot: Dovecot) -> MailServer:
    """The IMAP server is the Dovecot; the SMTP endpoint is never reached (the workspace
    sends no acknowledgement, and intake sends nothing else)."""
    return MailServer(
        imap=Endpoint(host=dovecot.host, port=dovecot.imap_port, security=Security.NONE),
        smtp=Endpoint(host=dovecot.host, port=dovecot.lmtp_port, security=Security.NONE),
        username=USER,
        timeout_seconds=30,
    )


def context_text(dovecot: Dovecot) -> str:
    block = (
        f"server: {{imap: {{host: {dovecot.host}, port: {dovecot.imap_port}, security: none}}, "
        f"smtp: {{host: {dovecot.host}, port: {dovecot.lmtp_port}, security: none}}, "
        f"username: '{USER}'}}"
    )
    return context_yaml(WORKSPACE, mailbox=USER, provider="imap", mailbox_fields=block)


def uid_of(entry: LedgerEntry) -> int:
    """The Dovecot UID of a recorded item (``imap:INBOX:<uidvalidity>:<uid>``)."""
    assert entry.scanned is not None, f"{entry.item_ref} was recorded without the item read"
    head, _, uid = entry.scanned.item_ref.rpartition(":")
    assert head.startswith("imap:INBOX:") and uid.isdigit(), entry.scanned.item_ref
    return int(uid)


def problems_of(entry: LedgerEntry, name: str, message_id: str | None) -> list[str]:
    """What is wrong with one delivered message's recorded item (nothing, if all is well);
    ``message_id`` is the plain Message-ID the file has, if any."""
    scanned = entry.scanned
    assert scanned is not None
    disposition = entry.disposition
    found: list[str] = []
    if disposition is None or disposition not in COVERED:
        found.append(f"{name}: disposition {disposition}, not a covered outcome")
    if scanned.envelope is not None:
        read = scanned.envelope.internet_message_id
        if message_id is not None and read != message_id:
            found.append(f"{name}: normalized with Message-ID {read!r}, not {message_id!r}")
        if entry.reason.startswith(UNREADABLE):
            found.append(f"{name}: normalized, yet planned as unreadable ({entry.reason})")
        return found
    error = (scanned.error or "").strip()
    if len(error) < 20 or error.startswith("could not be normalized (Exception"):
        found.append(f"{name}: unreadable without a clear reason ({error!r})")
    if disposition is not Disposition.ESCALATED:
        found.append(f"{name}: unreadable, yet {disposition} (an error disposition is ESCALATED)")
    if error not in entry.reason or not entry.reason.startswith(UNREADABLE):
        found.append(f"{name}: escalated as {entry.reason!r}, not for its error {error!r}")
    return found


def same_occurrence(entries: list[LedgerEntry], delivered: Delivered) -> dict[str, str | None]:
    """Each message recorded as already claimed or done (a claim-race disposition), with the
    message of the run it is the same occurrence as - the first one claimed under its key -
    or None when no other message has its key (a race nothing explains)."""
    claimed: dict[str, str] = {}
    for entry in entries:
        if entry.occurrence_key and entry.disposition not in CLAIM_RACE:
            claimed.setdefault(entry.occurrence_key, delivered.by_uid[uid_of(entry)])
    return {
        delivered.by_uid[uid_of(e)]: claimed.get(e.occurrence_key or "")
        for e in entries
        if e.disposition in CLAIM_RACE
    }


@pytest.mark.anyio
async def test_every_message_of_cpythons_email_corpus_is_normalized_or_recorded_as_an_error(
    register: Callable[[str], str],
    station_store: SqliteStore,
    data_dir: workspaces.DataDir,
    clock: FrozenClock,
) -> None:
    corpus = corpus_dir()
    dovecot = session_dovecot()
    dovecot.add_user(USER, PASSWORD)
    delivered = deliver_corpus(dovecot, corpus)
    files = sorted(p.name for p in corpus.iterdir() if p.is_file())
    refusals = "; ".join(f"{n}: {why}" for n, why in sorted(delivered.refused.items()))
    counted = f"{len(files)} files, {len(delivered.by_uid)} delivered, refused: {refusals or '-'}"
    assert len(delivered.by_uid) + len(delivered.refused) == len(files), counted
    assert delivered.by_uid, f"Dovecot's LMTP refused the whole corpus ({counted})"

    workspace_id = register(context_text(dovecot))
    adapter = ImapSmtpProvider(server(dovecot), USER, Secret(PASSWORD), page_size=PAGE_SIZE)
    result = await intake.run_cycle(
        store=station_store,
        data_dir=data_dir,
        workspace_id=workspace_id,
        provider_for=lambda _workspace, _binding: adapter,
        clock=clock,
    )

    assert result.access_errors == [], f"the mailbox could not be read: {result.access_errors}"
    assert result.item_errors == [], f"intake crashed on items: {result.item_errors}"
    entries = station_store.ledger(result.run_id)
    per_uid = Counter(uid_of(e) for e in entries)
    twice = sorted(delivered.by_uid.get(u, f"UID {u}") for u, n in per_uid.items() if n > 1)
    missing = sorted(n for u, n in delivered.by_uid.items() if u not in per_uid)
    unknown = sorted(u for u in per_uid if u not in delivered.by_uid)
    assert (twice, missing, unknown) == ([], [], []), (
        f"recorded twice {twice}, never recorded {missing}, recorded but never delivered "
        f"(UIDs) {unknown} ({counted})"
    )
    problems = [
        problem
        for e in entries
        for name in [delivered.by_uid[uid_of(e)]]
        for problem in problems_of(e, name, delivered.message_ids[name])
    ]
    assert problems == [], "\n".join(problems)
    same_as = same_occurrence(entries, delivered)
    unexplained = sorted(n for n, first in same_as.items() if first is None)
    assert unexplained == [], (
        f"{unexplained} were recorded as already claimed or done, yet no other message of "
        "the run is the same occurrence (Message-ID, sender, Date and subject)"
    )

    reconciliation = result.reconciliation
    assert reconciliation is not None, "the run was not reconciled"
    assert reconciliation.clean, f"the run did not reconcile clean: {reconciliation}"
    assert reconciliation.scanned == len(delivered.by_uid), reconciliation
    assert reconciliation.reconciliation_failed == 0, reconciliation
    unreadable = {
        delivered.by_uid[uid_of(e)]: (e.scanned.error if e.scanned else "")
        for e in entries
        if e.scanned is not None and e.scanned.envelope is None
    }
    REPORTED["cpython email corpus through IMAP intake"] = {
        "files": len(files),
        "delivered": len(delivered.by_uid),
        "refused_by_lmtp": delivered.refused,
        "normalized": len(entries) - len(unreadable),
        "unreadable": unreadable,
        "same_occurrence_as": same_as,
        "by_disposition": reconciliation.by_disposition,
    }

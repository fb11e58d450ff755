"""MaildirProvider against real Maildirs on disk: changes and their cursors, threading, attachments,
send, finding the sent copy by its marker, health. (The port's contract: test_provider_contract.py.)"""

from __future__ import annotations

import email
import email.policy
import hashlib
import itertools
import mailbox
import os
import shutil
from datetime import UTC, datetime, timedelta
from email.message import EmailMessage
from pathlib import Path

import pytest

from agent.domain.envelope import Address, occurrence_key
from agent.domain.errors import CursorExpired, NotFound, ProviderError, Unsupported
from agent.domain.mail import (
    Channel,
    Marker,
    MarkerKind,
    OutgoingMessage,
    ProviderHealth,
    ScannedMessage,
    StoredCopy,
)
from agent.providers import mime
from agent.providers.maildir import MaildirProvider
from agent.testing import FrozenClock
from agent.testing.providers import attachment, ids, read_all

MAILBOX = "support@fabrikam.test"
CLIENT = "Dana Levi <dana.levi@contoso.test>"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def maildir_path(tmp_path: Path) -> Path:
    path = tmp_path / "Maildir"
    mailbox.Maildir(str(path), create=True)
    return path


@pytest.fixture
def box(maildir_path: Path) -> mailbox.Maildir:
    return mailbox.Maildir(str(maildir_path), create=False)


@pytest.fixture
def provider(maildir_path: Path) -> MaildirProvider:
    return MaildirProvider(maildir_path, "Support@Fabrikam.TEST")


def build(
    *,
    mid: str | None,
    subject: str = "Invoice for November",
    sender: str = CLIENT,
    to: str = MAILBOX,
    cc: str | None = None,
    date: str = "Mon, 02 Nov 2026 10:00:00 +0200",
    in_reply_to: str | None = None,
    references: str | None = None,
    text: str = "Hello, please send the invoice.",
    html: str | None = None,
) -> EmailMessage:
    msg = EmailMessage()
    msg["From"] = sender
    msg["To"] = to
    if cc is not None:
        msg["Cc"] = cc
    msg["Subject"] = subject
    msg["Date"] = date
    if mid is not None:
        msg["Message-ID"] = mid
    if in_reply_to is not None:
        msg["In-Reply-To"] = in_reply_to
    if references is not None:
        msg["References"] = references
    msg.set_content(text)
    if html is not None:
        msg.add_alternative(html, subtype="html")
    return msg


async def scan_all(provider: MaildirProvider) -> list[ScannedMessage]:
    """Every change from the start, page by page."""
    items, _ = await read_all(provider)
    return items


async def read_back(provider: MaildirProvider, mid: str) -> StoredCopy | None:
    return await provider.find_sent(Marker(kind=MarkerKind.MESSAGE_ID, value=mid))


async def threads_by_message_id(provider: MaildirProvider) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in await scan_all(provider):
        assert item.envelope is not None, item.error
        assert item.envelope.internet_message_id is not None
        out[item.envelope.internet_message_id] = item.envelope.provider_thread_id
    return out


def outgoing(
    mid: str = "<reply-1@fabrikam.test>",
    *,
    thread: str = "mt-thread",
    in_reply_to: str | None = "<client-1@contoso.test>",
    references: tuple[str, ...] = ("<client-1@contoso.test>",),
    html: str | None = "<p>Attached is the invoice.</p>",
) -> OutgoingMessage:
    return OutgoingMessage(
        provider_thread_id=thread,
        in_reply_to=in_reply_to,
        references=references,
        sender=Address(address=MAILBOX, name="Fabrikam Support"),
        to=(Address(address="dana.levi@contoso.test", name="Dana Levi"),),
        cc=(Address(address="noa.bar@fabrikam.test"),),
        subject="Re: Invoice for November",
        text="Attached is the invoice.",
        html=html,
        internet_message_id=mid,
    )


def inbox_snapshot(path: Path) -> tuple[list[str], dict[str, str]]:
    """The file names under new/ and cur/, and a hash of each file's path and bytes."""
    files = sorted(p for sub in ("new", "cur") for p in (path / sub).rglob("*") if p.is_file())
    names = [str(p.relative_to(path)) for p in files]
    hashes = {
        name: hashlib.sha256(name.encode() + b"\0" + p.read_bytes()).hexdigest()
        for name, p in zip(names, files, strict=True)
    }
    return names, hashes


# --- changes ----------------------------------------------------------------------------


@pytest.mark.anyio
async def test_scan_yields_one_scanned_message_per_file_with_envelope_fields(
    provider: MaildirProvider, box: mailbox.Maildir
) -> None:
    first_key = box.add(
        build(
            mid="<client-1@contoso.test>",
            cc="Noa Bar <noa.bar@fabrikam.test>, Other <Other@Contoso.TEST>",
        )
    )
    second_key = box.add(
        build(
            mid="<client-2@contoso.test>",
            subject="Re: Invoice for November",
            date="Tue, 03 Nov 2026 12:30:00 +0000",
            in_reply_to="<reply-1@fabrikam.test>",
            references="<client-1@contoso.test> <reply-1@fabrikam.test>",
        )
    )

    items = await scan_all(provider)

    assert sorted(item.item_ref for item in items) == sorted(
        [f"maildir:{first_key}", f"maildir:{second_key}"]
    )
    by_id = {item.item_ref: item for item in items}
    first = by_id[f"maildir:{first_key}"].envelope
    second = by_id[f"maildir:{second_key}"].envelope
    assert first is not None
    assert second is not None
    assert all(item.error is None for item in items)

    assert first.provider == "maildir"
    assert first.mailbox_id == "support@fabrikam.test"
    assert first.provider_message_id == f"maildir:{first_key}"
    assert first.body_ref == first.provider_message_id
    assert first.internet_message_id == "<client-1@contoso.test>"
    assert first.sender == Address(address="dana.levi@contoso.test", name="Dana Levi")
    assert first.to == (Address(address=MAILBOX),)
    assert [a.address for a in first.cc] == ["noa.bar@fabrikam.test", "other@contoso.test"]
    assert first.subject == "Invoice for November"
    assert first.received_at.tzinfo is not None
    assert first.received_at == datetime(2026, 11, 2, 8, 0, tzinfo=UTC)
    assert first.in_reply_to is None
    assert first.references == ()

    assert second.subject == "Re: Invoice for November"
    assert second.received_at == datetime(2026, 11, 3, 12, 30, tzinfo=UTC)
    assert second.in_reply_to == "<reply-1@fabrikam.test>"
    assert second.references == ("<client-1@contoso.test>", "<reply-1@fabrikam.test>")


@pytest.mark.anyio
async def test_scan_of_an_empty_maildir_yields_nothing(provider: MaildirProvider) -> None:
    assert await scan_all(provider) == []


@pytest.mark.anyio
async def test_scan_reads_messages_in_cur_as_well_as_new(
    provider: MaildirProvider, maildir_path: Path
) -> None:
    raw = build(mid="<seen@contoso.test>").as_bytes()
    (maildir_path / "cur" / "1790000000.seen.host:2,S").write_bytes(raw)

    items = await scan_all(provider)

    assert [item.item_ref for item in items] == ["maildir:1790000000.seen.host"]
    assert items[0].envelope is not None
    assert items[0].envelope.internet_message_id == "<seen@contoso.test>"


@pytest.mark.parametrize("name", [b"1790000000.\xff\xfe.host", b"1790000000.100%.host"])
@pytest.mark.anyio
async def test_a_file_name_that_is_not_plain_text_still_gives_a_text_reference_to_its_body(
    provider: MaildirProvider, maildir_path: Path, name: bytes
) -> None:
    raw = build(mid="<odd-name@contoso.test>", text="Odd file name.").as_bytes()
    (maildir_path / "new").joinpath(os.fsdecode(name)).write_bytes(raw)

    [item] = await scan_all(provider)

    assert item.envelope is not None
    item.item_ref.encode("utf-8")  # a store and a JSON answer can carry it
    assert "%" in item.item_ref.removeprefix("maildir")
    body = await provider.fetch_body(item.envelope.body_ref)
    assert body.text.strip() == "Odd file name."


@pytest.mark.anyio
async def test_message_without_date_falls_back_to_the_time_in_the_file_name(
    provider: MaildirProvider, maildir_path: Path
) -> None:
    msg = build(mid="<nodate@contoso.test>")
    del msg["Date"]
    (maildir_path / "new" / "1790000000.nodate.host").write_bytes(msg.as_bytes())

    [item] = await scan_all(provider)

    assert item.envelope is not None
    assert item.envelope.received_at == datetime.fromtimestamp(1790000000, UTC)


# --- capabilities, cursors and paging ---------------------------------------------------


def test_capabilities_say_what_a_local_maildir_can_do(provider: MaildirProvider) -> None:
    capabilities = provider.capabilities

    assert capabilities.channel is Channel.LOCAL
    assert capabilities.key_basis and not capabilities.native_threads
    assert capabilities.markers == (MarkerKind.MESSAGE_ID, MarkerKind.HEADER)
    assert capabilities.keeps_sent_copy
    assert capabilities.sent_copy_latency == timedelta(0)
    assert capabilities.delivers is False
    assert capabilities.page_size == 100


def test_a_marker_a_maildir_cannot_set_is_refused(maildir_path: Path) -> None:
    with pytest.raises(ValueError, match="marks its copies by"):
        MaildirProvider(maildir_path, MAILBOX, markers=(MarkerKind.NATIVE,))
    with pytest.raises(ValueError, match="marks its copies by"):
        MaildirProvider(maildir_path, MAILBOX, markers=())


@pytest.mark.anyio
async def test_a_cursor_is_a_versioned_string_and_a_damaged_one_expires(
    provider: MaildirProvider, box: mailbox.Maildir
) -> None:
    box.add(build(mid="<a@contoso.test>"))
    page = await provider.changes(None)
    version, _, body = page.cursor.partition(".")

    assert version == "maildir-v1"
    for damaged in (page.cursor[:-4], f"maildir-v0.{body}", "maildir-v1.!!", "maildir:1"):
        with pytest.raises(CursorExpired):
            await provider.changes(damaged)


@pytest.mark.anyio
async def test_a_rebuilt_maildir_expires_its_cursors_and_is_read_again_in_full(
    provider: MaildirProvider, box: mailbox.Maildir, maildir_path: Path
) -> None:
    box.add(build(mid="<a@contoso.test>"))
    _, cursor = await read_all(provider)
    old = maildir_path.with_name("old")
    maildir_path.rename(old)
    shutil.copytree(old, maildir_path)

    with pytest.raises(CursorExpired, match="rebuilt"):
        await provider.changes(cursor)
    assert ids(await scan_all(provider)) == ["<a@contoso.test>"]


@pytest.mark.anyio
async def test_mail_whose_name_sorts_before_every_read_file_is_still_read_exactly_once(
    box: mailbox.Maildir, maildir_path: Path
) -> None:
    provider = MaildirProvider(maildir_path, MAILBOX, page_size=2)
    for n in range(3):
        box.add(build(mid=f"<m{n}@contoso.test>"))
    first = await provider.changes(None)
    early = build(mid="<early@contoso.test>").as_bytes()
    (maildir_path / "new" / "0000000001.early.host").write_bytes(early)

    rest, cursor = await read_all(provider, first.cursor)

    assert len(first.items) == 2 and first.more
    assert sorted(str(m) for m in ids([*first.items, *rest])) == sorted(
        ["<early@contoso.test>", "<m0@contoso.test>", "<m1@contoso.test>", "<m2@contoso.test>"]
    )
    assert ids((await read_all(provider, cursor))[0]) == []


@pytest.mark.anyio
async def test_a_message_delivered_twice_is_two_items_of_one_occurrence(
    provider: MaildirProvider, box: mailbox.Maildir
) -> None:
    box.add(build(mid="<twice@contoso.test>"))
    box.add(build(mid="<twice@contoso.test>"))

    first, second = await scan_all(provider)

    assert first.item_ref != second.item_ref
    assert first.envelope is not None and second.envelope is not None
    assert occurrence_key("ws", first.envelope) == occurrence_key("ws", second.envelope)


# --- threading --------------------------------------------------------------------------


@pytest.mark.anyio
async def test_reply_with_in_reply_to_and_references_gets_the_parent_thread_id(
    provider: MaildirProvider, box: mailbox.Maildir
) -> None:
    box.add(build(mid="<root@contoso.test>"))
    box.add(
        build(
            mid="<reply@fabrikam.test>",
            subject="Re: Invoice for November",
            in_reply_to="<root@contoso.test>",
            references="<root@contoso.test>",
        )
    )

    threads = await threads_by_message_id(provider)

    assert threads["<reply@fabrikam.test>"] == threads["<root@contoso.test>"]
    assert threads["<root@contoso.test>"]


@pytest.mark.anyio
async def test_reply_with_only_in_reply_to_gets_the_parent_thread_id(
    provider: MaildirProvider, box: mailbox.Maildir
) -> None:
    box.add(build(mid="<root@contoso.test>"))
    box.add(build(mid="<reply@fabrikam.test>", in_reply_to="<root@contoso.test>"))

    threads = await threads_by_message_id(provider)

    assert threads["<reply@fabrikam.test>"] == threads["<root@contoso.test>"]


@pytest.mark.anyio
async def test_unrelated_message_with_the_same_subject_gets_a_different_thread_id(
    provider: MaildirProvider, box: mailbox.Maildir
) -> None:
    box.add(build(mid="<one@contoso.test>", subject="Invoice for November"))
    box.add(build(mid="<two@contoso.test>", subject="Invoice for November"))
    box.add(build(mid="<three@contoso.test>", subject="Re: Invoice for November"))

    threads = await threads_by_message_id(provider)

    assert len(set(threads.values())) == 3


@pytest.mark.anyio
async def test_a_client_answer_naming_only_our_sent_reply_joins_the_thread_through_it(
    provider: MaildirProvider, box: mailbox.Maildir
) -> None:
    box.add(build(mid="<client-1@contoso.test>"))
    await provider.send(await provider.prepare(outgoing()))  # References the client's message
    box.add(build(mid="<client-2@contoso.test>", in_reply_to="<reply-1@fabrikam.test>"))

    threads = await threads_by_message_id(provider)

    assert threads["<client-2@contoso.test>"] == threads["<client-1@contoso.test>"]


THREAD_FILES = {
    # the conversation: root, a full reply, a reply naming only its parent, a reply whose
    # References were trimmed to the middle of the conversation
    "root": build(mid="<root@contoso.test>"),
    "reply": build(
        mid="<reply@fabrikam.test>",
        in_reply_to="<root@contoso.test>",
        references="<root@contoso.test>",
    ),
    "irt-only": build(mid="<irt-only@contoso.test>", in_reply_to="<reply@fabrikam.test>"),
    "trimmed": build(
        mid="<trimmed@fabrikam.test>",
        in_reply_to="<irt-only@contoso.test>",
        references="<reply@fabrikam.test> <irt-only@contoso.test>",
    ),
    # same subject, no headers linking it: a thread of its own
    "stranger": build(mid="<stranger@contoso.test>"),
}


@pytest.mark.anyio
async def test_threading_is_the_same_whatever_order_the_files_are_listed_in(
    tmp_path: Path,
) -> None:
    results: dict[tuple[str, ...], dict[str, str]] = {}
    for number, order in enumerate(itertools.permutations(THREAD_FILES)):
        path = tmp_path / f"Maildir-{number}"
        mailbox.Maildir(str(path), create=True)
        for position, name in enumerate(order):
            # Maildir keys are listed in name order, so the names fix the listing order.
            file_name = f"{1790000000 + position}.{position:02d}-{name}.host"
            (path / "new" / file_name).write_bytes(THREAD_FILES[name].as_bytes())
        results[order] = await threads_by_message_id(MaildirProvider(path, MAILBOX))

    first = next(iter(results.values()))
    assert all(threads == first for threads in results.values())
    conversation = {
        first[mid]
        for mid in (
            "<root@contoso.test>",
            "<reply@fabrikam.test>",
            "<irt-only@contoso.test>",
            "<trimmed@fabrikam.test>",
        )
    }
    assert len(conversation) == 1
    assert first["<stranger@contoso.test>"] not in conversation


@pytest.mark.anyio
async def test_messages_without_message_id_each_get_their_own_thread(
    provider: MaildirProvider, box: mailbox.Maildir
) -> None:
    box.add(build(mid=None))
    box.add(build(mid=None))

    items = await scan_all(provider)

    threads = {item.envelope.provider_thread_id for item in items if item.envelope}
    assert len(threads) == 2


@pytest.mark.anyio
async def test_reference_cycle_does_not_hang_and_keeps_the_messages_together(
    provider: MaildirProvider, box: mailbox.Maildir
) -> None:
    box.add(build(mid="<a@contoso.test>", in_reply_to="<b@contoso.test>"))
    box.add(build(mid="<b@contoso.test>", in_reply_to="<a@contoso.test>"))

    threads = await threads_by_message_id(provider)

    assert threads["<a@contoso.test>"] == threads["<b@contoso.test>"]


# --- unreadable and dropped files -------------------------------------------------------


@pytest.mark.anyio
async def test_empty_file_yields_an_error_item_without_envelope_and_scanning_continues(
    provider: MaildirProvider, box: mailbox.Maildir, maildir_path: Path
) -> None:
    (maildir_path / "new" / "1790000000.empty.host").write_bytes(b"")
    good_key = box.add(build(mid="<good@contoso.test>"))

    items = await scan_all(provider)

    by_ref = {item.item_ref: item for item in items}
    assert set(by_ref) == {"maildir:1790000000.empty.host", f"maildir:{good_key}"}
    bad = by_ref["maildir:1790000000.empty.host"]
    assert bad.envelope is None
    assert bad.error is not None
    assert "empty" in bad.error
    good = by_ref[f"maildir:{good_key}"]
    assert good.error is None
    assert good.envelope is not None
    assert good.envelope.internet_message_id == "<good@contoso.test>"


@pytest.mark.anyio
async def test_eml_file_copied_into_new_is_picked_up(
    provider: MaildirProvider, maildir_path: Path, tmp_path: Path
) -> None:
    eml = tmp_path / "dropped.eml"
    eml.write_bytes(build(mid="<dropped@contoso.test>", subject="Dropped in").as_bytes())
    (maildir_path / "new" / "dropped.eml").write_bytes(eml.read_bytes())

    items = await scan_all(provider)

    assert [item.item_ref for item in items] == ["maildir:dropped.eml"]
    envelope = items[0].envelope
    assert envelope is not None
    assert envelope.subject == "Dropped in"
    assert envelope.internet_message_id == "<dropped@contoso.test>"
    body = await provider.fetch_body(envelope.body_ref)
    assert body.text.strip() == "Hello, please send the invoice."


# --- fetch_body -------------------------------------------------------------------------


@pytest.mark.anyio
async def test_fetch_body_returns_text_and_html_of_a_multipart_alternative_message(
    provider: MaildirProvider, box: mailbox.Maildir
) -> None:
    box.add(
        build(
            mid="<alt@contoso.test>",
            text="Plain version: שלום",
            html="<p>HTML version: <b>שלום</b></p>",
        )
    )
    [item] = await scan_all(provider)
    assert item.envelope is not None

    body = await provider.fetch_body(item.envelope.body_ref)

    assert body.text.strip() == "Plain version: שלום"
    assert body.html is not None
    assert body.html.strip() == "<p>HTML version: <b>שלום</b></p>"


@pytest.mark.anyio
async def test_fetch_body_of_a_plain_message_has_no_html(
    provider: MaildirProvider, box: mailbox.Maildir
) -> None:
    key = box.add(build(mid="<plain@contoso.test>"))

    body = await provider.fetch_body(f"maildir:{key}")

    assert body.text.strip() == "Hello, please send the invoice."
    assert body.html is None


@pytest.mark.anyio
async def test_fetch_body_of_a_vanished_message_raises_provider_error(
    provider: MaildirProvider, maildir_path: Path
) -> None:
    with pytest.raises(ProviderError, match="no longer in"):
        await provider.fetch_body("maildir:1790000000.gone.host")


@pytest.mark.anyio
async def test_fetch_body_of_a_foreign_reference_raises_provider_error(
    provider: MaildirProvider,
) -> None:
    with pytest.raises(ProviderError, match="not a Maildir message reference"):
        await provider.fetch_body("pm-1")


# --- send and find_sent -----------------------------------------------------------------


@pytest.mark.anyio
async def test_send_writes_an_rfc822_copy_into_the_sent_folder(
    provider: MaildirProvider, maildir_path: Path
) -> None:
    result = await provider.send(await provider.prepare(outgoing()))

    assert result.delivered is False
    assert result.channel == "local"
    assert result.internet_message_id == "<reply-1@fabrikam.test>"
    assert result.provider_thread_id == "mt-thread"
    assert result.provider_message_id.startswith("maildir:Sent/")
    assert result.accepted_at.tzinfo is not None

    sent = mailbox.Maildir(str(maildir_path / ".Sent"), create=False)
    [key] = list(sent.keys())
    assert result.provider_message_id == f"maildir:Sent/{key}"
    parsed = email.message_from_bytes(sent.get_bytes(key), policy=email.policy.default)
    assert isinstance(parsed, EmailMessage)
    assert parsed["Message-ID"] == "<reply-1@fabrikam.test>"
    assert parsed["In-Reply-To"] == "<client-1@contoso.test>"
    assert parsed["References"] == "<client-1@contoso.test>"
    assert parsed["Subject"] == "Re: Invoice for November"
    assert parsed["From"] == "Fabrikam Support <support@fabrikam.test>"
    assert parsed["To"] == "Dana Levi <dana.levi@contoso.test>"
    assert parsed["Cc"] == "noa.bar@fabrikam.test"
    assert parsed["Date"] is not None
    assert parsed.get_content_type() == "multipart/alternative"
    plain = parsed.get_body(preferencelist=("plain",))
    html = parsed.get_body(preferencelist=("html",))
    assert isinstance(plain, EmailMessage)
    assert isinstance(html, EmailMessage)
    assert plain.get_content().strip() == "Attached is the invoice."
    assert html.get_content().strip() == "<p>Attached is the invoice.</p>"


@pytest.mark.anyio
async def test_find_sent_finds_the_copy_by_its_message_id(provider: MaildirProvider) -> None:
    await provider.send(await provider.prepare(outgoing("<other@fabrikam.test>", html=None)))
    result = await provider.send(await provider.prepare(outgoing()))

    copy = await read_back(provider, "<reply-1@fabrikam.test>")

    assert copy is not None
    assert copy.internet_message_id == "<reply-1@fabrikam.test>"
    assert copy.provider_message_id == result.provider_message_id
    assert copy.sender == Address(address=MAILBOX, name="Fabrikam Support")
    assert copy.to == (Address(address="dana.levi@contoso.test", name="Dana Levi"),)
    assert copy.cc == (Address(address="noa.bar@fabrikam.test"),)
    assert copy.subject == "Re: Invoice for November"
    assert copy.text.strip() == "Attached is the invoice."
    assert copy.html is not None
    assert copy.html.strip() == "<p>Attached is the invoice.</p>"


@pytest.mark.anyio
async def test_the_found_copy_of_a_reply_names_the_thread_of_the_inbox_message(
    provider: MaildirProvider, box: mailbox.Maildir
) -> None:
    box.add(build(mid="<client-1@contoso.test>"))
    [item] = await scan_all(provider)
    assert item.envelope is not None
    thread = item.envelope.provider_thread_id

    await provider.send(await provider.prepare(outgoing(thread=thread)))
    copy = await read_back(provider, "<reply-1@fabrikam.test>")

    assert copy is not None
    assert copy.provider_thread_id == thread


@pytest.mark.anyio
async def test_find_sent_of_an_unknown_message_id_returns_none_and_creates_no_folder(
    provider: MaildirProvider, maildir_path: Path
) -> None:
    assert await read_back(provider, "<never-sent@fabrikam.test>") is None
    assert not (maildir_path / ".Sent").exists()

    await provider.send(await provider.prepare(outgoing()))

    assert await read_back(provider, "<never-sent@fabrikam.test>") is None


@pytest.mark.anyio
async def test_provider_never_modifies_the_inbox(
    provider: MaildirProvider, box: mailbox.Maildir, maildir_path: Path
) -> None:
    box.add(build(mid="<client-1@contoso.test>", html="<p>hi</p>"))
    box.add(build(mid="<client-2@contoso.test>", in_reply_to="<client-1@contoso.test>"))
    (maildir_path / "new" / "dropped.eml").write_bytes(build(mid="<eml@contoso.test>").as_bytes())
    (maildir_path / "new" / "1790000000.empty.host").write_bytes(b"")
    (maildir_path / "cur" / "1790000001.seen.host:2,S").write_bytes(
        build(mid="<seen@contoso.test>").as_bytes()
    )
    names_before, hashes_before = inbox_snapshot(maildir_path)

    items = await scan_all(provider)
    for item in items:
        if item.envelope is not None:
            await provider.fetch_body(item.envelope.body_ref)
    await provider.send(await provider.prepare(outgoing()))
    assert await read_back(provider, "<reply-1@fabrikam.test>") is not None
    await scan_all(provider)
    await provider.health()

    names_after, hashes_after = inbox_snapshot(maildir_path)
    assert len(items) == 5
    assert names_after == names_before
    assert hashes_after == hashes_before
    assert len(names_before) == 5


@pytest.mark.anyio
async def test_sent_copies_do_not_appear_in_the_inbox_scan(provider: MaildirProvider) -> None:
    await provider.send(await provider.prepare(outgoing()))

    assert await scan_all(provider) == []


@pytest.mark.anyio
async def test_prepare_and_send_date_the_copy_by_the_adapter_s_clock(maildir_path: Path) -> None:
    clock = FrozenClock()
    provider = MaildirProvider(maildir_path, MAILBOX, clock=clock)

    result = await provider.send(await provider.prepare(outgoing()))

    assert result.accepted_at == clock.now()
    sent = mailbox.Maildir(str(maildir_path / ".Sent"), create=False)
    [key] = list(sent.keys())
    assert b"Date: Mon, 30 Nov 2026 09:00:00 +0000" in sent.get_bytes(key)


@pytest.mark.anyio
async def test_a_header_marker_is_written_into_the_copy_and_finds_it(maildir_path: Path) -> None:
    provider = MaildirProvider(maildir_path, MAILBOX, markers=(MarkerKind.HEADER,))
    token = mime.send_token("<reply-1@fabrikam.test>")

    handover = await provider.prepare(outgoing())
    result = await provider.send(handover)

    assert handover.marker == Marker(kind=MarkerKind.HEADER, value=token)
    assert handover.marker is not None
    sent = mailbox.Maildir(str(maildir_path / ".Sent"), create=False)
    [key] = list(sent.keys())
    assert f"X-Outloop-Send: {token}\r\n".encode() in sent.get_bytes(key)
    copy = await provider.find_sent(handover.marker)
    assert copy is not None and copy.provider_message_id == result.provider_message_id
    other = Marker(kind=MarkerKind.HEADER, value=mime.send_token("<other@fabrikam.test>"))
    assert await provider.find_sent(other) is None
    with pytest.raises(Unsupported):
        await read_back(provider, "<reply-1@fabrikam.test>")


@pytest.mark.anyio
async def test_a_sent_copy_s_attachments_are_fetched_by_the_references_it_reads_back_with(
    provider: MaildirProvider,
) -> None:
    invoice = attachment("invoice.pdf", "application/pdf", b"%PDF-1.7\n\xff\x00")
    message = outgoing().model_copy(update={"attachments": (invoice,)})

    await provider.send(await provider.prepare(message))
    copy = await read_back(provider, message.internet_message_id)

    assert copy is not None
    [ref] = copy.attachments
    assert (ref.name, ref.content_type, ref.size) == ("invoice.pdf", "application/pdf", 11)
    assert ref.sha256 == invoice.ref.sha256
    fetched = await provider.fetch_attachment(ref.ref)
    assert fetched.data == invoice.data


@pytest.mark.anyio
async def test_an_attachment_reference_that_names_no_attachment_is_not_found(
    provider: MaildirProvider, box: mailbox.Maildir
) -> None:
    key = box.add(build(mid="<plain@contoso.test>"))

    for ref in (f"maildir:{key}/0", f"maildir:{key}/x", f"maildir:{key}", "maildir:gone/0"):
        with pytest.raises(NotFound):
            await provider.fetch_attachment(ref)


# --- missing Maildir and health ---------------------------------------------------------


@pytest.mark.anyio
async def test_missing_maildir_path_raises_provider_error_naming_the_path(
    tmp_path: Path,
) -> None:
    missing = tmp_path / "no-such-maildir"
    provider = MaildirProvider(missing, MAILBOX)

    with pytest.raises(ProviderError, match="no-such-maildir") as scanned:
        await scan_all(provider)
    assert str(missing) in str(scanned.value)
    with pytest.raises(ProviderError, match="no-such-maildir"):
        await provider.send(await provider.prepare(outgoing()))
    with pytest.raises(ProviderError, match="no-such-maildir"):
        await read_back(provider, "<reply-1@fabrikam.test>")
    assert not missing.exists()


@pytest.mark.anyio
async def test_health_is_ok_with_the_message_count(
    provider: MaildirProvider, box: mailbox.Maildir
) -> None:
    for n in range(3):
        box.add(build(mid=f"<m{n}@contoso.test>"))

    health = await provider.health()

    assert isinstance(health, ProviderHealth)
    assert health.ok is True
    assert health.provider == "maildir"
    assert health.mailbox_id == "support@fabrikam.test"
    assert "3 messages" in health.detail


@pytest.mark.anyio
async def test_health_is_not_ok_for_a_missing_path_and_names_it(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-maildir"

    health = await MaildirProvider(missing, MAILBOX).health()

    assert health.ok is False
    assert str(missing) in health.detail

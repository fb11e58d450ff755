"""Attachments go by reference: a reply attaches an inbound attachment of the workspace's
own mail or a file under a directory its context authorizes, the approval covers exactly
those files, a file changed since is refused, and read-back checks name, size and digest."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

import pytest

from agent.domain.errors import GateRefused, InvalidRequest
from agent.domain.mail import AttachmentData
from agent.domain.states import TaskState
from agent.services import approvals, drafts, replies, workspaces
from agent.services.attachments import read_attachments
from agent.testing import make_envelope
from tests.conftest import context_yaml
from tests.services.gates_world import APPROVER, CLIENT, MAILBOX, World, with_colleague

pytestmark = pytest.mark.anyio

SPEC = bytes(range(256)) * 8
"""The client's attachment: bytes that are no text in any charset."""
TERMS = b"%PDF-1.4 our terms\n"


@pytest.fixture
def outgoing(tmp_path: Path) -> Path:
    folder = tmp_path / "outgoing"
    folder.mkdir()
    (folder / "terms.pdf").write_bytes(TERMS)
    return folder


@pytest.fixture
def world_with_files(make_world: Callable[..., World], outgoing: Path) -> World:
    text = with_colleague(context_yaml()).replace(
        "attachments: {accepted: [pdf, docx]}",
        f"attachments: {{accepted: [pdf, docx], outgoing_dirs: ['{outgoing}']}}",
    )
    return make_world(text)


async def _request_with_spec(world: World) -> tuple[str, str]:
    """The client's request with its attachment, taken in and worked to a draft: the task
    and the attachment's reference."""
    n = next(world.numbers)  # the world's own message numbering: ids never collide
    envelope = make_envelope(
        mailbox_id=MAILBOX, message_no=n, thread_no=1, sender=CLIENT, subject="Quote request"
    )
    item = world.box.state.deliver(
        envelope, "Quote please", attachments=[("spec.bin", "application/octet-stream", SPEC)]
    )
    assert item.envelope is not None
    [ref] = item.envelope.attachment_refs
    await world.intake()
    task = world.to_draft_ready(world.only_task().task_id)
    return task.task_id, ref


async def _files(world: World, refs: list[str]) -> tuple[AttachmentData, ...]:
    context = workspaces.load_context(world.store, world.workspace_id)
    return await read_attachments(world.store, context, world.box, refs)


async def test_an_approved_reply_goes_with_its_files_and_read_back_checks_each_one(
    world_with_files: World, outgoing: Path
) -> None:
    world = world_with_files
    task_id, spec = await _request_with_spec(world)
    files = await _files(world, [spec, f"file:{outgoing / 'terms.pdf'}"])
    record, rendered = drafts.render_draft(
        world.store,
        task_id,
        "The quote and our terms are attached.",
        world.clock,
        attachments=files,
    )
    assert [(a.name, a.size, a.sha256) for a in rendered.attachments] == [
        ("spec.bin", len(SPEC), hashlib.sha256(SPEC).hexdigest()),
        ("terms.pdf", len(TERMS), hashlib.sha256(TERMS).hexdigest()),
    ]
    bare, _ = drafts.render_draft(
        world.store, task_id, "The quote and our terms are attached.", world.clock
    )
    assert bare.digest != record.digest  # an approval of one never covers the other
    request = await approvals.request_approval(
        world.store, world.box, task_id, record.draft_id, rendered, (CLIENT,), world.clock
    )
    shown = world.box.sent[-1].text
    assert "Attachment: spec.bin" in shown and "Attachment: terms.pdf" in shown
    await world.approver_replies(
        thread="a", text="Approved.", in_reply_to=request.internet_message_id
    )
    done = await replies.send_reply(
        world.store, world.box, task_id, record.draft_id, to=(CLIENT,), clock=world.clock
    )
    sent = world.box.sent[-1]
    assert [(a.ref.name, a.data) for a in sent.attachments] == [
        ("spec.bin", SPEC),
        ("terms.pdf", TERMS),
    ]
    checked = await replies.read_back(
        world.store, lambda _task: world.box, done.outcome.record, world.clock
    )
    [files_check] = [c for c in checked.report.checks if c.name == "attachments"]
    assert files_check.ok and checked.report.ok
    assert world.task(task_id).state is TaskState.CLIENT_REPLY_SENT


async def test_a_file_changed_after_the_draft_was_rendered_is_refused_and_nothing_is_sent(
    world_with_files: World, outgoing: Path
) -> None:
    world = world_with_files
    task_id, _ = await _request_with_spec(world)
    files = await _files(world, [f"file:{outgoing / 'terms.pdf'}"])
    record, rendered = drafts.render_draft(
        world.store, task_id, "Our terms are attached.", world.clock, attachments=files
    )
    request = await approvals.request_approval(
        world.store, world.box, task_id, record.draft_id, rendered, (CLIENT,), world.clock
    )
    await world.approver_replies(
        thread="a", text="Approved.", in_reply_to=request.internet_message_id
    )
    (outgoing / "terms.pdf").write_bytes(b"%PDF-1.4 other terms\n")
    before = len(world.box.sent)
    with pytest.raises(GateRefused, match=r"terms\.pdf changed since the draft was rendered"):
        await replies.send_reply(
            world.store, world.box, task_id, record.draft_id, to=(CLIENT,), clock=world.clock
        )
    assert len(world.box.sent) == before
    assert world.store.list_sends(world.workspace_id)[-1].kind != "client_reply"


async def test_only_the_workspaces_own_attachments_and_authorized_files_can_be_attached(
    world_with_files: World, outgoing: Path, tmp_path: Path
) -> None:
    world = world_with_files
    await _request_with_spec(world)
    secret = tmp_path / "elsewhere.txt"
    secret.write_text("not for clients")
    (outgoing / "link.txt").symlink_to(secret)
    refused = {
        "pm-99/0": "is not an attachment of a message of workspace",
        f"file:{secret}": "is not under a directory the workspace context authorizes",
        f"file:{outgoing / 'link.txt'}": "is not under a directory",
        f"file:{outgoing / '..' / 'elsewhere.txt'}": "is not under a directory",
        "file:outgoing/terms.pdf": "no such file",
        f"file:{outgoing}": "is not a regular file",
    }
    for ref, why in refused.items():
        with pytest.raises(InvalidRequest, match=why):
            await _files(world, [ref])
    with pytest.raises(InvalidRequest, match="named twice"):
        await _files(world, [f"file:{outgoing / 'terms.pdf'}"] * 2)
    assert APPROVER  # the approver is never asked about a draft that could not be rendered

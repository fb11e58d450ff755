"""Attachments by reference: a reply names the files it attaches, never their bytes.

A reference is either an inbound attachment's own reference (as a message's envelope gave
it) of a message on one of the workspace's tasks, or ``file:<path>`` for a file under a
directory the Workspace Context authorizes (``attachments.outgoing_dirs``). The bytes are
read by the core when the draft is rendered (its size and sha256 go into the draft, so an
approval covers exactly those files) and again when it is sent: a file that changed since
is refused. Read-back compares the stored copy's attachments with the draft's.
"""

from __future__ import annotations

import hashlib
import mimetypes
from collections.abc import Sequence
from pathlib import Path

import anyio.to_thread

from agent.domain.context import WorkspaceContext
from agent.domain.errors import GateRefused, InvalidRequest, ProviderError
from agent.domain.mail import AttachmentData, AttachmentRef
from agent.ports import MailProvider, Tasks

FILE_PREFIX = "file:"
MAX_ATTACHMENTS = 20
MAX_BYTES = 25 * 1024 * 1024
"""The most a reply attaches in all (providers refuse larger messages)."""


async def read_attachments(
    store: Tasks,
    context: WorkspaceContext,
    provider: MailProvider,
    refs: Sequence[str],
) -> tuple[AttachmentData, ...]:
    """The files ``refs`` name, read now, each with its name, type, size and sha256 (computed
    here from the bytes, never taken from a channel). Refused, reading nothing more, for a
    reference that is not the workspace's to attach."""
    if len(refs) > MAX_ATTACHMENTS:
        raise InvalidRequest(f"{len(refs)} attachments; a reply attaches at most {MAX_ATTACHMENTS}")
    if len(set(refs)) != len(refs):
        raise InvalidRequest("an attachment is named twice; name each file once")
    read: list[AttachmentData] = []
    for ref in refs:
        if ref.startswith(FILE_PREFIX):
            read.append(await _file(context, ref))
        else:
            read.append(await _inbound(store, context, provider, ref))
        if sum(a.ref.size for a in read) > MAX_BYTES:
            raise InvalidRequest(f"the attachments come to more than {MAX_BYTES} bytes")
    return tuple(read)


def unchanged(planned: Sequence[AttachmentRef], read: Sequence[AttachmentData]) -> None:
    """Refuse a send whose files are not the ones the draft was rendered (and approved) with."""
    for want, got in zip(planned, read, strict=True):
        if (want.size, want.sha256) != (got.ref.size, got.ref.sha256):
            raise GateRefused(
                f"attachment {want.name} changed since the draft was rendered (it was "
                f"{want.size} bytes, sha256 {want.sha256[:12]}); render the draft again and "
                "have the new one approved"
            )


def described(ref: str, name: str, content_type: str, data: bytes) -> AttachmentData:
    kind = content_type or mimetypes.guess_type(name)[0] or "application/octet-stream"
    described_ref = AttachmentRef(
        ref=ref,
        name=name,
        content_type=kind,
        size=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
    )
    return AttachmentData(ref=described_ref, data=data)


async def _inbound(
    store: Tasks, context: WorkspaceContext, provider: MailProvider, ref: str
) -> AttachmentData:
    owned = any(
        ref in message.attachment_refs
        for task in store.list_tasks(context.workspace_id)
        for message in task.messages
    )
    if not owned:
        raise InvalidRequest(
            f"{ref!r} is not an attachment of a message of workspace {context.workspace_id}; "
            "attach one a claimed message lists, or a file:<path> the context authorizes"
        )
    try:
        fetched = await provider.fetch_attachment(ref)
    except ProviderError as exc:
        raise InvalidRequest(f"attachment {ref!r} cannot be read now: {exc}") from exc
    return described(ref, fetched.ref.name, fetched.ref.content_type, fetched.data)


async def _file(context: WorkspaceContext, ref: str) -> AttachmentData:
    return await anyio.to_thread.run_sync(_read_file, context, ref)


def _read_file(context: WorkspaceContext, ref: str) -> AttachmentData:
    """A file under an authorized directory (links resolved first: a link out of the
    directory is refused)."""
    path = Path(ref.removeprefix(FILE_PREFIX))
    allowed = [Path(d).resolve() for d in context.attachments.outgoing_dirs]
    try:
        real = path.resolve(strict=True)
    except (OSError, RuntimeError) as exc:
        raise InvalidRequest(f"attachment {ref!r}: no such file") from exc
    if not path.is_absolute() or not any(real.is_relative_to(d) for d in allowed):
        raise InvalidRequest(
            f"attachment {ref!r} is not under a directory the workspace context authorizes "
            "(attachments.outgoing_dirs); give an absolute path under one of them"
        )
    if not real.is_file():
        raise InvalidRequest(f"attachment {ref!r} is not a regular file")
    if real.stat().st_size > MAX_BYTES:
        raise InvalidRequest(f"attachment {ref!r} is larger than {MAX_BYTES} bytes")
    return described(ref, real.name, "", real.read_bytes())

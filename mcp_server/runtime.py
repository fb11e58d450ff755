"""What the MCP server holds while it runs: the station, the clock, the providers, and the
runs intake started in this process. Built once, in the server's lifespan."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import AsyncGenerator, Generator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field

import anyio
from mcp.server.mcpserver.exceptions import ToolError
from mcp.shared.exceptions import MCPError

from agent.domain.context import MailboxBinding, WorkspaceContext
from agent.domain.errors import (
    AccessRefused,
    ContextError,
    GateRefused,
    HandoverRefused,
    InvalidRequest,
    OutloopError,
    ProviderError,
    RegistryError,
    StoreError,
    TransitionError,
    UnknownSend,
    UnknownStateError,
    UnknownTask,
    UnknownWorkspace,
)
from agent.domain.pack import Drift
from agent.domain.task import Task
from agent.ports import Clock, MailProvider
from agent.services.intake import ProviderFactory, Scan
from agent.services.internal_mail import InternalMail
from agent.services.replies import AlreadySent, SendRefused, UnfinishedSend
from agent.services.workspaces import load_context
from mcp_server.composition import Station, pack_status
from mcp_server.models import ClaimView

REFUSED = -32010
"""The JSON-RPC error code of a refusal: a gate, a policy or the task's state said no.
``data.refused`` names the kind and ``data.reasons`` lists every reason."""

MAX_RUNS = 64
"""Runs kept in memory for claim; an older run can still be reconciled from the ledger."""


@dataclass
class Runtime:
    station: Station
    clock: Clock
    provider_for: ProviderFactory
    mail: InternalMail
    runs: OrderedDict[str, Scan] = field(default_factory=OrderedDict[str, Scan])
    claimed: dict[tuple[str, str], ClaimView] = field(
        default_factory=dict[tuple[str, str], ClaimView]
    )
    failed_claims: dict[tuple[str, str], str] = field(default_factory=dict[tuple[str, str], str])
    channels: dict[tuple[str, str], tuple[MailboxBinding, MailProvider]] = field(
        default_factory=dict[tuple[str, str], tuple[MailboxBinding, MailProvider]]
    )
    """The channel each mailbox's calls go through, opened on first use and kept (an IMAP
    connection is reused); closed when the server stops."""
    retired: list[MailProvider] = field(default_factory=list[MailProvider])
    _package: tuple[tuple[int, ...] | None, Drift] | None = None

    _locks: dict[tuple[str, ...], tuple[anyio.Lock, list[int]]] = field(
        default_factory=dict[tuple[str, ...], tuple[anyio.Lock, list[int]]]
    )

    def package(self) -> Drift:
        """The installed pack against the running code, read again when the installed
        release or its manifest changes."""
        target = self.station.data_dir.pack
        try:
            st = (target / "current" / "pack.json").stat()
            key: tuple[int, ...] | None = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        except OSError:
            key = None
        if self._package is None or self._package[0] != key:
            self._package = (key, pack_status(target))
        return self._package[1]

    @asynccontextmanager
    async def serialized(self, *key: str) -> AsyncGenerator[None]:
        """Calls about one task (or one scanned item) run one at a time in this server, so
        a check and the write that depends on it are never interleaved with another call's.
        Between servers the store's constraints and row locks decide."""
        entry = self._locks.get(key)
        if entry is None:
            entry = self._locks[key] = (anyio.Lock(), [0])
        entry[1][0] += 1
        try:
            async with entry[0]:
                yield
        finally:
            entry[1][0] -= 1
            if entry[1][0] == 0:
                del self._locks[key]

    def keep_run(self, run: Scan) -> None:
        self.runs[run.run_id] = run
        while len(self.runs) > MAX_RUNS:
            oldest = next(iter(self.runs))
            # Its channels are closed when the server stops (it is never finished here).
            self.retired.extend(self.runs[oldest].providers.values())
            self.forget_run(oldest)

    def forget_run(self, run_id: str) -> None:
        """Drop a reconciled (or too old) run: its ledger in the store is the record."""
        self.runs.pop(run_id, None)
        for key in [k for k in self.claimed if k[0] == run_id]:
            del self.claimed[key]
        for key in [k for k in self.failed_claims if k[0] == run_id]:
            del self.failed_claims[key]

    def binding(self, context: WorkspaceContext, mailbox_id: str) -> MailboxBinding:
        for binding in context.mailboxes:
            if binding.mailbox_id == mailbox_id:
                return binding
        raise RegistryError(
            f"workspace {context.workspace_id} no longer binds mailbox {mailbox_id}; an operator "
            "changed its context"
        )

    def provider_for_task(self, task: Task) -> MailProvider:
        """The task's own mailbox, as the live context binds it."""
        context = load_context(self.station.store, task.workspace_id)
        return self.mailbox(task.workspace_id, self.binding(context, task.mailbox_id))

    def mailbox(self, workspace_id: str, binding: MailboxBinding) -> MailProvider:
        """The channel to a workspace's mailbox, reused across this server's calls; a binding
        the operator changed since gets a new one (the old one is closed with the server)."""
        key = (workspace_id, binding.mailbox_id)
        kept = self.channels.get(key)
        if kept is not None and kept[0] == binding:
            return kept[1]
        provider = self.provider_for(workspace_id, binding)
        if kept is not None:
            self.retired.append(kept[1])
        self.channels[key] = (binding, provider)
        return provider

    async def aclose(self) -> None:
        """Close every channel this server opened."""
        providers = [p for _, p in self.channels.values()] + self.retired
        # A run taken in and never reconciled still holds the channels it read through.
        providers += [p for run in self.runs.values() for p in run.providers.values()]
        self.channels.clear()
        self.retired.clear()
        for provider in providers:
            await provider.aclose()


def refusal(
    message: str,
    kind: str,
    reasons: list[dict[str, str | None]] | None = None,
    **extra: str,
) -> MCPError:
    return MCPError(REFUSED, message, {"refused": kind, "reasons": reasons or [], **extra})


WHAT_TO_DO: tuple[tuple[type[OutloopError], str], ...] = (
    (UnknownWorkspace, "an operator registers it with 'outloop workspace add --context FILE'"),
    (UnknownTask, "list_queue shows the workspace's open tasks"),
    (UnknownSend, "read_back takes the send_id send returned"),
    (AlreadySent, "read_back that send_id to check it"),
    (UnfinishedSend, "repeat exactly that send (or read_back its send_id later)"),
)
"""What a host does about a core error that carries data, worded for the MCP tools."""


def worded(exc: OutloopError) -> str:
    """The core's sentence, and what to do about it through this server's tools."""
    hint = next((h for kind, h in WHAT_TO_DO if isinstance(exc, kind)), None)
    return f"{exc}; {hint}" if hint else str(exc)


@contextmanager
def mapped_errors() -> Generator[None]:
    """Turn the core's errors into what the host sees: a refusal (a JSON-RPC error the host
    cannot mistake for success) or a tool error whose sentence says what to do."""
    try:
        yield
    except SendRefused as exc:
        raise refusal(
            str(exc),
            "gate",
            [
                {"blocker": r.blocker.value, "detail": r.detail, "recipient": r.recipient}
                for r in exc.gate.reasons
            ],
        ) from exc
    except AlreadySent as exc:
        raise refusal(
            worded(exc),
            "already_sent",
            send_id=exc.send.key,
            internet_message_id=exc.send.internet_message_id,
        ) from exc
    except HandoverRefused as exc:
        raise refusal(
            str(exc), "handover", [{"blocker": "handover", "detail": p} for p in exc.problems]
        ) from exc
    except UnfinishedSend as exc:
        raise refusal(worded(exc), "policy", send_id=exc.send.key) from exc
    except GateRefused as exc:
        raise refusal(str(exc), "policy") from exc
    except TransitionError as exc:
        raise refusal(str(exc), "task_state") from exc
    except (RegistryError, ContextError, UnknownStateError, InvalidRequest) as exc:
        raise ToolError(worded(exc)) from exc
    except AccessRefused as exc:
        raise refusal(
            f"the mail provider refused: {exc}; a refusal is never routed around through "
            "another channel (access_status shows each channel's state)",
            "policy",
        ) from exc
    except ProviderError as exc:
        raise ToolError(
            f"the mail provider failed: {exc}; access_status shows the mailbox's health"
        ) from exc
    except StoreError as exc:
        raise ToolError(f"the store failed: {exc}; retry the call") from exc
    except OutloopError as exc:
        raise ToolError(str(exc)) from exc

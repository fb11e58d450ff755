"""Every error Outloop raises on purpose, in one tree (where a class lives, if not here;
``replies.py`` is agent/services/replies.py):

    OutloopError
    +-- ContextError            a Workspace Context or station file is missing or invalid
    +-- TransitionError         a task state change the transition table forbids
    |   +-- CloseRefused        closing a task from a state that may never be closed
    +-- UnknownStateError       a state or disposition name that does not exist (a loud defect)
    +-- RegistryError           a lookup or registration that conflicts with the registry
    |   +-- UnknownWorkspace    no workspace with that id is registered (``workspace_id``)
    |   +-- WorkspaceExists     the workspace id is registered already (``workspace_id``)
    |   +-- UnknownTask         no task with that id (``task_id``)
    |   +-- UnknownSend         no send with that id (``send_id``)
    +-- StoreError              the store could not complete an operation
    |   +-- ClaimLost           a report from a holder that no longer holds the claim
    |   +-- SendStateConflict   a send ledger change the send's state or holder does not allow
    +-- ProviderError           a mail channel failed; adapters translate vendor errors into it
    |   +-- AuthenticationExpired   the channel's sign-in or token is no longer valid
    |   +-- SignInFailed            a managed login could not sign in (``code``, ``action``)
    |   |   +-- AuthChallengeUnresolved  the provider shows a page managed login may not pass
    |   |   +-- PasswordRefused     the provider refused the stored password (never typed again
    |   |                           by itself: retries lock the account)
    |   +-- Throttled               the provider asks us to slow down (``retry_after`` seconds)
    |   +-- TransientFailure        a failure that may pass (network, 5xx); retried with a bound
    |   |   +-- OutcomeUnknown      a send was handed over and its answer was lost
    |   +-- NotHandedOver           a send failed before the channel took it: nothing went out
    |   +-- NotFound                the message, attachment or folder is not there
    |   +-- AccessRefused           the provider or a policy refuses this (never routed around)
    |   +-- CursorExpired           the change cursor is no longer valid: resync in full
    |   +-- Unsupported             the channel cannot do this at all (its capabilities say so)
    +-- GateRefused             a send the gate or policy does not allow now
    |   +-- HandoverRefused     a channel would be handed other than the plan (``problems``)
    |   +-- UnfinishedSend      the draft's send to others is unfinished (``send``; replies.py)
    |   +-- SendRefused         the gate has blocking reasons (``gate``; replies.py)
    |   +-- AlreadySent         the draft went to these recipients already (``send``; replies.py)
    +-- InvalidRequest          a malformed request its caller can fix
    +-- PackError               a public pack that cannot be built, verified or installed
    |                           (``problems``: each names a file and line)
    +-- MailError               an internal mail call refused, with its ``code``
    |                           (agent/domain/internal_mail.py)
    +-- ServeError              a server option that cannot work (mcp_server/http.py)

Inside adapters only (translated before they leave it): ``UnparseableMessage``
(agent/providers/rfc822.py, a message the Maildir adapter records as unreadable) and
``UnsendableHeader`` (agent/providers/mime.py, a plan the hand-over check refuses).

The core's messages say what happened, in the core's words, and carry the data a front end
needs; each front end (the MCP layer's ``mapped_errors``, the CLI) adds what to run there.
"""


class OutloopError(Exception):
    """Base of every error Outloop raises on purpose."""


class ContextError(OutloopError):
    """A Workspace Context or station file is missing, unreadable or invalid."""


class TransitionError(OutloopError):
    """A task state change that the transition table does not allow."""


class CloseRefused(TransitionError):
    """Closing a task from a state in which a task may never be closed."""


class UnknownStateError(OutloopError):
    """A task state or disposition name that is not part of the lifecycle."""


class RegistryError(OutloopError):
    """A workspace registration that conflicts with what is registered."""


class UnknownWorkspace(RegistryError):
    """No workspace with this id is registered in this station."""

    def __init__(self, workspace_id: str) -> None:
        super().__init__(f"workspace {workspace_id} is not registered here")
        self.workspace_id = workspace_id


class WorkspaceExists(RegistryError):
    """A workspace with this id is registered already."""

    def __init__(self, workspace_id: str) -> None:
        super().__init__(f"workspace {workspace_id} is already registered")
        self.workspace_id = workspace_id


class MinuteTaken(RegistryError):
    """Another workspace registered the chosen schedule minute meanwhile: choose again."""


class UnknownTask(RegistryError):
    """No task has this id."""

    def __init__(self, task_id: str) -> None:
        super().__init__(f"no task {task_id!r}")
        self.task_id = task_id


class UnknownSend(RegistryError):
    """No send has this id (``detail`` says why, when the id cannot be one)."""

    def __init__(self, send_id: str, detail: str = "") -> None:
        super().__init__(f"no send {send_id!r}" + (f": {detail}" if detail else ""))
        self.send_id = send_id


class StoreError(OutloopError):
    """The store could not complete an operation."""


class ClaimLost(StoreError):
    """A report from a holder whose claim was taken over (its lease expired)."""


class SendStateConflict(StoreError):
    """A change of a ledgered send that its current state or holder does not allow (an
    attempt by a worker that no longer holds the send, settling a send that is not
    unsettled). Nothing was changed; ``key``, ``state`` and ``holder`` say what the send is
    now."""

    def __init__(self, key: str, state: str, holder: str, action: str, allowed: str) -> None:
        super().__init__(
            f"send {key} is {state} (held by {holder or 'nobody'}); {action} is allowed only "
            f"{allowed}. Nothing was changed"
        )
        self.key = key
        self.state = state
        self.holder = holder


class ProviderError(OutloopError):
    """A mail channel operation failed. Adapters raise one of the subclasses when they can
    tell which; a plain ProviderError is a failure of unknown kind (never retried)."""


class AuthenticationExpired(ProviderError):
    """The channel's sign-in, session or token is no longer valid: sign in again."""


class SignInFailed(ProviderError):
    """A managed login could not sign the channel in: the provider refused the stored
    password or codes, or showed a page the login does not know. Never retried by itself (a
    wrong password retried locks the account); ``action`` says what the operator does."""

    code = "SIGN_IN_FAILED"

    def __init__(self, message: str, action: str) -> None:
        super().__init__(f"{self.code}: {message}; {action}")
        self.action = action


class AuthChallengeUnresolved(SignInFailed):
    """The provider asks for something managed login may not do for a person (approve a
    push, register more information, unlock the account, prove the browser is not
    automated). It stops before any client data is read; ``challenge`` names the page."""

    code = "AUTH_CHALLENGE_UNRESOLVED"

    def __init__(self, message: str, action: str, challenge: str) -> None:
        super().__init__(message, action)
        self.challenge = challenge


class PasswordRefused(SignInFailed):
    """The provider refused the stored password. Managed login types it again only after an
    operator's ``outloop login`` (retries lock the account)."""


class Throttled(ProviderError):
    """The provider asks for fewer requests; ``retry_after`` is its wait in seconds, when
    it named one."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class TransientFailure(ProviderError):
    """A failure that may pass by itself (a dropped connection, a 5xx answer)."""


class OutcomeUnknown(TransientFailure):
    """A send was handed to the channel and its answer was lost: it may have gone out. It
    is settled from the sent copies, never by sending again blind."""


class NotHandedOver(ProviderError):
    """A send failed before the channel took the message (the server could not be reached,
    refused the login, the sender or every recipient): nothing went out, and the send may
    be tried again."""


class NotFound(ProviderError):
    """The message, attachment or folder named is not in the mailbox."""


class AccessRefused(ProviderError):
    """The provider, an administrator's policy or the context refuses this operation.
    Never retried and never routed around through another channel."""


class CursorExpired(ProviderError):
    """The persisted change cursor is no longer valid (expired, or the folder was rebuilt):
    the mailbox is read again in full, and occurrence keys keep that from recording
    anything twice."""


class Unsupported(ProviderError):
    """The channel cannot do this at all; its capabilities say so."""


class GateRefused(OutloopError):
    """A send the gate does not allow now; the message lists every blocking reason."""


class HandoverRefused(GateRefused):
    """What a channel was about to be handed is not exactly the planned message; nothing
    was handed over. ``problems`` says every way it differs."""

    def __init__(self, key: str, problems: tuple[str, ...]) -> None:
        super().__init__(
            f"send {key} was refused before it reached the channel: "
            + "; ".join(problems)
            + ". Nothing was sent"
        )
        self.problems = problems


class InvalidRequest(OutloopError):
    """The request itself is malformed in a way its caller can fix (not a refusal)."""


class PackError(OutloopError):
    """A public pack that cannot be built, verified or installed; ``problems`` names each
    reason at its file and line."""

    def __init__(self, problems: tuple[object, ...]) -> None:
        shown = "\n".join(f"  {p}" for p in problems)
        super().__init__(f"{len(problems)} problem(s):\n{shown}")
        self.problems = problems

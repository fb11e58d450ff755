"""Errors raised by the domain and the services built on it.

    OutloopError
    +-- ContextError            a Workspace Context or station file is missing or invalid
    +-- TransitionError         a task state change the transition table forbids
    |   +-- CloseRefused        closing a task from a state that may never be closed
    +-- UnknownStateError       a state or disposition name that does not exist (a loud defect)
    +-- RegistryError           a workspace registration that conflicts with the registry
    +-- StoreError              the store could not complete an operation
    |   +-- ClaimLost           a report from a holder that no longer holds the claim
    +-- ProviderError           a mail provider failed; adapters translate vendor errors into it
    +-- GateRefused             a send the gate or policy does not allow now
    |   +-- HandoverRefused     what a channel would be handed is not exactly the plan
    +-- InvalidRequest          a malformed request its caller can fix

Every message is a sentence that says what happened and what to do about it.
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


class StoreError(OutloopError):
    """The store could not complete an operation."""


class ClaimLost(StoreError):
    """A report from a holder whose claim was taken over (its lease expired)."""


class ProviderError(OutloopError):
    """A mail provider operation failed."""


class GateRefused(OutloopError):
    """A send the gate does not allow now; the message lists every blocking reason."""


class HandoverRefused(GateRefused):
    """What a channel was about to be handed is not exactly the planned message; nothing
    was handed over. ``problems`` says every way it differs."""

    def __init__(self, key: str, problems: tuple[str, ...]) -> None:
        super().__init__(
            f"send {key} was refused before it reached the channel: "
            + "; ".join(problems)
            + ". Nothing was sent; the message was not what the plan allows"
        )
        self.problems = problems


class InvalidRequest(OutloopError):
    """The request itself is malformed in a way its caller can fix (not a refusal)."""

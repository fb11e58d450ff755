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


class InvalidRequest(OutloopError):
    """The request itself is malformed in a way its caller can fix (not a refusal)."""

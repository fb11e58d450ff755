"""Secrets as the core sees them: opaque values named by reference.

A ``Secret`` wraps a value so that no ordinary way of turning it into text shows it: its
``repr``, ``str``, format, pydantic JSON and pickling all give ``[redacted]`` (or refuse).
Only an adapter's authentication call unwraps one, with ``reveal()``, at the moment it
hands the value to the provider; the core never calls it. The context names credentials by
``CredentialRef`` (workspace, mailbox, name), never by value.
"""

from __future__ import annotations

from typing import Any, NoReturn

from pydantic import BaseModel, ConfigDict, Field, GetCoreSchemaHandler
from pydantic_core import core_schema

REDACTED = "[redacted]"

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"


class CredentialRef(BaseModel):
    """Which secret: a workspace's mailbox's credential of one name (``password``,
    ``totp``, ``oauth_refresh_token``...)."""

    model_config = ConfigDict(frozen=True)

    workspace_id: str = Field(pattern=NAME_PATTERN)
    mailbox_id: str = Field(min_length=3, max_length=254, pattern=r"^[^\s/\\]+$")
    name: str = Field(pattern=NAME_PATTERN)

    def __str__(self) -> str:
        return f"{self.workspace_id}/{self.mailbox_id}/{self.name}"


class Secret:
    """An opaque secret value. Every text form of it is ``[redacted]``."""

    __slots__ = ("__value",)

    def __init__(self, value: str) -> None:
        if not isinstance(value, str):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise TypeError("a Secret wraps text")
        self.__value = value

    def reveal(self) -> str:
        """The value itself: for an adapter's authentication call only, at the moment it
        hands it to the provider. Never log, return or store what this gives."""
        return self.__value

    def __repr__(self) -> str:
        return f"Secret({REDACTED})"

    def __str__(self) -> str:
        return REDACTED

    def __format__(self, format_spec: str) -> str:
        return REDACTED

    def __bool__(self) -> bool:
        return bool(self.__value)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other.reveal() == self.__value

    def __hash__(self) -> int:
        return hash((Secret, self.__value))

    def __reduce__(self) -> NoReturn:
        raise TypeError("a Secret is never pickled (it would leave the vault in plain text)")

    def __getstate__(self) -> NoReturn:
        raise TypeError("a Secret is never pickled (it would leave the vault in plain text)")

    @classmethod
    def __get_pydantic_core_schema__(
        cls, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        # Two steps, so that a validation error never quotes a raw value given where a
        # Secret belongs: the first puts it away, and the second's error shows what it got.
        return core_schema.chain_schema(
            [
                core_schema.no_info_plain_validator_function(_withheld),
                core_schema.no_info_plain_validator_function(_to_secret),
            ],
            serialization=core_schema.plain_serializer_function_ser_schema(lambda _: REDACTED),
        )


class _Withheld:
    """What a validation error shows of a raw value given where a Secret belongs."""

    __slots__ = ()

    def __repr__(self) -> str:
        return REDACTED


def _withheld(value: object) -> object:
    return value if isinstance(value, Secret) else _Withheld()


def _to_secret(value: object) -> Secret:
    if isinstance(value, Secret):
        return value
    raise ValueError("a secret is read from the vault, never given as a value")

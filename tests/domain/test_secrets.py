"""A Secret shows as [redacted] in every ordinary way of turning it into text, and is never
pickled; only reveal() gives the value."""

from __future__ import annotations

import copy
import io
import json
import logging
import pickle
import traceback
from collections.abc import Callable

import pytest
from pydantic import BaseModel, ValidationError

from agent.domain.secrets import REDACTED, CredentialRef, Secret
from agent.testing.leaks import Canary, scan_text


class Login(BaseModel):
    """A model that carries a secret, as an adapter's sign-in request might."""

    ref: CredentialRef
    secret: Secret


@pytest.fixture
def canary() -> Canary:
    return Canary.plant()


@pytest.fixture
def secret(canary: Canary) -> Secret:
    return Secret(canary.value)


def login(secret: Secret) -> Login:
    ref = CredentialRef(workspace_id="ws-test-0001", mailbox_id="a@b.test", name="password")
    return Login(ref=ref, secret=secret)


TEXT_FORMS: dict[str, Callable[[Secret], str]] = {
    "repr": repr,
    "str": str,
    "f-string": lambda s: f"{s}",
    "f-string !r": lambda s: f"{s!r}",
    "format spec": lambda s: f"{s:>40}",
    "percent %s": lambda s: "%s" % s,  # noqa: UP031 - the % operator is the form tested
    "percent %r": lambda s: "%r" % (s,),  # noqa: UP031 - the % operator is the form tested
    "str.format": "{}".format,
    "in a list": lambda s: str([s]),
    "in a dict": lambda s: str({"password": s}),
    "json default=str": lambda s: json.dumps({"password": s}, default=str),
    "exception str": lambda s: str(ValueError("sign-in failed", s)),
    "exception repr": lambda s: repr(ValueError(s)),
    "model repr": lambda s: repr(login(s)),
    "model str": lambda s: str(login(s)),
    "model_dump": lambda s: str(login(s).model_dump()),
    "model_dump json mode": lambda s: json.dumps(login(s).model_dump(mode="json")),
    "model_dump_json": lambda s: login(s).model_dump_json(),
}


@pytest.mark.parametrize("form", sorted(TEXT_FORMS))
def test_every_text_form_of_a_secret_is_redacted(canary: Canary, secret: Secret, form: str) -> None:
    text = TEXT_FORMS[form](secret)
    assert REDACTED in text
    assert scan_text(canary, text, form) == []


def test_reveal_gives_the_value_itself(canary: Canary, secret: Secret) -> None:
    assert secret.reveal() == canary.value


@pytest.mark.parametrize("style", ["%s", "%r"])
def test_a_logged_secret_is_redacted(canary: Canary, secret: Secret, style: str) -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    logger = logging.getLogger("tests.domain.secret_logging")
    logger.addHandler(handler)
    try:
        logger.warning(f"signing in with {style}", secret)
        try:
            raise RuntimeError(secret)
        except RuntimeError:
            logger.exception("sign-in failed: %s", secret)
    finally:
        logger.removeHandler(handler)
    text = stream.getvalue()
    assert text.count(REDACTED) >= 3
    assert scan_text(canary, text, "the log") == []


def test_a_traceback_of_an_error_carrying_a_secret_is_redacted(
    canary: Canary, secret: Secret
) -> None:
    try:
        raise PermissionError(f"refused {secret}", secret)
    except PermissionError as exc:
        text = "".join(traceback.format_exception(exc))
    assert REDACTED in text
    assert scan_text(canary, text, "the traceback") == []


def test_json_without_a_default_refuses_a_secret(secret: Secret) -> None:
    with pytest.raises(TypeError):
        json.dumps({"password": secret})


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_a_secret_is_never_pickled(secret: Secret, protocol: int) -> None:
    with pytest.raises(TypeError, match="never pickled"):
        pickle.dumps(secret, protocol=protocol)
    with pytest.raises(TypeError, match="never pickled"):
        pickle.dumps(login(secret), protocol=protocol)


def test_a_secret_is_never_copied_through_pickling_either(secret: Secret) -> None:
    with pytest.raises(TypeError):
        copy.deepcopy(secret)


def test_a_raw_value_where_a_secret_belongs_is_refused_without_quoting_it(
    canary: Canary,
) -> None:
    ref = {"workspace_id": "ws-test-0001", "mailbox_id": "a@b.test", "name": "password"}
    with pytest.raises(ValidationError) as raised:
        Login.model_validate({"ref": ref, "secret": canary.value})
    shown = [str(raised.value), raised.value.json(), repr(raised.value.errors())]
    assert all(scan_text(canary, text, "the error") == [] for text in shown)
    with pytest.raises(ValidationError) as raised:
        Login.model_validate_json(json.dumps({"ref": ref, "secret": canary.value}))
    assert scan_text(canary, str(raised.value), "the JSON error") == []


def test_secrets_compare_by_value_without_showing_it() -> None:
    assert Secret("a") == Secret("a")
    assert Secret("a") != Secret("b")
    assert Secret("a") != "a"
    assert not Secret("")

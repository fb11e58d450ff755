"""Managed Microsoft login through the Outlook on the web adapter, against the mock sign-in
pages in headless Chromium: a logged-out browser signs itself in with the worker's password
and authenticator codes and keeps its session private; what it cannot answer stops it
before any client data, saying what the operator does."""

from __future__ import annotations

import logging
import shutil
import stat
from pathlib import Path

import pytest

from agent import events
from agent.domain.errors import AuthChallengeUnresolved, PasswordRefused, SignInFailed
from agent.testing.providers import raw_message
from managed_login.flow import Step
from managed_login.totp import STEP_SECONDS
from tests.browser_adapters.outlook_mock import CLOCK, OutlookAccount, WebClock

pytestmark = pytest.mark.anyio
MAILBOX = "worker@fabrikam.test"
STARTS_SIGNED_OUT = True
FULL = (Step.ACCOUNT, Step.PASSWORD, Step.CODE, Step.STAY_SIGNED_IN, Step.ARRIVED)


def unread(account: OutlookAccount) -> list[bool]:
    return [not m["is_read"] for m in account.stored("inbox")]


def kept_sessions(account: OutlookAccount) -> list[Path]:
    return sorted(account.state_dir.glob("*.json")) if account.state_dir.exists() else []


def logins(caplog: pytest.LogCaptureFixture) -> list[tuple[object, object]]:
    """Each login decision record so far: its outcome and reason."""
    found = [events.of(r) for r in caplog.records]
    return [(f[1]["outcome"], f[1]["reason"]) for f in found if f and f[0] == "login"]


async def test_a_logged_out_browser_signs_in_with_password_and_code_and_keeps_its_session_private(
    account: OutlookAccount, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=events.ROOT)
    report = await account.build().login()
    assert (report.account, report.signed_in, report.steps) == (MAILBOX, True, FULL)
    [state] = kept_sessions(account)
    assert stat.S_IMODE(state.stat().st_mode) == 0o600
    assert stat.S_IMODE(account.state_dir.stat().st_mode) == 0o700
    again = await account.build().login()  # another process: the kept session, nothing typed
    assert (again.signed_in, again.steps) == (False, ())
    assert logins(caplog) == [("signed_in", "managed"), ("already_signed_in", "kept_session")]


async def test_a_refused_password_is_not_retried_and_no_session_is_kept(
    account: OutlookAccount,
) -> None:
    account.deliver(raw_message(1))
    account.password = "not-the-password"
    with pytest.raises(SignInFailed) as refused:
        await account.build().changes(None)
    assert "refused the stored password" in str(refused.value)
    assert "outloop vault set" in refused.value.action
    assert not isinstance(refused.value, AuthChallengeUnresolved)
    assert kept_sessions(account) == []
    assert unread(account) == [True]
    with pytest.raises(PasswordRefused, match="does not type it again"):  # another run
        await account.build().changes(None)
    account.password = "pw-" + MAILBOX  # the operator stores the current one and logs in
    assert (await account.build().login()).steps == FULL
    await account.build().changes(None)  # runs read again, the session kept


@pytest.mark.parametrize(
    "challenge", ["approve_sign_in", "more_information_required", "account_locked"]
)
async def test_a_challenge_stops_the_login_before_client_data_and_says_what_to_do(
    account: OutlookAccount, challenge: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=events.ROOT)
    account.deliver(raw_message(1))
    account.admin.faults(web_challenge=challenge)
    with pytest.raises(AuthChallengeUnresolved) as stopped:
        await account.build().changes(None)
    assert stopped.value.challenge == challenge
    assert stopped.value.code == "AUTH_CHALLENGE_UNRESOLVED"
    assert f"--mailbox {MAILBOX} --headed" in stopped.value.action
    assert kept_sessions(account) == []
    assert unread(account) == [True]
    assert logins(caplog) == [("challenge", challenge)]


class Kept:
    """The station's kept challenges, as every process of it reads them (in memory here;
    ``agent.services.challenges`` keeps them in the store)."""

    def __init__(self) -> None:
        self.open: AuthChallengeUnresolved | None = None

    def kept(self) -> AuthChallengeUnresolved | None:
        return self.open

    def keep(self, exc: AuthChallengeUnresolved) -> None:
        self.open = exc


async def test_a_kept_challenge_stops_later_logins_without_asking_the_provider_until_resolved(
    account: OutlookAccount,
) -> None:
    account.deliver(raw_message(1))
    account.admin.faults(web_challenge="approve_sign_in")
    kept = Kept()
    with pytest.raises(AuthChallengeUnresolved):
        await account.build(challenges=kept).changes(None)
    assert kept.open is not None and kept.open.challenge == "approve_sign_in"
    account.admin.faults(web_challenge=None)  # the person approved it; nobody said so yet
    with pytest.raises(AuthChallengeUnresolved) as again:  # another run
        await account.build(challenges=kept).changes(None)
    assert again.value is kept.open  # stopped by the kept challenge: no sign-in was tried
    assert kept_sessions(account) == [] and unread(account) == [True]
    assert (await account.build(challenges=kept).login()).steps == FULL  # the operator's login
    kept.open = None  # which resolves it (outloop login records that)
    await account.build(challenges=kept).changes(None)  # runs read again


async def test_a_refused_code_is_followed_by_the_next_step_s_code(
    account: OutlookAccount,
) -> None:
    account.admin.faults(web_clock=CLOCK + 5 * STEP_SECONDS)  # the provider's clock is ahead
    report = await account.build().login()  # the wait for the next step sets both clocks
    assert report.steps == (Step.ACCOUNT, Step.PASSWORD, Step.CODE, Step.CODE,
                            Step.STAY_SIGNED_IN, Step.ARRIVED)  # fmt: skip
    assert account.clock.now >= CLOCK + STEP_SECONDS - 1


class _DriftingClock(WebClock):
    """The worker's clock drifts from the provider's, which stays where it is."""

    async def sleep(self, seconds: float) -> None:
        self.now += seconds


async def test_two_refused_codes_stop_the_login_and_name_the_clock_and_the_secret(
    account: OutlookAccount,
) -> None:
    account.clock = _DriftingClock(account.admin, CLOCK)
    account.admin.faults(web_clock=CLOCK + 5 * STEP_SECONDS)
    with pytest.raises(SignInFailed) as refused:
        await account.build().login()
    assert "two authenticator codes" in str(refused.value)
    assert "clock" in refused.value.action
    assert kept_sessions(account) == []


async def test_a_code_step_an_earlier_login_used_is_never_submitted_again(
    account: OutlookAccount,
) -> None:
    await account.build().login()
    account.admin.faults(expire_web_sessions=True)
    at = account.clock.now
    report = await account.build().login()  # same step still running: it waits for the next
    assert report.steps == FULL  # one code, accepted: not the used one first
    assert account.clock.now >= (at // STEP_SECONDS + 1) * STEP_SECONDS


async def test_a_choice_of_methods_is_answered_with_the_verification_code(
    account: OutlookAccount,
) -> None:
    account.admin.faults(web_method_choice=True)
    report = await account.build().login()
    assert report.steps == (Step.ACCOUNT, Step.PASSWORD, Step.METHOD, Step.CODE,
                            Step.STAY_SIGNED_IN, Step.ARRIVED)  # fmt: skip


async def test_a_kept_session_of_another_account_is_dropped_before_anything_is_read(
    account: OutlookAccount, tmp_path: Path
) -> None:
    other = OutlookAccount(account.admin, "other@fabrikam.test", tmp_path / "other", account.clock)
    try:
        await other.build().login()
    finally:
        await other.aclose()
    account.deliver(raw_message(1))
    account.state_dir.mkdir(mode=0o700)
    [kept] = kept_sessions(other)
    adapter = account.build()
    shutil.copy(kept, adapter.session_file)
    with pytest.raises(SignInFailed) as refused:
        await adapter.changes(None)
    assert "signed in to another account" in str(refused.value)
    assert not adapter.session_file.exists()
    assert unread(account) == [True]

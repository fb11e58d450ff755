"""Managed Google login through the Gmail web adapter, against the mock sign-in pages in
headless Chromium: a logged-out browser signs itself in with the worker's password and
authenticator codes, re-verifies the account and keeps its session private; Google's
challenges to automated browsers, a refused code and a code already used each end in the
right state, with no client data read."""

from __future__ import annotations

import shutil
import stat
from pathlib import Path

import pytest

from agent.domain.errors import AuthChallengeUnresolved, PasswordRefused, SignInFailed
from agent.testing.providers import raw_message
from managed_login.flow import Step
from managed_login.totp import STEP_SECONDS
from tests.browser_adapters.gmail_mock import GmailAccount
from tests.browser_adapters.outlook_mock import CLOCK

pytestmark = pytest.mark.anyio
MAILBOX = "worker@fabrikam.test"
ACCOUNT = GmailAccount
STARTS_SIGNED_OUT = True
FULL = (Step.ACCOUNT, Step.PASSWORD, Step.CODE, Step.ARRIVED)


def untouched(account: GmailAccount) -> list[tuple[bool, list[str]]]:
    """Each inbox message's unread flag and labels: what reading it would change."""
    return [(not m["is_read"], sorted(m["labels"])) for m in account.stored("inbox")]


def kept_sessions(account: GmailAccount) -> list[Path]:
    return sorted(account.state_dir.glob("*.json")) if account.state_dir.exists() else []


async def test_a_logged_out_browser_signs_in_to_gmail_with_password_and_code_and_keeps_its_session_private(
    account: GmailAccount,
) -> None:
    account.deliver(raw_message(1))
    before = untouched(account)
    report = await account.build().login()
    assert (report.account, report.signed_in, report.steps) == (MAILBOX, True, FULL)
    [state] = kept_sessions(account)
    assert stat.S_IMODE(state.stat().st_mode) == 0o600
    assert stat.S_IMODE(account.state_dir.stat().st_mode) == 0o700
    again = await account.build().login()  # another process: the kept session, nothing typed
    assert (again.signed_in, again.steps) == (False, ())
    page = await account.build().changes(None)
    assert [item.envelope.internet_message_id for item in page.items if item.envelope] == [
        "<c1@contoso.test>"
    ]
    assert untouched(account) == before  # read through the page, still unread


@pytest.mark.parametrize("challenge", ["insecure_browser", "verify_its_you"])
async def test_googles_challenge_to_an_automated_browser_stops_before_client_data_and_names_the_api_and_a_headed_login(
    account: GmailAccount, challenge: str
) -> None:
    account.deliver(raw_message(1))
    before = untouched(account)
    account.admin.faults(web_challenge=challenge)
    with pytest.raises(AuthChallengeUnresolved) as stopped:
        await account.build().changes(None)
    assert stopped.value.challenge == challenge
    assert stopped.value.code == "AUTH_CHALLENGE_UNRESOLVED"
    assert f"outloop connect --workspace ws-test --mailbox {MAILBOX}" in stopped.value.action
    assert f"--mailbox {MAILBOX} --headed" in stopped.value.action
    assert kept_sessions(account) == []
    assert untouched(account) == before


async def test_a_refused_password_is_not_typed_again_and_no_session_is_kept(
    account: GmailAccount,
) -> None:
    account.deliver(raw_message(1))
    before = untouched(account)
    account.password = "not-the-password"
    with pytest.raises(SignInFailed) as refused:
        await account.build().changes(None)
    assert "outloop vault set" in refused.value.action
    assert kept_sessions(account) == []
    with pytest.raises(PasswordRefused, match="does not type it again"):  # another run
        await account.build().changes(None)
    assert untouched(account) == before


async def test_a_wrong_code_is_followed_once_by_the_next_steps_code(account: GmailAccount) -> None:
    account.admin.faults(web_clock=CLOCK + 5 * STEP_SECONDS)  # Google's clock is ahead
    report = await account.build().login()  # the wait for the next step sets both clocks
    assert report.steps == (Step.ACCOUNT, Step.PASSWORD, Step.CODE, Step.CODE, Step.ARRIVED)
    assert account.clock.now >= CLOCK + STEP_SECONDS - 1


async def test_a_code_an_earlier_login_used_is_never_submitted_again(
    account: GmailAccount,
) -> None:
    await account.build().login()
    account.admin.faults(expire_web_sessions=True, web_totp_again=True)
    at = account.clock.now
    report = await account.build().login()  # same step still running: it waits for the next
    assert report.steps == FULL  # one code, accepted: not the used one first
    assert account.clock.now >= (at // STEP_SECONDS + 1) * STEP_SECONDS


async def test_another_way_to_sign_in_is_answered_with_the_authenticator(
    account: GmailAccount,
) -> None:
    account.admin.faults(web_method_choice=True)
    report = await account.build().login()
    assert report.steps == (Step.ACCOUNT, Step.PASSWORD, Step.METHOD, Step.CODE, Step.ARRIVED)


async def test_a_kept_session_of_another_google_account_is_dropped_before_anything_is_read(
    account: GmailAccount, tmp_path: Path
) -> None:
    other = GmailAccount(account.admin, "other@fabrikam.test", tmp_path / "other", account.clock)
    try:
        await other.build().login()
    finally:
        await other.aclose()
    account.deliver(raw_message(1))
    before = untouched(account)
    account.state_dir.mkdir(mode=0o700)
    [kept] = kept_sessions(other)
    adapter = account.build()
    shutil.copy(kept, adapter.session_file)
    with pytest.raises(SignInFailed) as refused:
        await adapter.changes(None)
    assert "signed in to another account" in str(refused.value)
    assert not adapter.session_file.exists()
    assert untouched(account) == before

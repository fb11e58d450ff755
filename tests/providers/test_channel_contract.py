"""The lifecycle core's contract through each adapter's channels
(agent/testing/channel_contract.py): one line per adapter, over the hooks the MailProvider
contract uses (tests/providers/test_provider_contract.py)."""

from __future__ import annotations

from typing import ClassVar

from agent.testing.channel_contract import ChannelLifecycleContract
from tests.providers import test_provider_contract as contract
from tests.providers.test_provider_contract import OnFake, OnFakeInAFile, OnMaildir

IMAP_FIRST = contract.TestFakeThroughImapWithoutNativeThreads
"""The fake read through IMAP first (no native thread ids; copies searchable at once)."""


class TestCoreOnFakeThroughItsApi(OnFake, ChannelLifecycleContract): ...


class TestCoreOnFakeThroughItsBrowser(OnFake, ChannelLifecycleContract):
    channels: ClassVar[tuple[str, ...]] = ("browser", "api", "imap")


class TestCoreOnFakeThroughImap(OnFake, ChannelLifecycleContract):
    channels, faults, cannot = IMAP_FIRST.channels, IMAP_FIRST.faults, IMAP_FIRST.cannot


class TestCoreOnFakeInAFile(OnFakeInAFile, ChannelLifecycleContract): ...


class TestCoreOnMaildir(OnMaildir, ChannelLifecycleContract): ...

"""The session's leak canary: a pytest plugin (registered in tests/conftest.py).

At session start a random canary (``agent.testing.leaks.Canary``) is planted through the
real vault (plain backend) under the session's basetemp, as the ``password`` of the test
workspace's support mailbox. While the session runs, the canary is looked for in every log
record (a handler on the root logger, at DEBUG), every test and collection report's text
(the failure, captured output and captured log), and every MCP result or error a test
routes through ``leak_watch``. After the last test, every file under basetemp is scanned
as well, except the vault's own file, which must hold it (in base64, as the plain keyring
stores it) or the scan would pass without looking where the canary lies.

A finding, or a file the scan cannot read, fails the session: exit status 1 and a "leak
canary" section saying where and in which form, never the canary itself.

The session's decision records (``agent.events``), those its processes append to the
``OUTLOOP_LOG_FILE`` it sets, and the metric labels they move are watched too
(``DecisionWatch``): every field is one a record may carry, every text value is
an id or a code (printable ASCII, no spaces: no subject, body or display name fits), none
holds the canary, and none holds a text the tests forbid (``forbid``: the red-team corpus'
hostile instructions, and the subjects, bodies and display names the MCP tests deliver).

Tests reach the planted secret only as an adapter would: ``canary_credentials`` is a
read-only ``Credentials`` holding it at ``canary_ref``.
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent import events
from agent.domain.secrets import CredentialRef, Secret
from agent.ports import Credentials
from agent.testing.leaks import Canary, Finding, ScanReport, scan_file, scan_text, scan_tree
from managed_login.vault import KeyringVault, open_vault
from mcp_server.observability import logs, metrics

PLUGIN_NAME = "leak-canary"
CANARY_REF = CredentialRef(
    workspace_id="ws-test-0001", mailbox_id="support@fabrikam.test", name="password"
)
"""Where the canary is planted: the password of the test workspace's support mailbox."""


@dataclass
class LeakWatch:
    """The planted canary, and what was found of it in texts while the session ran."""

    canary: Canary
    vault: KeyringVault
    findings: list[Finding] = field(default_factory=list[Finding])
    during: str = "the session's start"
    texts: int = 0

    def check(self, where: str, text: str | bytes) -> list[Finding]:
        """Look for the canary in ``text`` now; what was found fails the session too."""
        self.texts += 1
        found = scan_text(self.canary, text, where)
        self.findings += found
        return found

    def check_result(self, where: str, result: object) -> list[Finding]:
        """An MCP tool result, or the error a call raised: its text, repr, JSON form and
        error data."""
        texts = [str(result), repr(result)]
        dump = getattr(result, "model_dump_json", None)
        if callable(dump):
            texts.append(str(dump()))
        data = getattr(result, "data", None)
        if data is not None:
            texts.append(json.dumps(data, default=str))
        return [f for text in texts for f in self.check(where, text)]


class ReadOnlyCredentials:
    """The canary vault as an adapter sees it: ``agent.ports.Credentials``, no writes."""

    def __init__(self, vault: KeyringVault) -> None:
        self._vault = vault

    def secret(self, ref: CredentialRef) -> Secret:
        return self._vault.secret(ref)

    def has_secret(self, ref: CredentialRef) -> bool:
        return self._vault.has_secret(ref)


class WatchedClient:
    """An MCP client whose every tool result and error goes through the leak watch."""

    def __init__(self, client: Any, watch: LeakWatch) -> None:
        self._client = client
        self._watch = watch

    async def call_tool(self, name: str, arguments: dict[str, Any] | None = None) -> Any:
        try:
            result = await self._client.call_tool(name, arguments or {})
        except Exception as exc:
            self._watch.check_result(f"the MCP error of {name} in {self._watch.during}", exc)
            raise
        self._watch.check_result(f"the MCP result of {name} in {self._watch.during}", result)
        return result


CHATTY = ("markdown_it", "asyncio")
"""Libraries whose DEBUG records are a trace of their own parsing (one record per block of
every rendered draft): watched from INFO up, or the suite would spend its time formatting
them."""


class ScanningHandler(logging.Handler):
    """Formats every record (with its traceback) and looks for the canary in it."""

    def __init__(self, watch: LeakWatch) -> None:
        super().__init__(logging.DEBUG)
        self.watch = watch
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.format(record)
        except Exception:
            self.handleError(record)
            return
        where = f"a log record of {record.name} ({record.levelname}) in {self.watch.during}"
        self.watch.check(where, text)


LINE_KEYS = frozenset({"ts", "level", "logger", "event", "message", "error"})
"""What a JSON line holds besides a record's fields."""
RECORDS_FILE = "outloop-records.jsonl"
"""Under basetemp: where the session's processes append their records (OUTLOOP_LOG_FILE)."""
FORBIDDEN: set[str] = set()
"""Texts no decision record or metric label may hold (see ``forbid``)."""
_CODE = re.compile(r"[\x21-\x7e]*")


FORBIDDEN_MIN = 8
"""Shorter texts are words an id or a code may hold by chance (``second`` in
``duration_seconds``); a text with a space never fits a value at all."""


def forbid(*texts: str) -> None:
    """Texts from mail (subjects, bodies, display names, hostile instructions) that no
    decision record or metric label of the session may hold."""
    FORBIDDEN.update(t for t in texts if len(t.strip()) >= FORBIDDEN_MIN)


class DecisionWatch(logging.Handler):
    """Every decision record and (at the end) every metric label of the session."""

    def __init__(self, watch: LeakWatch) -> None:
        super().__init__(logging.DEBUG)
        self.watch = watch
        self.records = 0
        self.problems: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        found = events.of(record)
        if found is None:
            return
        self.records += 1
        event, fields = found
        where = f"a {event} record in {self.watch.during}"
        unknown = set(fields) - events.FIELDS
        if unknown:
            self.problems.append(f"{where}: fields outside agent.events.FIELDS {sorted(unknown)}")
        for name, value in fields.items():  # (the message is these; the canary is looked
            self.check_value(f"{where}, field {name}", value)  # for in it by ScanningHandler)

    def check_value(self, where: str, value: object, *, code: bool = True) -> None:
        if value is None or isinstance(value, (bool, int, float)):
            return
        text = str(value)
        if code and not _CODE.fullmatch(text):
            self.problems.append(f"{where}: {text[:80]!r} is not an id or a code")
        if not code:
            self.watch.check(where, text)
        hits = [f for f in FORBIDDEN if f in text]
        if hits:
            self.problems.append(f"{where}: holds the forbidden text {hits[0][:60]!r}")

    def check_file(self, path: Path) -> None:
        """The records other processes of the session appended to ``OUTLOOP_LOG_FILE``."""
        if not path.is_file():
            return
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            record = json.loads(line)
            event = record.get("event")
            if event is None:
                continue
            self.records += 1
            where = f"the {event} record on line {number} of {path.name}"
            extra = set(record) - events.FIELDS - LINE_KEYS
            if extra:
                self.problems.append(f"{where}: fields outside agent.events.FIELDS {sorted(extra)}")
            for name, value in record.items():
                if name not in LINE_KEYS:
                    self.check_value(f"{where}, field {name}", value)

    def check_labels(self) -> int:
        """Every label value the session's metrics carry; how many were checked."""
        checked = 0
        exposed = metrics.exposition().decode()
        for family in text_string_to_metric_families(exposed):
            for sample in family.samples:
                for name, value in sample.labels.items():
                    checked += 1
                    self.check_value(f"metric {sample.name} label {name}", value)
        return checked


class LeakCanary:
    """The plugin: plants the canary, watches the session, scans basetemp at its end."""

    def __init__(self, basetemp: Path) -> None:
        self.basetemp = basetemp
        vault = open_vault(basetemp / "leak-canary" / "vault", "plain")
        self.watch = LeakWatch(Canary.plant(), vault)
        vault.set_secret(CANARY_REF, Secret(self.watch.canary.value))
        self.handler = ScanningHandler(self.watch)
        self.decisions = DecisionWatch(self.watch)
        self.labels = 0
        self.root_level = logging.getLogger().level
        self.problems: list[str] | None = None

    def start(self) -> None:
        root = logging.getLogger()
        root.addHandler(self.handler)
        root.setLevel(logging.DEBUG)
        logging.getLogger(events.ROOT).addHandler(self.decisions)
        metrics.count_decisions()  # the session's metrics: their labels are checked at its end
        # Every process the session starts with its environment appends its records here.
        os.environ[logs.FILE_ENV] = str(self.basetemp / RECORDS_FILE)
        for name in CHATTY:  # their debug records trace parsing steps and carry no mail data
            logging.getLogger(name).setLevel(logging.INFO)

    def stop(self) -> None:
        root = logging.getLogger()
        root.removeHandler(self.handler)
        root.setLevel(self.root_level)
        logging.getLogger(events.ROOT).removeHandler(self.decisions)
        for name in CHATTY:
            logging.getLogger(name).setLevel(logging.NOTSET)

    def pytest_runtest_logstart(self, nodeid: str) -> None:
        self.watch.during = nodeid

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self._check_report(report, f"the {report.when} report of {report.nodeid}")

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        self._check_report(report, f"the collection report of {report.nodeid or 'the session'}")

    def _check_report(self, report: pytest.TestReport | pytest.CollectReport, where: str) -> None:
        self.watch.check(where, report.longreprtext)
        for title, content in report.sections:
            self.watch.check(f"{where} ({title})", content)

    @pytest.hookimpl(tryfirst=True)  # before anything tidies basetemp away
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        self.stop()
        self.watch.during = "the session's end"
        report = self.scan()
        self.labels = self.decisions.check_labels()
        self.decisions.check_file(self.basetemp / RECORDS_FILE)
        self.problems = report.lines() + self.decisions.problems[:50]
        if self.problems and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def scan(self) -> ScanReport:
        """Every file under basetemp but the vault's, the texts seen, and the vault's file."""
        canary, vault = self.watch.canary, self.watch.vault
        report = scan_tree(canary, self.basetemp, skip=[vault.keyring_file])
        report.findings += self.watch.findings
        try:
            held = {f.form for f in scan_file(canary, vault.keyring_file)}
        except OSError as exc:
            report.unreadable.append(f"{vault.keyring_file} ({exc.strerror})")
            return report
        if "base64" not in held or vault.secret(CANARY_REF).reveal() != canary.value:
            report.findings.append(Finding(str(vault.keyring_file), "missing from the vault"))
        return report

    def pytest_terminal_summary(self, terminalreporter: Any, config: pytest.Config) -> None:
        if self.problems is None:
            return
        if self.problems:
            terminalreporter.section("leak canary", red=True)
            terminalreporter.write_line(
                "the session's canary secret, or text from mail, was found where it must not "
                "be (this fails the session):"
            )
            for line in self.problems:
                terminalreporter.write_line(f"  {line}")
        elif config.option.verbose > 0:
            terminalreporter.write_line(
                f"leak canary: held by the vault's file only ({self.watch.texts} texts and "
                f"every file under {self.basetemp} scanned); {self.decisions.records} decision "
                f"records and {self.labels} metric labels hold ids and codes only"
            )


def pytest_sessionstart(session: pytest.Session) -> None:
    factory = getattr(session.config, "_tmp_path_factory", None)
    if not isinstance(factory, pytest.TempPathFactory):
        return  # no tmp_path plugin: no basetemp to plant in or scan
    plugin = LeakCanary(factory.getbasetemp())
    session.config.pluginmanager.register(plugin, PLUGIN_NAME)
    plugin.start()


def _plugin(config: pytest.Config) -> LeakCanary:
    plugin = config.pluginmanager.get_plugin(PLUGIN_NAME)
    assert isinstance(plugin, LeakCanary), "the leak canary plugin is not running"
    return plugin


@pytest.fixture(scope="session")
def canary_ref() -> CredentialRef:
    """Where the session's canary is planted."""
    return CANARY_REF


@pytest.fixture(scope="session")
def canary_credentials(request: pytest.FixtureRequest) -> Credentials:
    """The vault holding the session's canary at ``canary_ref``, read-only."""
    return ReadOnlyCredentials(_plugin(request.config).watch.vault)


@pytest.fixture
def leak_watch(request: pytest.FixtureRequest) -> LeakWatch:
    """The session's leak watch: route texts and MCP results through ``check`` and
    ``check_result`` (or wrap a client in ``WatchedClient``)."""
    return _plugin(request.config).watch

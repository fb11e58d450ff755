"""``outloop console``: served on loopback with its URL printed, refused off loopback
without TLS; passwords and sign-in links only for console identities."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path

from click.testing import CliRunner

from mcp_server.cli import main
from tests.services.gates_world import APPROVER, CLIENT
from tests.test_schedule_cli import Station


def env_of(station: Station) -> dict[str, str]:
    return {**station.env, "OUTLOOP_VAULT_BACKEND": "plain"}


def test_the_console_refuses_to_listen_off_loopback_without_tls(tmp_path: Path) -> None:
    done = CliRunner().invoke(main, ["console", "--host", "0.0.0.0"], env=env_of(Station(tmp_path)))
    assert done.exit_code == 2 and "--tls-cert and --tls-key" in done.output


def test_passwords_and_links_are_only_for_console_identities(tmp_path: Path) -> None:
    station = Station(tmp_path)
    station.add()
    run = CliRunner()
    refused = run.invoke(
        main,
        ["console", "password", CLIENT, "--stdin"],
        input="long enough password\n",
        env=env_of(station),
    )
    assert refused.exit_code == 1 and "not a console identity" in refused.stderr
    short = run.invoke(
        main, ["console", "password", APPROVER, "--stdin"], input="short\n", env=env_of(station)
    )
    assert short.exit_code == 1 and "at least 12 characters" in short.stderr
    done = run.invoke(
        main,
        ["console", "password", APPROVER, "--stdin"],
        input="long enough password\n",
        env=env_of(station),
    )
    assert done.exit_code == 0, done.output
    stored = [p.read_bytes() for p in station.root.rglob("*") if p.is_file()]
    assert stored and not any(b"long enough password" in data for data in stored)
    link = run.invoke(
        main, ["console", "invite", APPROVER, "--url", "http://127.0.0.1:9/"], env=env_of(station)
    )
    assert link.exit_code == 0 and link.stdout.startswith("http://127.0.0.1:9/signin/link?address=")


def test_the_console_serves_on_loopback_and_prints_its_url(tmp_path: Path) -> None:
    station = Station(tmp_path)
    station.add()
    with subprocess.Popen(
        [sys.executable, "-m", "mcp_server.cli", "console", "--port", "0"],
        env=env_of(station), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    ) as proc:  # fmt: skip
        try:
            assert proc.stdout is not None
            url = json.loads(proc.stdout.readline())["url"]
            assert url.startswith("http://127.0.0.1:")
            with urllib.request.urlopen(url + "signin", timeout=10) as page:
                assert page.status == 200
                assert "default-src 'none'" in page.headers["Content-Security-Policy"]
        finally:
            proc.terminate()
            proc.wait(timeout=10)

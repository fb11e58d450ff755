"""The probes and the health command against real processes and a real PostgreSQL server:
/readyz turns unready while PostgreSQL is stopped and ready again once it is back; a
dispatcher standing by reports that and is ready; several processes on one host sharing a
metrics directory are summed by any one that serves /metrics; ``outloop health --json``
names each problem (a send waiting on a person, a challenge, no clean run)."""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from agent.domain.errors import AuthChallengeUnresolved
from agent.domain.records import SendIntent
from agent.services import challenges
from bench.pg_cluster import ThrowawayCluster
from mcp_server.cli import main
from tests.conftest import wait_for
from tests.test_crash import FORKSERVER, WS, Worker, World

TOKEN = secrets.token_urlsafe(32)
BEARER = {"Authorization": f"Bearer {TOKEN}"}


def metrics_base(stderr: Path) -> str:
    """The probe server's address, from the JSON line its process wrote on stderr."""

    def line() -> dict[str, Any] | None:
        for text in stderr.read_text(errors="replace").splitlines():
            if text.startswith('{"metrics"'):
                return json.loads(text)
        return None

    wait_for(lambda: line() is not None, f"the metrics line in {stderr}", 60)
    found = line()
    assert found is not None
    return str(found["metrics"]).removesuffix("/metrics")


def readyz(base: str) -> tuple[int, dict[str, Any]]:
    answer = httpx.get(f"{base}/readyz", headers=BEARER, timeout=30)
    return answer.status_code, answer.json()


def dispatcher(world: World, tag: str, **env: str) -> Worker:
    argv = ["dispatch", "--workspace", WS, "--poll", "0.1", "--lease-seconds", "30",
            "--metrics-port", "0", "--data-dir", str(world.data_dir.root)]  # fmt: skip
    environment = {**world.worker_env(), "OUTLOOP_METRICS_TOKEN": TOKEN, **env}
    FORKSERVER.set_forkserver_preload(["tests.test_crash"])  # the CLI imported once, there
    return Worker(argv, environment, world.root / "stderr" / f"dispatcher-{tag}.log")


@contextmanager
def running(*workers: Worker) -> Iterator[None]:
    try:
        yield
    finally:
        for worker in workers:
            worker.kill()


def test_a_dispatcher_standing_by_is_ready_and_says_it_stands_by(tmp_path: Path) -> None:
    world = World(tmp_path)
    first = dispatcher(world, "a")
    with running(first):
        first_base = metrics_base(first.stderr)
        wait_for(lambda: readyz(first_base)[1].get("role", "").startswith("active"), "active")
        second = dispatcher(world, "b")
        with running(second):
            second_base = metrics_base(second.stderr)
            wait_for(lambda: "standby" in readyz(second_base)[1].get("role", ""), "standby")
            code, body = readyz(second_base)
            assert code == 200 and body["status"] == "ready", body
            assert f"pid {first.pid}" in body["role"]  # who holds the lease
            assert "problems" not in body
            exposed = httpx.get(f"{second_base}/metrics", headers=BEARER, timeout=30).text
            roles = {
                s.labels["role"]: s.value
                for f in text_string_to_metric_families(exposed)
                for s in f.samples
                if s.name == "outloop_dispatcher_role"
            }
            assert roles == {"standby": 1.0}


def test_readyz_is_unready_while_postgresql_is_stopped_and_ready_once_it_is_back(
    tmp_path: Path,
) -> None:
    with ThrowawayCluster(max_connections=20) as cluster:
        world = World(tmp_path, database_url=cluster.url)
        worker = dispatcher(world, "pg")
        with running(worker):
            base = metrics_base(worker.stderr)
            wait_for(lambda: readyz(base)[0] == 200, "ready with the server up")
            cluster.stop()
            code, body = readyz(base)
            assert code == 503 and body["status"] == "unready", body
            assert body["store"] == "unreachable"
            assert any("PostgreSQL" in p for p in body["problems"]), body
            health = httpx.get(f"{base}/healthz", headers=BEARER, timeout=30)
            assert health.status_code == 200  # the process itself is up
            metrics = httpx.get(f"{base}/metrics", headers=BEARER, timeout=30)
            assert "outloop_store_up 0.0" in metrics.text
            cluster.start()
            wait_for(lambda: readyz(base)[0] == 200, "ready again with the server back")
            assert readyz(base)[1]["store"] == "answers"
            assert worker.poll() is None, worker.stderr.read_text()


def _cli(world: World, *argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mcp_server.cli", *argv, "--data-dir", str(world.data_dir.root)],
        capture_output=True, text=True, timeout=120, check=False,
        env={**world.worker_env(), **env},
    )  # fmt: skip


def test_processes_sharing_a_metrics_directory_are_summed_by_the_one_that_serves(
    tmp_path: Path,
) -> None:
    world = World(tmp_path)
    shared = tmp_path / "metrics"
    shared.mkdir()
    env = {"PROMETHEUS_MULTIPROC_DIR": str(shared)}
    world.deliver(new_threads=2, follow_ups=0)
    assert _cli(world, "run", "--workspace", WS, "--once", "--quiet", **env).returncode == 0
    world.deliver(new_threads=1, follow_ups=1)
    assert _cli(world, "run", "--workspace", WS, "--once", "--quiet", **env).returncode == 0
    assert len(list(shared.glob("*.db"))) >= 2  # each process wrote its own values
    server = dispatcher(world, "serving", **env)
    with running(server):
        exposed = httpx.get(f"{metrics_base(server.stderr)}/metrics", headers=BEARER, timeout=30)
    claims = sum(
        s.value
        for f in text_string_to_metric_families(exposed.text)
        for s in f.samples
        if s.name == "outloop_claims_total" and s.labels.get("outcome") == "CLAIMED"
    )
    assert claims == 4  # 2 by the first process, 2 by the second, none by the server


def test_a_probe_server_is_refused_without_a_token(tmp_path: Path) -> None:
    world = World(tmp_path)
    no_token = _cli(world, "serve", "--transport", "http", "--metrics-port", "0",
                    OUTLOOP_MCP_TOKEN=TOKEN)  # fmt: skip
    assert no_token.returncode == 1
    assert "requires a bearer token: set OUTLOOP_METRICS_TOKEN" in no_token.stderr


def test_health_names_each_problem_with_what_clears_it(tmp_path: Path) -> None:
    world = World(tmp_path)
    runner = CliRunner()
    env = {**world.worker_env()}

    def health() -> tuple[int, dict[str, Any]]:
        done = runner.invoke(
            main, ["health", "--json", "--data-dir", str(world.data_dir.root)], env=env
        )
        return done.exit_code, json.loads(done.output)

    code, report = health()  # registered just now: no scheduled run missed yet
    assert (code, report["status"], report["store"], report["problems"]) == (0, "ok", "answers", [])
    [ws] = report["workspaces"]
    assert ws["last_clean_run_at"] is None and ws["missed_runs"] == 0

    world.deliver(new_threads=1, follow_ups=0)
    assert _cli(world, "run", "--workspace", WS, "--once", "--quiet").returncode == 0
    code, report = health()
    assert (code, report["status"], report["problems"]) == (0, "ok", []), report
    assert sum(report["workspaces"][0]["open_tasks"].values()) == 1
    assert report["workspaces"][0]["last_clean_run_at"] is not None

    store = world.store()
    try:
        now = datetime.now(UTC)
        intent = SendIntent(key="send-held-1", workspace_id=WS, kind="client_reply",
                            task_id=None, internet_message_id="<held-1@fabrikam.test>",
                            recipients=("dana.levi@contoso.test",), automated=False)  # fmt: skip
        store.begin_send(intent, now)
        store.hand_to_person("send-held-1", "no sent copy to settle from", now)
        met = AuthChallengeUnresolved(
            "push approval asked", "approve it on the phone", "push_approval"
        )
        challenges.keep(store, WS, "support@fabrikam.test", "browser", met, now)
    finally:
        store.close()
    code, report = health()
    assert code == 1 and report["status"] == "problems"
    [sends, challenge] = report["problems"]
    assert "1 send(s) WITH_PERSON" in sends and "outloop sends settle" in sends
    assert (
        "AUTH_CHALLENGE_UNRESOLVED on support@fabrikam.test (browser, push_approval)" in challenge
    )
    assert "approve it on the phone" in challenge
    assert report["workspaces"][0]["unresolved_challenges"] == 1

    nowhere = tmp_path / "no-station"
    missing = runner.invoke(main, ["health", "--json", "--data-dir", str(nowhere)], env=env)
    assert missing.exit_code == 2 and json.loads(missing.output)["store"] == "unreachable"
    assert f"no store at {nowhere}" in json.loads(missing.output)["problems"][0]
    assert not nowhere.exists()  # a wrong --data-dir creates nothing
    unknown = runner.invoke(main, ["health", "--json", "--workspace", "ws-nope",
                                   "--data-dir", str(world.data_dir.root)], env=env)  # fmt: skip
    assert (
        unknown.exit_code == 3
        and "ws-nope is not registered" in json.loads(unknown.output)["error"]
    )
    gone = runner.invoke(main, ["health", "--json", "--data-dir", str(world.data_dir.root)],
                         env={**env, "OUTLOOP_DATABASE_URL": "postgresql://outloop@127.0.0.1:1/x"})  # fmt: skip
    assert gone.exit_code == 2
    assert json.loads(gone.output)["store"] == "unreachable"

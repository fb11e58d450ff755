"""What the intake coverage tests share (over Dovecot and over the mock providers' APIs):
runs of intake over channels, and the check that every message the mail system shows was
recorded exactly once."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from agent.domain.execution import ClaimOutcome
from agent.ports import EmbeddedStore, MailProvider
from agent.services import intake, workspaces
from agent.testing import FrozenClock
from tests.conftest import REPORTED, run_intake


async def runs(
    store: EmbeddedStore,
    data_dir: workspaces.DataDir,
    workspace: str,
    channels: Sequence[MailProvider],
) -> list[intake.RunResult]:
    """One intake cycle through each channel in turn (each closed after its run)."""
    clock = FrozenClock()
    results: list[intake.RunResult] = []
    for channel in channels:
        results.append(await run_intake(store, data_dir, workspace, clock, channel))
        await channel.aclose()
    return results


def check(
    label: str,
    shown: Sequence[str],
    delivered: int,
    results: list[intake.RunResult],
    gaps: int = 0,
    *,
    shows: str = "server_shows",
) -> None:
    """Every message the mail system ``shown`` was claimed once, into a task of its own;
    every run reconciled clean; ``gaps`` runs met a mailbox they could not read. Reported
    under ``label`` (what the mail system shows against what was recorded)."""
    claimed = Counter(
        item.item_ref for r in results for item in r.items if item.claim is ClaimOutcome.CLAIMED
    )
    tasks = Counter(
        item.task_id for r in results for item in r.items if item.claim is ClaimOutcome.CLAIMED
    )
    REPORTED[label] = {
        shows: len(shown),
        "claimed": sum(claimed.values()),
        "items_seen": sum(len(r.items) for r in results),
        "runs": len(results),
    }
    assert len(shown) == delivered, "the mail system lost or doubled mail"
    assert sum(claimed.values()) == len(shown), (len(shown), claimed)
    assert len(tasks) == len(shown) and set(tasks.values()) == {1}
    assert sum(len(r.access_errors) for r in results) == gaps
    for result in results:
        assert result.item_errors == []
        assert result.reconciliation is not None and result.reconciliation.clean

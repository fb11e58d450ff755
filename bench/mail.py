"""``outloop bench mail``: internal messages sent and delivered per second by several
sending processes into one mailbox, against bare atomic writes (temporary file, fsync,
rename) of the same bytes by the same number of processes, in the same run.

Every process is started, set up, and then released at once; the rate is messages over the
wall time from the release to the last process's end. After the product's run the receiving
inbox is read back whole: every message must be there once (``lost`` and ``duplicates``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent.domain.internal_mail import StoredMail
from agent.services.clock import SystemClock
from agent.services.internal_mail import Identity, InternalMail, MailNetwork
from agent.storage import mailfiles

TARGET = "hub"
REASONING = "bench: one message of many"


def body(sender: str, n: int) -> str:
    return f"{sender} message {n:06d}: " + "status update, nothing to do " * 4


def _record_bytes(sender: str, n: int) -> bytes:
    """The bytes the product writes for one message (the baseline writes exactly these)."""
    record = StoredMail.model_validate(
        {
            "uid": "0" * 32,
            "from": sender,
            "sender_name": sender,
            "to": [TARGET],
            "message": body(sender, n),
            "sent_at": SystemClock().now(),
        }
    )
    return mailfiles.dump(record.model_dump(mode="json", by_alias=True))


def setup(root: Path, senders: int) -> MailNetwork:
    network = MailNetwork.of_data_dir(root, SystemClock())
    hub = network.register(TARGET, "operator", "Hub")
    network.set_presence(hub, True)  # reachable for the whole run, however long it takes
    for index in range(senders):
        network.register(f"sender-{index}", "agent", f"Sender {index}")
    return network


# -- one worker process -------------------------------------------------------------------------


def _product(root: Path, sender: str, count: int) -> Callable[[int], None]:
    mail = InternalMail(MailNetwork.of_data_dir(root, SystemClock()), Identity(sender))
    mail.ensure_mailbox()

    def one(n: int) -> None:
        mail.call(
            {
                "action": "send",
                "input": {"address": TARGET, "message": body(sender, n)},
                "reasoning": REASONING,
            }
        )

    return one


def _baseline(root: Path, sender: str, count: int) -> Callable[[int], None]:
    folder = root / "baseline"
    folder.mkdir(parents=True, exist_ok=True)
    payloads = [_record_bytes(sender, n) for n in range(count)]

    def one(n: int) -> None:
        path = folder / f"{sender}-{n:06d}.json"
        tmp = path.with_name(f".tmp-{path.name}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, payloads[n])
            os.fsync(fd)
        finally:
            os.close(fd)
        tmp.replace(path)

    return one


def worker(root: Path, sender: str, count: int) -> None:
    """Set up both ways of writing, say ready, then run each command the parent sends
    (``<mode> <first> <last>``: write messages first..last-1 that way) and print its
    timings, until the input ends."""
    ways = {"product": _product(root, sender, count), "baseline": _baseline(root, sender, count)}
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    for line in sys.stdin:
        mode, first, last = line.split()
        one = ways[mode]
        latencies: list[float] = []
        start = time.time()
        for n in range(int(first), int(last)):
            began = time.perf_counter()
            one(n)
            latencies.append(time.perf_counter() - began)
        timings = {"start": start, "end": time.time(), "latencies": latencies}
        sys.stdout.write(json.dumps(timings) + "\n")
        sys.stdout.flush()


# -- the parent ------------------------------------------------------------------------------------


class Workers:
    """The sending processes, started once and driven round by round."""

    def __init__(self, root: Path, senders: int, count: int) -> None:
        self.procs = [
            subprocess.Popen(
                [sys.executable, "-m", "bench.mail", str(root), f"sender-{i}", str(count)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            for i in range(senders)
        ]
        for proc in self.procs:
            assert proc.stdout is not None
            if proc.stdout.readline().strip() != "ready":
                raise RuntimeError(f"bench mail worker failed to start ({proc.wait()})")

    def start(self, mode: str, first: int, last: int) -> None:
        """Release every worker at once (the disk synced first, so no round pays for the
        write-back of the one before)."""
        os.sync()
        for proc in self.procs:
            assert proc.stdin is not None
            proc.stdin.write(f"{mode} {first} {last}\n")
            proc.stdin.flush()

    def results(self) -> tuple[float, list[float]]:
        """(wall seconds from the first start to the last end, every latency)."""
        results: list[dict[str, Any]] = []
        for proc in self.procs:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if not line:
                raise RuntimeError(f"bench mail worker failed ({proc.wait()})")
            results.append(json.loads(line))
        elapsed = max(r["end"] for r in results) - min(r["start"] for r in results)
        return elapsed, [x for r in results for x in r["latencies"]]

    def round(self, mode: str, first: int, last: int) -> tuple[float, list[float]]:
        self.start(mode, first, last)
        return self.results()

    def close(self, *, expect_killed: int = 0) -> list[int]:
        """End every worker (its input closes) and return their exit codes; a code other
        than 0 fails, unless the caller killed that many on purpose."""
        for proc in self.procs:
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.close()
            proc.wait(timeout=120)
            proc.stdout.close()
        codes = [proc.returncode for proc in self.procs]
        if sum(1 for c in codes if c != 0) > expect_killed:
            raise RuntimeError(f"bench mail worker failed ({codes})")
        return codes


def race(root: Path, senders: int, count: int, rounds: int = 4) -> dict[str, Any]:
    """Baseline and product in alternating rounds by the same processes (a disk whose pace
    drifts during the run affects both alike): each side's rate over its own rounds."""
    workers = Workers(root, senders, count)
    seconds = {"baseline": 0.0, "product": 0.0}
    latencies: list[float] = []
    try:
        for r in range(rounds):
            first, last = count * r // rounds, count * (r + 1) // rounds
            for mode in ("baseline", "product"):
                elapsed, lat = workers.round(mode, first, last)
                seconds[mode] += elapsed
                latencies += lat if mode == "product" else []
    finally:
        workers.close()
    return {
        "rate": senders * count / seconds["product"],
        "baseline": senders * count / seconds["baseline"],
        "latencies": latencies,
    }


def tally(network: MailNetwork, senders: int, count: int) -> dict[str, int]:
    """Read the receiving inbox back: every message once, whole."""
    inbox = network.box(TARGET).folder("inbox")
    seen: dict[str, int] = {}
    corrupt = 0
    for name in mailfiles.names(inbox):
        try:
            mail = StoredMail.model_validate_json((inbox / f"{name}.json").read_bytes())
        except ValueError:
            corrupt += 1
            continue
        seen[mail.message] = seen.get(mail.message, 0) + 1
    expected = {body(f"sender-{i}", n) for i in range(senders) for n in range(count)}
    return {
        "delivered": sum(seen.values()),
        "duplicates": sum(c - 1 for c in seen.values()),
        "lost": len(expected - set(seen)),
        "corrupt": corrupt,
    }


def run(
    root: Path, *, senders: int = 8, count: int = 1000, progress: Callable[[str], None]
) -> dict[str, Any]:
    network = setup(root, senders)
    progress(
        f"{senders} processes x {count} messages into one mailbox, in rounds alternating with "
        "bare atomic writes (tmp, fsync, rename) of the same bytes"
    )
    measured = race(root, senders, count)
    counts = tally(network, senders, count)
    cuts = statistics.quantiles(measured["latencies"], n=100)
    return {
        "bench": "mail",
        "rate_per_s": round(measured["rate"], 1),
        "baseline_per_s": round(measured["baseline"], 1),
        "ratio": round(measured["rate"] / measured["baseline"], 3),
        "p50_ms": round(cuts[49] * 1000, 3),
        "p99_ms": round(cuts[98] * 1000, 3),
        "processes": senders,
        "messages": senders * count,
        **counts,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description="one bench mail worker process")
    parser.add_argument("root", type=Path)
    parser.add_argument("sender")
    parser.add_argument("count", type=int)
    args = parser.parse_args()
    worker(args.root, args.sender, args.count)


if __name__ == "__main__":
    main()

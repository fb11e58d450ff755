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
    record = StoredMail.model_validate({
        "uid": "0" * 32, "from": sender, "sender_name": sender, "to": [TARGET],
        "message": body(sender, n), "sent_at": SystemClock().now(),
    })
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
        mail.call({"action": "send", "input": {"address": TARGET, "message": body(sender, n)},
                   "reasoning": REASONING})

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


def worker(mode: str, root: Path, sender: str, count: int) -> None:
    """Set up, say ready, wait for the start line, send ``count`` messages, print timings."""
    one = (_product if mode == "product" else _baseline)(root, sender, count)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    if not sys.stdin.readline():
        raise SystemExit("bench worker: the parent went away before the start")
    latencies: list[float] = []
    start = time.time()
    for n in range(count):
        began = time.perf_counter()
        one(n)
        latencies.append(time.perf_counter() - began)
    timings = {"start": start, "end": time.time(), "latencies": latencies}
    sys.stdout.write(json.dumps(timings) + "\n")
    sys.stdout.flush()


# -- the parent ------------------------------------------------------------------------------------


def _spawn(mode: str, root: Path, senders: int, count: int) -> list[subprocess.Popen[str]]:
    return [
        subprocess.Popen(
            [sys.executable, "-m", "bench.mail", mode, str(root), f"sender-{i}", str(count)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(senders)
    ]


def race(mode: str, root: Path, senders: int, count: int) -> tuple[float, list[float]]:
    """Run ``senders`` processes of ``mode`` released together: (rate, latencies). The
    disk is synced first, so no phase pays for the write-back of the one before."""
    procs = _spawn(mode, root, senders, count)
    for proc in procs:
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != "ready":
            raise RuntimeError(f"bench {mode} worker failed to start ({proc.wait()})")
    os.sync()
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    results: list[dict[str, Any]] = []
    for proc in procs:
        out, _ = proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"bench {mode} worker failed ({proc.returncode})")
        results.append(json.loads(out.strip().splitlines()[-1]))
    elapsed = max(r["end"] for r in results) - min(r["start"] for r in results)
    latencies = [x for r in results for x in r["latencies"]]
    return senders * count / elapsed, latencies


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
    progress(f"baseline: {senders} processes x {count} atomic writes (tmp, fsync, rename)")
    before, _ = race("baseline", root / "before", senders, count)
    progress(f"product: {senders} processes x {count} internal messages into one mailbox")
    rate, latencies = race("product", root, senders, count)
    progress("baseline again (the disk's pace drifts: the baseline is the mean of both)")
    after, _ = race("baseline", root / "after", senders, count)
    baseline = (before + after) / 2
    counts = tally(network, senders, count)
    cuts = statistics.quantiles(latencies, n=100)
    return {
        "bench": "mail",
        "rate_per_s": round(rate, 1),
        "baseline_per_s": round(baseline, 1),
        "ratio": round(rate / baseline, 3),
        "p50_ms": round(cuts[49] * 1000, 3),
        "p99_ms": round(cuts[98] * 1000, 3),
        "processes": senders,
        "messages": senders * count,
        **counts,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description="one bench mail worker process")
    parser.add_argument("mode", choices=["product", "baseline"])
    parser.add_argument("root", type=Path)
    parser.add_argument("sender")
    parser.add_argument("count", type=int)
    args = parser.parse_args()
    worker(args.mode, args.root, args.sender, args.count)


if __name__ == "__main__":
    main()

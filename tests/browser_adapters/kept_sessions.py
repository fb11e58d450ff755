"""A signed-in browser session a module's tests share, so that only the tests about signing
in pay for a managed login: the mock is reset keeping its web sessions, and each test's
empty state directory is given the session the test before it left."""

from __future__ import annotations

from pathlib import Path

from fixtures.admin import MockAdmin


class KeptSessions:
    """The kept session files (``*.json`` of a state directory) of the last test that had
    one."""

    def __init__(self) -> None:
        self._files: dict[str, bytes] = {}

    def reset(self, admin: MockAdmin, state_dir: Path) -> None:
        """The mock emptied, its web sessions kept, and ``state_dir`` given the kept files."""
        admin.reset(keep_web_sessions=True)
        if not self._files:
            return
        state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        for name, data in self._files.items():
            kept = state_dir / name
            kept.write_bytes(data)
            kept.chmod(0o600)

    def keep(self, state_dir: Path) -> None:
        """What the test left in ``state_dir`` (nothing: the next test signs in)."""
        self._files = {p.name: p.read_bytes() for p in sorted(state_dir.glob("*.json"))}

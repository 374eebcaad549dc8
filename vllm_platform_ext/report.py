"""One report per process of what ``bootstrap()`` did: each item applied, skipped (with the
reason) or failed (with the error). ``doctor`` prints it; tests read it."""
from __future__ import annotations

import enum
from dataclasses import asdict, dataclass


class Status(str, enum.Enum):
    APPLIED = "applied"
    SKIPPED = "skipped"
    FAILED = "failed"


@dataclass
class Entry:
    step: str  # "compat" | "ops" | "patch" | "switches" | ...
    name: str
    status: Status
    detail: str = ""

    def as_dict(self) -> dict:
        d = asdict(self)
        d["status"] = self.status.value
        return d


class Report:
    def __init__(self) -> None:
        self.entries: list[Entry] = []

    def add(self, step: str, name: str, status: Status, detail: str = "") -> Entry:
        e = Entry(step, name, Status(status), detail)
        self.entries.append(e)
        return e

    def applied(self, step: str, name: str, detail: str = "") -> Entry:
        return self.add(step, name, Status.APPLIED, detail)

    def skipped(self, step: str, name: str, detail: str) -> Entry:
        return self.add(step, name, Status.SKIPPED, detail)

    def failed(self, step: str, name: str, detail: str) -> Entry:
        return self.add(step, name, Status.FAILED, detail)

    def by_status(self, status: Status) -> list[Entry]:
        return [e for e in self.entries if e.status == status]

    def has_failure(self, step: str) -> bool:
        return any(e.step == step and e.status == Status.FAILED for e in self.entries)

    def find(self, step: str, name: str) -> Entry | None:
        for e in self.entries:
            if e.step == step and e.name == name:
                return e
        return None

    def summary(self) -> str:
        counts = {s: len(self.by_status(s)) for s in Status}
        line = ", ".join(f"{n} {s.value}" for s, n in counts.items())
        failed = self.by_status(Status.FAILED)
        if failed:
            line += "; failed: " + ", ".join(f"{e.step}/{e.name}" for e in failed)
        return line

    def as_list(self) -> list[dict]:
        return [e.as_dict() for e in self.entries]


_current: Report | None = None  # the report of this process's bootstrap, once it began


def current() -> Report | None:
    """The report this process's bootstrap writes into (``None`` before it ran): where patched code
    records what it finds at run time (a tensor vLLM hands over that breaks the op's contract)."""
    return _current


def set_current(report: Report) -> None:
    """Called by :mod:`vllm_platform_ext.bootstrap` only."""
    global _current
    _current = report

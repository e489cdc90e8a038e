"""The local engine's run record: what is kept of each step execution and how it is read back.

It owns one execution's record (``_Record``: state, attempts, outputs, failure class, cache
key...) and its JSON form, loading a run's record (``run.json`` with the newer
``run.journal`` lines replayed over it), and where an execution's files are and what it
wrote (its logs). Writing the record stays with :class:`~couler_runtime.local.engine.LocalRun`
(``_persist`` / ``_journal_record``), which the Ray executor overrides.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from couler import ir
from couler.engines.base import StepState, StepStatus
from couler.errors import NotFoundError

_DONE_OK = (StepState.SUCCEEDED, StepState.CACHED)


@dataclass
class _Record:
    step: str
    key: str = ""
    state: StepState = StepState.PENDING
    attempts: int = 0
    exit_code: int | None = None
    started_at: float | None = None
    finished_at: float | None = None
    peak_cpu: float | None = None
    peak_memory_bytes: int | None = None
    outputs: dict[str, str] = field(default_factory=dict)
    message: str = ""
    failure: str = ""  # the failure class of the last failed attempt
    failure_reason: str = ""  # why it is of that class (couler.failures.classify)
    # the process could not be started (Argo's "Error" status, not "Failed"): ``.Errored``
    # edges and ``on error`` exit hooks follow it
    errored: bool = False
    cache_key: str = ""
    cache_lineage: tuple[str, ...] = ()  # the producers' cache keys (see _lineage)
    # SKIPPED because its dependencies did not allow it to run (Argo's "Omitted"), not by
    # its own when: its dependents' default edges do not run either
    omitted: bool = False
    cache_saved_seconds: float = 0.0  # CACHED: the reused entry's cost

    def status(self) -> StepStatus:
        return StepStatus(
            step=self.step, state=self.state, key=self.key, attempts=self.attempts,
            exit_code=self.exit_code, started_at=self.started_at, finished_at=self.finished_at,
            peak_cpu=self.peak_cpu, peak_memory_bytes=self.peak_memory_bytes,
            outputs=dict(self.outputs), message=self.message, cache_key=self.cache_key,
            cache_lineage=self.cache_lineage, cache_saved_seconds=self.cache_saved_seconds,
            failure=self.failure, failure_reason=self.failure_reason,
        )

    def to_dict(self) -> dict[str, object]:
        data = self.status()
        return {
            "step": data.step, "key": data.key, "state": data.state.value,
            "attempts": data.attempts, "exit_code": data.exit_code,
            "started_at": data.started_at, "finished_at": data.finished_at,
            "peak_cpu": data.peak_cpu, "peak_memory_bytes": data.peak_memory_bytes,
            "outputs": dict(data.outputs), "message": data.message, "failure": self.failure,
            "failure_reason": self.failure_reason, "errored": self.errored,
            "cache_key": self.cache_key, "cache_lineage": list(self.cache_lineage),
            "omitted": self.omitted, "cache_saved_seconds": self.cache_saved_seconds,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> _Record:
        def opt_float(name: str) -> float | None:
            v = data.get(name)
            return float(v) if isinstance(v, (int, float)) else None

        def opt_int(name: str) -> int | None:
            v = data.get(name)
            return int(v) if isinstance(v, int) else None

        outputs = data.get("outputs")
        lineage = data.get("cache_lineage")
        return cls(
            step=str(data["step"]), key=str(data.get("key", "")),
            state=StepState(str(data["state"])), attempts=opt_int("attempts") or 0,
            exit_code=opt_int("exit_code"), started_at=opt_float("started_at"),
            finished_at=opt_float("finished_at"), peak_cpu=opt_float("peak_cpu"),
            peak_memory_bytes=opt_int("peak_memory_bytes"),
            outputs={str(k): str(v) for k, v in outputs.items()}
            if isinstance(outputs, dict) else {},
            message=str(data.get("message", "")), failure=str(data.get("failure", "")),
            failure_reason=str(data.get("failure_reason", "")),
            # journals written before "errored" was kept: a start failure was all of INFRA
            errored=(data.get("errored") is True if "errored" in data
                     else data.get("failure") == ir.FailureClass.INFRA.value),
            cache_key=str(data.get("cache_key", "")),
            cache_lineage=tuple(str(k) for k in lineage) if isinstance(lineage, list) else (),
            omitted=data.get("omitted") is True,
            cache_saved_seconds=opt_float("cache_saved_seconds") or 0.0,
        )


_SEGMENT = re.compile(r"(?P<name>[^\[\]/]+)(?:\[(?P<key>[^\]]*)\])?")


def _top(name: str) -> str:
    """The top-level step of a record name ("outer" of "outer[2]/inner")."""
    return re.split(r"[/\[]", name, maxsplit=1)[0]


def _load(run_dir: Path) -> tuple[dict[str, Any], dict[tuple[str, str], _Record]]:
    """A run record: ``run.json`` with the newer ``run.journal`` lines replayed over it."""
    path = run_dir / "run.json"
    if not path.is_file():
        raise NotFoundError(f"no local run record at {path}")
    data = json.loads(path.read_text())
    latest = {(r.step, r.key): r for r in (_Record.from_dict(d) for d in data["steps"])}
    journal = run_dir / "run.journal"
    if journal.is_file():  # changes newer than the snapshot (a crash before it was rewritten)
        for line in journal.read_text(encoding="utf-8").splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                break  # a line cut short by the crash: everything before it counts
            if entry["seq"] > data.get("seq", 0):
                rec = _Record.from_dict(entry["record"])
                latest[(rec.step, rec.key)] = rec
            data["last_seq"] = max(int(data.get("last_seq", 0)), int(entry["seq"]))
    return data, latest


def _exec_dir(steps_dir: Path, step: str, key: str) -> Path | None:
    """The directory of one execution: ``outer/inner`` -> ``steps/outer/main/inner/main``."""
    directory = steps_dir
    segments = step.split("/")
    for i, segment in enumerate(segments):
        match = _SEGMENT.fullmatch(segment)
        if match is None:
            return None
        own = match["key"] if match["key"] is not None else ""
        k = key if i == len(segments) - 1 else own
        directory = directory / match["name"]
        labels = [f"item-{k}", f"iter-{k}"] if k else ["main"]
        found = next((directory / label for label in labels if (directory / label).is_dir()),
                     None)
        if found is None:
            return None
        directory = found
    return directory


def _logs(run_dir: Path, workflow: str, known: set[tuple[str, str]], step: str,
          key: str) -> str:
    if (step, key) not in known:
        where = f"workflow {workflow!r}, run {run_dir.name!r}"
        if all(s != step for s, _ in known):
            raise NotFoundError(f"{where}: no step {step!r} in the run record")
        keys = sorted((k for s, k in known if s == step and k), key=lambda k: (len(k), k))
        raise NotFoundError(f"{where}, step {step!r}: no execution with key {key!r} "
                            f"(keys: {', '.join(repr(k) for k in keys) or 'none'})")
    directory = _exec_dir(run_dir / "steps", step, key)
    if directory is None:  # skipped or never started: it wrote nothing
        return ""
    return "".join((directory / name).read_text(errors="replace")
                   for name in ("stdout", "stderr") if (directory / name).is_file())

"""Resource right-sizing, simulated: today's rule against the VPA-like recommender.

300 hourly runs of five steps whose true use is known and drifts. Each run of a step is a
series of CPU use at one-second resolution and a memory curve; the monitor sees it the way
the engines report it:

* today's rule sees one sample per attempt: its *instantaneous* peaks (the highest one-second
  CPU, the highest memory), and requests ``max(peak over the last 10 runs) * 1.2`` after a
  single run (``couler_monitor.service`` before the recommender);
* the recommender (:func:`couler_monitor.recommender.recommend`, the library the monitor
  runs) sees the time series: one sample per ``--interval`` seconds, the mean cores over the
  interval and the memory at its end, and requests CPU p90 / memory p95 of its decaying
  histograms plus a margin, after 2 runs, with hysteresis.

Both start from the request the workflow's author wrote and round as the monitor does
(whole Mi, whole millicores, at least 16Mi and 10m). Reported per step and overall:

* memory utilization: the runs' peak memory / the memory requested (summed over runs);
* CPU utilization: core-seconds used / core-seconds requested (request x duration);
* memory over request: the share of runs whose peak memory exceeded the request (on a
  node under pressure such a pod is the first evicted; with limit = request, an OOM kill);
* CPU over request: the share of runs whose mean use over some interval exceeded the CPU
  request (throttled or contending for the node, for that interval);
* changes: how many times the request changed (each is a new plan for the step).

    .venv/bin/python bench/recommender_sim.py [--runs 300] [--seed 11] [--interval 10]
        [--half-life-hours 24] [--json FILE]

Deterministic: the same seed gives the same figures.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from couler_monitor.recommender import RecommenderConfig, StepHistory, recommend

MI = 1024 * 1024
HOUR = 3600.0
T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z


@dataclass(frozen=True)
class Run:
    """What one run of a step really did: CPU per second, memory per second."""

    start: float
    cpu: list[float]  # cores, one value per second
    memory: list[float]  # bytes, one value per second


@dataclass(frozen=True)
class StepModel:
    """A step's true behaviour: ``make(run index, rng, start)`` is one run."""

    name: str
    what: str
    cpu_request: float  # what the author wrote, in cores
    memory_request: float  # bytes
    make: Callable[[int, random.Random, float], Run]


def _ramp(peak: float, seconds: int, rng: random.Random, *, start: float = 0.3) -> list[float]:
    """Memory that grows to ``peak`` over the run (loading data), with a little noise."""
    return [peak * (start + (1 - start) * min(1.0, 1.3 * i / seconds))
            * rng.uniform(0.985, 1.0) for i in range(seconds)]


def hello(i: int, rng: random.Random, start: float) -> Run:
    """Prints one word: 1.4 cores for the interpreter's first second, then nothing."""
    seconds = rng.randint(8, 14)
    cpu = [1.4 * rng.uniform(0.95, 1.05)] + [0.02] * (seconds - 1)
    return Run(start, cpu, [24 * MI * rng.uniform(0.98, 1.02)] * seconds)


def train(i: int, rng: random.Random, start: float) -> Run:
    """Training on data that grows 0.25% a run: memory drifts up (x2.1 over 300 runs);
    CPU about 3.2 cores with a start-up burst and noisy epochs."""
    seconds = rng.randint(1500, 2100)
    peak = 2048 * MI * (1.0025 ** i) * rng.lognormvariate(0, 0.05)
    cpu = [4.0 if s < 30 else max(0.2, rng.gauss(3.2, 0.5)) for s in range(seconds)]
    return Run(start, cpu, _ramp(peak, seconds, rng))


def etl(i: int, rng: random.Random, start: float) -> Run:
    """Bursty CPU (2 cores half the time, 0.3 otherwise, in 30-second phases); its memory
    drops by 40% from run 150 on (a fix that streams instead of loading)."""
    seconds = rng.randint(500, 800)
    peak = (1200 if i < 150 else 720) * MI * rng.lognormvariate(0, 0.04)
    cpu = [(2.0 if (s // 30) % 2 == 0 else 0.3) * rng.uniform(0.9, 1.1)
           for s in range(seconds)]
    return Run(start, cpu, _ramp(peak, seconds, rng, start=0.5))


def score(i: int, rng: random.Random, start: float) -> Run:
    """Steady at 600Mi and 1 core, but one run in 30 gets a batch 1.8x as large."""
    seconds = rng.randint(200, 300)
    big = rng.random() < 1 / 30
    peak = 600 * MI * (1.8 if big else 1.0) * rng.lognormvariate(0, 0.03)
    cpu = [max(0.05, rng.gauss(1.0, 0.15)) for _ in range(seconds)]
    return Run(start, cpu, _ramp(peak, seconds, rng))


def report(i: int, rng: random.Random, start: float) -> Run:
    """A small job whose CPU use grows slowly over the period (0.2 -> 0.5 cores)."""
    seconds = rng.randint(60, 90)
    level = 0.2 + 0.3 * i / 300
    cpu = [0.8] * 2 + [max(0.01, rng.gauss(level, 0.05)) for _ in range(seconds - 2)]
    return Run(start, cpu, _ramp(180 * MI * rng.lognormvariate(0, 0.02), seconds, rng))


STEPS = (
    StepModel("hello", "prints one word; 1.4-core start-up", 0.5, 64 * MI, hello),
    StepModel("train", "memory drifts up x2.1", 4.0, 4096 * MI, train),
    StepModel("etl", "bursty CPU; memory -40% at run 150", 2.0, 2048 * MI, etl),
    StepModel("score", "1 run in 30 at 1.8x memory", 1.0, 1024 * MI, score),
    StepModel("report", "CPU drifts up 0.2 -> 0.5", 0.5, 256 * MI, report),
)


# ----------------------------------------------------------------------------- rules

def _mi(n: float) -> float:
    return max(16 * MI, math.ceil(n / MI) * MI)


def _milli(c: float) -> float:
    return max(0.01, math.ceil(round(c * 1000, 6)) / 1000)


class TodayRule:
    """``max(peak over the last 10 runs) * 1.2``, from one run on (instantaneous peaks)."""

    name = "today: max peak of 10 runs x 1.2"

    def __init__(self, cpu: float, memory: float) -> None:
        self.cpu, self.memory = cpu, memory
        self.peaks: deque[tuple[float, float]] = deque(maxlen=10)

    def observe(self, run: Run, interval: int) -> None:
        self.peaks.append((max(run.cpu), max(run.memory)))
        self.cpu = _milli(max(c for c, _ in self.peaks) * 1.2)
        self.memory = _mi(max(m for _, m in self.peaks) * 1.2)


class VpaRule:
    """The monitor's recommender, fed the series the engines send."""

    name = "recommender: decaying histograms, CPU p90 / memory p95 + margin"

    def __init__(self, cpu: float, memory: float,
                 config: RecommenderConfig | None = None) -> None:
        self.cpu, self.memory = cpu, memory
        self.config = config or RecommenderConfig()
        self.history = StepHistory.new(self.config.half_life)
        self.target_cpu: float | None = None
        self.target_memory: float | None = None

    def observe(self, run: Run, interval: int) -> None:
        got = recommend([series(run, interval)], self.config, history=self.history,
                        cpu=self.target_cpu, memory=self.target_memory)
        # the monitor publishes rounded quantities; the hysteresis compares with those
        if got.cpu is not None:
            self.target_cpu = self.cpu = _milli(got.cpu)
        if got.memory is not None:
            self.target_memory = self.memory = _mi(got.memory)


def series(run: Run, interval: int) -> list[tuple[float, float, float]]:
    """The samples an engine sends: per interval, the mean cores and the memory at its end
    (a run shorter than one interval: one sample over its life)."""
    out = []
    for s in range(0, len(run.cpu), interval):
        chunk = run.cpu[s:s + interval]
        end = min(s + interval, len(run.cpu)) - 1
        out.append((run.start + end + 1, sum(chunk) / len(chunk),
                    max(run.memory[s:end + 1])))
    return out


# ----------------------------------------------------------------------------- scoring

@dataclass
class Score:
    """Totals over the runs of one rule (and step)."""

    memory_used: float = 0.0
    memory_requested: float = 0.0
    core_seconds_used: float = 0.0
    core_seconds_requested: float = 0.0
    runs: int = 0
    memory_over: int = 0
    cpu_over: int = 0
    changes: int = 0
    requests: list[tuple[float, float]] = field(default_factory=list)

    def add(self, run: Run, cpu: float, memory: float, interval: int) -> None:
        seconds = len(run.cpu)
        self.runs += 1
        self.memory_used += max(run.memory)
        self.memory_requested += memory
        self.core_seconds_used += sum(run.cpu)
        self.core_seconds_requested += cpu * seconds
        self.memory_over += max(run.memory) > memory
        self.cpu_over += max(c for _, c, _ in series(run, interval)) > cpu
        if self.requests and self.requests[-1] != (cpu, memory):
            self.changes += 1
        self.requests.append((cpu, memory))

    def merge(self, other: Score) -> None:
        for name in ("memory_used", "memory_requested", "core_seconds_used",
                     "core_seconds_requested", "runs", "memory_over", "cpu_over", "changes"):
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def figures(self) -> dict[str, float]:
        return {
            "memory_utilization": round(self.memory_used / self.memory_requested, 3),
            "cpu_utilization": round(self.core_seconds_used / self.core_seconds_requested, 3),
            "memory_over_request": round(self.memory_over / self.runs, 4),
            "cpu_over_request": round(self.cpu_over / self.runs, 4),
            "changes": self.changes,
            "runs": self.runs,
        }


def simulate(runs: int, seed: int, interval: int,
             config: RecommenderConfig | None = None) -> dict[str, dict[str, dict[str, float]]]:
    """Per rule, per step (and ``all``), the figures of :class:`Score`."""
    results: dict[str, dict[str, dict[str, float]]] = {}
    rules: list[tuple[str, Callable[[float, float], TodayRule | VpaRule]]] = [
        (TodayRule.name, TodayRule),
        (VpaRule.name, lambda cpu, memory: VpaRule(cpu, memory, config))]
    for name, make_rule in rules:
        totals = Score()
        per_step: dict[str, dict[str, float]] = {}
        for k, model in enumerate(STEPS):
            rng = random.Random(seed * 1000 + k)  # the same runs for both rules
            rule = make_rule(model.cpu_request, model.memory_request)
            score = Score()
            for i in range(runs):
                run = model.make(i, rng, T0 + i * HOUR)
                score.add(run, rule.cpu, rule.memory, interval)  # the request in force
                rule.observe(run, interval)  # then the monitor learns from it
            per_step[model.name] = score.figures()
            totals.merge(score)
        per_step["all"] = totals.figures()
        results[name] = per_step
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--interval", type=int, default=10,
                        help="seconds per sample of the series (default 10)")
    parser.add_argument("--half-life-hours", type=float, default=24.0,
                        help="the recommender's histogram half-life (default 24)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    config = RecommenderConfig(half_life=args.half_life_hours * HOUR)
    results = simulate(args.runs, args.seed, args.interval, config)
    columns = ("memory_utilization", "cpu_utilization", "memory_over_request",
               "cpu_over_request", "changes")
    print(f"{args.runs} hourly runs per step, seed {args.seed}, samples every "
          f"{args.interval} s, half-life {args.half_life_hours:g} h\n")
    print(f"| rule | step | {' | '.join(c.replace('_', ' ') for c in columns)} |")
    print("|---|---|" + "---:|" * len(columns))
    for rule, per_step in results.items():
        for step, fig in per_step.items():
            cells = [f"{fig[c]:.3f}" if isinstance(fig[c], float) else str(fig[c])
                     for c in columns]
            label = f"**{step}**" if step == "all" else step
            print(f"| {rule.split(':')[0]} | {label} | {' | '.join(cells)} |")
    if args.json:
        args.json.write_text(json.dumps({"runs": args.runs, "seed": args.seed,
                                         "interval": args.interval,
                                         "half_life_hours": args.half_life_hours,
                                         "results": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

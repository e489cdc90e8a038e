"""Resource recommendations for workflow steps, modelled on the Kubernetes VPA recommender.

Pure code: no database, no bus, no clock. :class:`Monitor` (``couler_monitor.service``)
keeps one :class:`StepHistory` per (workflow, step), stores it as JSON (:meth:`to_json`),
feeds it the samples and step ends it records, and asks :func:`estimate` for requests;
:func:`recommend` does all of that for a series of runs, for simulations and tests.

How a request is chosen (the VPA recommender's method, ``pkg/recommender/logic``, adapted
to steps that run to completion instead of pods that run for ever):

**Two decaying histograms per step.** Buckets grow exponentially (each 5% wider than the
last, as VPA's ``NewExponentialHistogramOptions``), so a percentile is exact to one bucket
(5%, a little more near the first buckets) at any scale, from a few MiB to a TiB and from
10m to 1000 cores, in about 220 buckets. A sample's
weight doubles every ``half_life`` (24 h by default): recent runs count more, and a step
whose use drifts is followed. As in VPA's ``decayingHistogram``, the weight is
``2 ** ((t - reference) / half_life)`` against a reference time, not a decay applied to the
old samples on every update; when a weight would exceed ``2 ** 100`` the reference moves
forward (to a whole multiple of the half-life) and every stored weight is scaled down by
the same power of two (renormalised), which changes no percentile.

* CPU: every utilization sample, in cores. A sample is the mean use over an interval (the
  engines' time series) or, from an engine that reports one sample per attempt, that
  attempt's peak. A sample weighs the seconds it covers (times the decay; a peak without
  an interval weighs 1), so the histogram is a distribution of use *over time* whatever
  the engine's sampling period -- two seconds of interpreter start-up at 1.4 cores weigh
  two seconds of the whole run, not the step's size. (VPA weighs a sample by the
  container's CPU request, at least 0.1 core; we do not, because the request here is our
  own output: weighing by it would make a step's past recommendations weigh on its next
  ones.)
* Memory: one value per run of the step -- the run's peak over its samples, attempts and
  map items (the request must fit the largest item), VPA's "peak per aggregation
  interval" with a run as the interval. A run's peak only grows: when a higher value of the
  same run arrives (a later sample, the step's end), the old one is subtracted and the new
  one added at the same time and weight, as VPA does within an interval. A run that ran out
  of memory counts as ``max(peak * 1.2, peak + 100Mi)`` (VPA's OOM bump), since it was
  stopped before it reached what it needed.

**Estimates.** For each resource, three percentiles of its histogram, each times
``1 + safety_margin`` (15%, as VPA) and times a *confidence* factor
``(1 + multiplier / confidence) ** exponent`` (VPA's ``WithConfidenceMultiplier``):

==============  ==============  ===================  ============================
estimate        CPU percentile  memory percentile    confidence factor
==============  ==============  ===================  ============================
lower bound     p50             p50                  ``(1 + 1/c) ** -1``
target          p90             p95 (of run peaks)   ``(1 + 0.5/c) ** 1``
upper bound     p95             p99 (of run peaks)   ``(1 + 1/c) ** 1``
==============  ==============  ===================  ============================

``c`` is the number of runs observed. VPA measures confidence in days of history, a
pod's natural unit; a batch step's is a run, and the histogram's time span is reported as
evidence beside it. With 2 runs the target is 1.15 * 1.25 = 1.44 times its percentile and
the bounds are wide; with 10 runs 1.21 times; with 100, 1.16. Unlike VPA, the target is
widened too: a request that comes from little evidence keeps more room. Because the upper
bound's percentile and factor are at least the target's, and the lower bound's at most,
``lower <= target <= upper`` always holds (and is enforced after the minimums).

Every estimate is at least ``min_cpu`` / ``min_memory`` (a request below what any process
needs to start is noise). No estimate is made before ``min_runs`` runs (2): one run, noisy
or not, never sets a request.

**Hysteresis** (:func:`should_update`): a new request is published only when its target
moved more than 10% from the current request, or the current request left
``[lower, upper]`` -- so that small fluctuations do not change every plan (VPA's updater
acts only outside the bounds).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "CPU_BUCKETS",
    "MEMORY_BUCKETS",
    "OOM_BUMP_MIN_BYTES",
    "OOM_BUMP_RATIO",
    "BucketScheme",
    "DecayingHistogram",
    "Estimate",
    "Recommendation",
    "RecommenderConfig",
    "ResourceEstimate",
    "StateError",
    "StepHistory",
    "estimate",
    "oom_bump",
    "recommend",
    "should_update",
]

MI = 1024 * 1024
HOUR = 3600.0
MAX_DECAY_EXPONENT = 100  # VPA's maxDecayExponent: renormalise before 2**100
OOM_BUMP_RATIO = 1.2  # VPA's OOMBumpUpRatio
OOM_BUMP_MIN_BYTES = 100 * MI  # VPA's OOMMinBumpUp (100 MB there)
_FORMAT = 1  # the version of the JSON state


class StateError(ValueError):
    """Stored state that cannot be read (damaged, or from an unknown version)."""


# ----------------------------------------------------------------------------- histogram


@dataclass(frozen=True, slots=True)
class BucketScheme:
    """Exponential buckets: bucket ``i`` starts at ``first * (ratio**i - 1) / (ratio - 1)``.

    As VPA's ``exponentialHistogramOptions``: the first bucket is ``[0, first)``, each next
    one ``ratio`` times wider; values above ``max_value`` fall in the last bucket.
    """

    first: float
    ratio: float
    max_value: float

    @property
    def buckets(self) -> int:
        """How many buckets there are."""
        return math.ceil(math.log(self.max_value * (self.ratio - 1) / self.first + 1)
                         / math.log(self.ratio)) + 1

    def bucket(self, value: float) -> int:
        """The bucket holding ``value``."""
        if value < self.first:
            return 0
        i = int(math.log(value * (self.ratio - 1) / self.first + 1) / math.log(self.ratio))
        return min(i, self.buckets - 1)

    def start(self, bucket: int) -> float:
        """The smallest value of ``bucket``."""
        return self.first * (self.ratio ** bucket - 1) / (self.ratio - 1)


CPU_BUCKETS = BucketScheme(first=0.001, ratio=1.05, max_value=1000.0)  # cores: 1m .. 1000
MEMORY_BUCKETS = BucketScheme(first=float(MI), ratio=1.05, max_value=float(2 ** 40))  # 1Mi..1Ti


@dataclass(slots=True)
class DecayingHistogram:
    """A histogram whose samples lose half their weight every ``half_life`` seconds.

    As VPA's ``decayingHistogram``: a sample at time ``t`` is added with weight
    ``w * 2 ** ((t - reference) / half_life)``, so newer samples weigh exponentially more
    and no stored weight ever needs updating as time passes. When that exponent would
    exceed :data:`MAX_DECAY_EXPONENT` the reference moves to ``t`` (rounded to a whole
    number of half-lives) and every weight is divided by the same power of two.

    Attributes:
        scheme: The buckets.
        half_life: Seconds after which a sample weighs half as much as a new one.
        reference: The reference time (seconds since the epoch); None while empty.
        weights: Decayed weight per bucket (only buckets with weight).
    """

    scheme: BucketScheme
    half_life: float
    reference: float | None = None
    weights: dict[int, float] = field(default_factory=dict)

    def _factor(self, at: float) -> float:
        if self.reference is None:
            self.reference = self._round(at)
        elif at > self.reference + self.half_life * MAX_DECAY_EXPONENT:
            self._shift(at)
        return float(2.0 ** ((at - self.reference) / self.half_life))

    def _round(self, at: float) -> float:
        return round(at / self.half_life) * self.half_life

    def _shift(self, at: float) -> None:
        """Move the reference to ``at`` (renormalise): scale every weight to match."""
        assert self.reference is not None
        new = self._round(at)
        scale = 2.0 ** (-round((new - self.reference) / self.half_life))
        self.weights = {b: w * scale for b, w in self.weights.items() if w * scale > 0.0}
        self.reference = new

    def add(self, value: float, at: float, weight: float = 1.0) -> None:
        """Add a sample of ``value`` taken at time ``at``."""
        if weight <= 0 or not math.isfinite(value) or not math.isfinite(at):
            return
        w = weight * self._factor(at)
        if w <= 0.0:  # so old (before the reference by over 1000 half-lives) it weighs nothing
            return
        b = self.scheme.bucket(max(0.0, value))
        self.weights[b] = self.weights.get(b, 0.0) + w

    def subtract(self, value: float, at: float, weight: float = 1.0) -> None:
        """Take back a sample added with the same ``value``, ``at`` and ``weight``."""
        if self.reference is None or weight <= 0 or not math.isfinite(value):
            return
        w = weight * self._factor(at)
        b = self.scheme.bucket(max(0.0, value))
        left = self.weights.get(b, 0.0) - w
        if left <= w * 1e-9:  # what is left is rounding error
            self.weights.pop(b, None)
        else:
            self.weights[b] = left

    @property
    def total(self) -> float:
        """The sum of the (decayed) weights."""
        return sum(self.weights.values())

    @property
    def empty(self) -> bool:
        """Whether there is no sample."""
        return not self.weights

    def percentile(self, p: float) -> float | None:
        """The value below which a fraction ``p`` of the weight lies; None when empty.

        As VPA's ``Percentile``: the *end* of the bucket where the cumulative weight reaches
        ``p`` of the total (an over-estimate of at most one bucket), or the start of the
        last bucket.
        """
        if not self.weights:
            return None
        threshold = p * self.total
        acc = 0.0
        last = max(self.weights)
        for b in sorted(self.weights):
            acc += self.weights[b]
            if acc >= threshold or b == last:
                if b < self.scheme.buckets - 1:
                    return self.scheme.start(b + 1)
                return self.scheme.start(b)
        return None  # pragma: no cover - the loop returns at the last bucket

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able form (:meth:`from_dict` reads it)."""
        return {"reference": self.reference, "half_life": self.half_life,
                "weights": {str(b): w for b, w in sorted(self.weights.items())}}

    @classmethod
    def from_dict(cls, data: object, scheme: BucketScheme) -> DecayingHistogram:
        """The histogram :meth:`to_dict` wrote.

        Raises:
            StateError: ``data`` is not such a form.
        """
        if not isinstance(data, Mapping):
            raise StateError("histogram: not an object")
        try:
            half_life = float(data["half_life"])
            reference = data["reference"]
            reference = None if reference is None else float(reference)
            weights = {int(b): float(w) for b, w in dict(data["weights"]).items()}
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise StateError(f"histogram: {e!r}") from e
        if not (half_life > 0 and math.isfinite(half_life)) or (
                reference is not None and not math.isfinite(reference)):
            raise StateError("histogram: half_life or reference out of range")
        if any(not 0 <= b < scheme.buckets or not (math.isfinite(w) and w >= 0)
               for b, w in weights.items()):
            raise StateError("histogram: a bucket or weight out of range")
        return cls(scheme, half_life, reference, {b: w for b, w in weights.items() if w > 0})


# ----------------------------------------------------------------------------- history


@dataclass(slots=True)
class StepHistory:
    """What the recommender knows of one step: its two histograms and how much evidence.

    Attributes:
        cpu: CPU samples in cores.
        memory: One peak per run, in bytes.
        runs: Runs of the step counted (the confidence).
        samples: CPU samples added.
        first_at: The earliest sample or peak time.
        last_at: The latest sample or peak time.
    """

    cpu: DecayingHistogram
    memory: DecayingHistogram
    runs: int = 0
    samples: int = 0
    first_at: float | None = None
    last_at: float | None = None

    @classmethod
    def new(cls, half_life: float = 24 * HOUR) -> StepHistory:
        """An empty history whose samples halve in weight every ``half_life`` seconds."""
        return cls(DecayingHistogram(CPU_BUCKETS, half_life),
                   DecayingHistogram(MEMORY_BUCKETS, half_life))

    @property
    def span(self) -> float:
        """Seconds between the first and the last sample."""
        if self.first_at is None or self.last_at is None:
            return 0.0
        return max(0.0, self.last_at - self.first_at)

    def _seen(self, at: float) -> None:
        self.first_at = at if self.first_at is None else min(self.first_at, at)
        self.last_at = at if self.last_at is None else max(self.last_at, at)

    def add_cpu(self, at: float, cores: float, seconds: float = 0.0) -> None:
        """One CPU sample: the mean cores over the ``seconds`` it covers (weighed by them),
        or an attempt's peak (``seconds`` 0: weighs 1)."""
        if not (math.isfinite(at) and math.isfinite(cores)) or cores < 0:
            return
        weight = seconds if math.isfinite(seconds) and seconds > 0 else 1.0
        self.cpu.add(cores, at, weight)
        self.samples += 1
        self._seen(at)

    def set_memory_peak(self, at: float, peak: float, previous: float | None = None) -> None:
        """Put a run's memory peak in the histogram, at the run's time ``at``.

        ``previous`` is the peak already added for that run (with the same ``at``), taken
        back first; a run is thus one value however often its peak grows.
        """
        if not (math.isfinite(at) and math.isfinite(peak)) or peak < 0:
            return
        if previous is not None:
            self.memory.subtract(previous, at)
        self.memory.add(peak, at)
        self._seen(at)

    def count_run(self) -> None:
        """One more run of the step has ended with a measurement."""
        self.runs += 1

    def to_json(self) -> str:
        """The history as JSON (:meth:`from_json` reads it)."""
        return json.dumps({"format": _FORMAT, "runs": self.runs, "samples": self.samples,
                           "first_at": self.first_at, "last_at": self.last_at,
                           "cpu": self.cpu.to_dict(), "memory": self.memory.to_dict()},
                          separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> StepHistory:
        """The history :meth:`to_json` wrote.

        Raises:
            StateError: ``text`` is not such a history (damaged, or another format).
        """
        try:
            data = json.loads(text)
        except (TypeError, ValueError) as e:
            raise StateError(f"not JSON: {e}") from e
        if not isinstance(data, dict) or data.get("format") != _FORMAT:
            raise StateError("not a step history of a known format")
        try:
            runs, samples = int(data["runs"]), int(data["samples"])
            first, last = data["first_at"], data["last_at"]
            first = None if first is None else float(first)
            last = None if last is None else float(last)
        except (KeyError, TypeError, ValueError) as e:
            raise StateError(f"step history: {e!r}") from e
        if runs < 0 or samples < 0:
            raise StateError("step history: negative counts")
        return cls(DecayingHistogram.from_dict(data.get("cpu"), CPU_BUCKETS),
                   DecayingHistogram.from_dict(data.get("memory"), MEMORY_BUCKETS),
                   runs, samples, first, last)


def oom_bump(peak: float) -> float:
    """What a run killed for memory at ``peak`` counts as (VPA's OOM bump-up)."""
    return max(peak * OOM_BUMP_RATIO, peak + OOM_BUMP_MIN_BYTES)


# ----------------------------------------------------------------------------- estimates


@dataclass(frozen=True, slots=True)
class RecommenderConfig:
    """The recommender's knobs (the defaults are those documented above).

    Attributes:
        cpu_percentile: The CPU target's percentile (of samples over time).
        memory_percentile: The memory target's percentile (of run peaks).
        lower_percentile: The lower bounds' percentile.
        cpu_upper_percentile / memory_upper_percentile: The upper bounds' percentiles.
        safety_margin: Added to every percentile (0.15: +15%).
        target_confidence: ``(multiplier, exponent)`` of the target's confidence factor.
        lower_confidence / upper_confidence: Those of the bounds.
        min_runs: Runs needed before any estimate.
        min_cpu: The smallest CPU estimate, in cores.
        min_memory: The smallest memory estimate, in bytes.
        half_life: Seconds after which a sample weighs half (histograms made here).
        change_threshold: The relative move of the target that publishes a new request.
    """

    cpu_percentile: float = 0.90
    memory_percentile: float = 0.95
    lower_percentile: float = 0.50
    cpu_upper_percentile: float = 0.95
    memory_upper_percentile: float = 0.99
    safety_margin: float = 0.15
    target_confidence: tuple[float, float] = (0.5, 1.0)
    lower_confidence: tuple[float, float] = (1.0, -1.0)
    upper_confidence: tuple[float, float] = (1.0, 1.0)
    min_runs: int = 2
    min_cpu: float = 0.01
    min_memory: float = 16.0 * MI
    half_life: float = 24 * HOUR
    change_threshold: float = 0.10

    def __post_init__(self) -> None:
        for name in ("cpu_percentile", "memory_percentile", "lower_percentile",
                     "cpu_upper_percentile", "memory_upper_percentile"):
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(f"{name} must be in (0, 1]")
        if not (self.lower_percentile <= min(self.cpu_percentile, self.memory_percentile)
                and self.cpu_upper_percentile >= self.cpu_percentile
                and self.memory_upper_percentile >= self.memory_percentile):
            raise ValueError("percentiles must be ordered: lower <= target <= upper")
        if self.safety_margin < 0 or self.min_runs < 1 or self.half_life <= 0:
            raise ValueError("safety_margin >= 0, min_runs >= 1 and half_life > 0 needed")
        if self.change_threshold < 0:
            raise ValueError("change_threshold must be >= 0")


@dataclass(frozen=True, slots=True)
class ResourceEstimate:
    """One resource's recommendation and the evidence behind it.

    Attributes:
        resource: ``"cpu"`` (cores) or ``"memory"`` (bytes).
        target: The request to use.
        lower: The lowest request that still looks reasonable.
        upper: The highest request that still looks reasonable.
        percentile: The target's percentile (0.9: p90).
        observed: The target's percentile of the histogram, before margin and confidence.
        factor: What ``observed`` was multiplied by (safety margin times confidence).
        runs: Runs observed (the confidence).
        samples: Samples behind it (CPU samples; for memory, one per run).
        span: Seconds the histogram covers (first to last sample).
        floored: The target was raised to the minimum.
    """

    resource: str
    target: float
    lower: float
    upper: float
    percentile: float
    observed: float
    factor: float
    runs: int
    samples: int
    span: float
    floored: bool = False


@dataclass(frozen=True, slots=True)
class Estimate:
    """Both resources' estimates (None before ``min_runs`` runs, or with no sample)."""

    cpu: ResourceEstimate | None
    memory: ResourceEstimate | None


def _confidence(params: tuple[float, float], runs: int) -> float:
    multiplier, exponent = params
    return float((1.0 + multiplier / max(runs, 1e-9)) ** exponent)


def _one(resource: str, hist: DecayingHistogram, config: RecommenderConfig, *,
         target_p: float, upper_p: float, minimum: float, runs: int, samples: int,
         span: float) -> ResourceEstimate | None:
    observed = hist.percentile(target_p)
    low = hist.percentile(config.lower_percentile)
    high = hist.percentile(upper_p)
    if observed is None or low is None or high is None:
        return None
    margin = 1.0 + config.safety_margin
    factor = margin * _confidence(config.target_confidence, runs)
    raw = observed * factor
    target = max(raw, minimum)
    lower = max(low * margin * _confidence(config.lower_confidence, runs), minimum)
    upper = max(high * margin * _confidence(config.upper_confidence, runs), minimum)
    lower, upper = min(lower, target), max(upper, target)
    return ResourceEstimate(resource, target, lower, upper, target_p, observed, factor,
                            runs, samples, span, floored=raw < minimum)


def estimate(history: StepHistory, config: RecommenderConfig | None = None) -> Estimate:
    """The CPU and memory estimates of ``history`` (see the module's documentation)."""
    config = config or RecommenderConfig()
    if history.runs < config.min_runs:
        return Estimate(None, None)
    cpu = _one("cpu", history.cpu, config, target_p=config.cpu_percentile,
               upper_p=config.cpu_upper_percentile, minimum=config.min_cpu,
               runs=history.runs, samples=history.samples, span=history.span)
    memory = _one("memory", history.memory, config, target_p=config.memory_percentile,
                  upper_p=config.memory_upper_percentile, minimum=config.min_memory,
                  runs=history.runs, samples=history.runs, span=history.span)
    return Estimate(cpu, memory)


def should_update(current: float | None, est: ResourceEstimate,
                  threshold: float = 0.10) -> bool:
    """Whether to replace the ``current`` request by ``est.target`` (hysteresis).

    Yes when there is none, when the target moved by more than ``threshold`` of it, or when
    it left ``[est.lower, est.upper]``.
    """
    if current is None or current <= 0:
        return True
    if abs(est.target - current) > threshold * current:
        return True
    return not est.lower <= current <= est.upper


# ----------------------------------------------------------------------------- library


@dataclass(frozen=True, slots=True)
class Recommendation:
    """:func:`recommend`'s answer: the requests in use after the runs, and the estimate.

    Attributes:
        cpu: The CPU request in cores (None: none yet).
        memory: The memory request in bytes (None: none yet).
        estimate: The latest estimate (its target may differ from the request: hysteresis).
        history: The histograms, to continue with more runs.
    """

    cpu: float | None
    memory: float | None
    estimate: Estimate
    history: StepHistory


Sample = tuple[float, float, float]  # (time in seconds, cores, memory bytes)


def recommend(runs: Iterable[Sequence[Sample]], config: RecommenderConfig | None = None, *,
              history: StepHistory | None = None, cpu: float | None = None,
              memory: float | None = None, oom: Iterable[bool] | None = None
              ) -> Recommendation:
    """Feed the runs of one step, in order, and return the requests a monitor would publish.

    Args:
        runs: Per run, its samples ``(time, cores, memory bytes)``: each an interval's mean
            CPU and the memory at that time (a single sample of an attempt's peaks works
            too). A run with no sample is skipped.
        config: The knobs.
        history: Continue from this history (it is updated); a new one otherwise.
        cpu: The CPU request in use before these runs (cores), if any.
        memory: The memory request in use before these runs (bytes), if any.
        oom: Per run, whether it ran out of memory (its peak then counts bumped up).

    The requests change as in the monitor: after each run an estimate, applied past the
    hysteresis (:func:`should_update`).
    """
    config = config or RecommenderConfig()
    history = history if history is not None else StepHistory.new(config.half_life)
    killed = iter(oom) if oom is not None else None
    last = Estimate(None, None)
    for series in runs:
        was_oom = next(killed, False) if killed is not None else False
        if not series:
            continue
        for at, cores, _ in series:
            history.add_cpu(at, cores)
        peak = max(m for _, _, m in series)
        history.set_memory_peak(series[0][0], oom_bump(peak) if was_oom else peak)
        history.count_run()
        last = estimate(history, config)
        if last.cpu is not None and should_update(cpu, last.cpu, config.change_threshold):
            cpu = last.cpu.target
        if last.memory is not None and should_update(memory, last.memory,
                                                     config.change_threshold):
            memory = last.memory.target
    return Recommendation(cpu, memory, last, history)

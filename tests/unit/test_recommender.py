"""The resource recommender (couler_monitor.recommender): histograms, estimates, hysteresis."""

from __future__ import annotations

import json
import math
import random

import pytest

from couler_monitor.recommender import (
    CPU_BUCKETS,
    HOUR,
    MAX_DECAY_EXPONENT,
    MEMORY_BUCKETS,
    DecayingHistogram,
    RecommenderConfig,
    StateError,
    StepHistory,
    estimate,
    oom_bump,
    recommend,
    should_update,
)

MI = 1024 * 1024
DAY = 24 * HOUR
T0 = 1_700_000_000.0


# ----------------------------------------------------------------------------- buckets


def test_buckets_grow_by_five_percent_and_cover_the_range() -> None:
    for scheme in (CPU_BUCKETS, MEMORY_BUCKETS):
        n = scheme.buckets
        assert 150 < n < 300
        assert scheme.bucket(0.0) == 0
        assert scheme.bucket(scheme.max_value * 10) == n - 1
        for i in range(1, n - 2):
            width = scheme.start(i + 1) - scheme.start(i)
            assert width == pytest.approx(scheme.first * 1.05 ** i)
            mid = (scheme.start(i) + scheme.start(i + 1)) / 2
            assert scheme.bucket(mid) == i


# ----------------------------------------------------------------------------- histogram


def hist(half_life: float = DAY) -> DecayingHistogram:
    return DecayingHistogram(CPU_BUCKETS, half_life)


def test_percentiles_are_bucket_ends_within_five_percent() -> None:
    h = hist()
    for v in range(1, 101):  # 0.01 .. 1.00 cores, equal weights
        h.add(v / 100, T0)
    for p, want in ((0.5, 0.50), (0.9, 0.90), (0.95, 0.95), (1.0, 1.00)):
        got = h.percentile(p)
        assert got is not None
        assert want <= got <= want * 1.07, (p, got)  # one bucket: 5% and a bit
    assert hist().percentile(0.9) is None


def test_a_sample_weighs_half_after_one_half_life() -> None:
    h = hist(half_life=HOUR)
    h.add(1.0, T0)
    h.add(2.0, T0 + HOUR)  # twice the weight of the first
    w = {CPU_BUCKETS.bucket(1.0): None, CPU_BUCKETS.bucket(2.0): None}
    old, new = (h.weights[b] for b in w)
    assert new == pytest.approx(2 * old)
    # one old sample of 1 core, one new of 2 cores weighing twice: p50 is the new one
    p50 = h.percentile(0.5)
    assert p50 is not None and p50 >= 2.0
    # ten half-lives later the old samples are all but gone
    h.add(0.5, T0 + 11 * HOUR)
    p10 = h.percentile(0.1)
    assert p10 is not None and p10 < 0.6


def test_the_reference_moves_when_the_weights_would_overflow() -> None:
    h = hist(half_life=HOUR)
    h.add(1.0, T0)
    h.add(3.0, T0 + 10 * HOUR)
    before = {p: h.percentile(p) for p in (0.0001, 0.5, 0.999)}
    later = T0 + (MAX_DECAY_EXPONENT + 5) * HOUR
    h.add(3.0, later, weight=1e-300)  # no real weight: only the renormalisation shows
    assert h.reference is not None and h.reference > T0 + 50 * HOUR
    assert max(h.weights.values()) < 2.0 ** 10  # rescaled, not 2**105
    assert {p: h.percentile(p) for p in (0.0001, 0.5, 0.999)} == before


def test_subtract_takes_a_sample_back_also_after_renormalising() -> None:
    h = hist(half_life=HOUR)
    h.add(1.0, T0)
    h.add(2.0, T0 + HOUR)
    h.subtract(2.0, T0 + HOUR)
    assert h.percentile(0.99) == pytest.approx(CPU_BUCKETS.start(CPU_BUCKETS.bucket(1.0) + 1))
    h.add(2.0, T0 + 2 * HOUR)
    h.add(1.0, T0 + 200 * HOUR, weight=1e-300)  # shifts the reference
    h.subtract(2.0, T0 + 2 * HOUR)
    assert CPU_BUCKETS.bucket(2.0) not in h.weights


def test_histograms_survive_a_json_round_trip() -> None:
    history = StepHistory.new(half_life=6 * HOUR)
    rng = random.Random(3)
    for run in range(5):
        at = T0 + run * HOUR
        for i in range(20):
            history.add_cpu(at + i, rng.uniform(0.1, 2.0))
        history.set_memory_peak(at, rng.uniform(100, 900) * MI)
        history.count_run()
    text = history.to_json()
    back = StepHistory.from_json(text)
    assert back == history
    assert back.to_json() == text
    assert estimate(back) == estimate(history)


@pytest.mark.parametrize("text", [
    "{not json", "null", "[]", '{"format": 99}', "",
    json.dumps({"format": 1, "runs": 1, "samples": 1, "first_at": None, "last_at": None,
                "cpu": {"reference": None, "half_life": 3600, "weights": {"9999": 1.0}},
                "memory": {"reference": None, "half_life": 3600, "weights": {}}}),
    json.dumps({"format": 1, "runs": -3, "samples": 1, "first_at": None, "last_at": None,
                "cpu": {}, "memory": {}}),
    json.dumps({"format": 1, "runs": 1, "samples": 1, "first_at": None, "last_at": None,
                "cpu": {"reference": "x", "half_life": 0, "weights": {}},
                "memory": {"reference": None, "half_life": 3600, "weights": {}}}),
])
def test_damaged_state_is_a_state_error(text: str) -> None:
    with pytest.raises(StateError):
        StepHistory.from_json(text)


# ----------------------------------------------------------------------------- estimates


def steady_runs(n: int, *, cpu: float = 0.5, memory: float = 400 * MI, start: float = T0,
                every: float = HOUR, samples: int = 30) -> list[list[tuple[float, float, float]]]:
    rng = random.Random(n)
    return [[(start + r * every + i * 10, cpu * rng.uniform(0.9, 1.1),
              memory * rng.uniform(0.97, 1.0)) for i in range(samples)] for r in range(n)]


def test_nothing_from_a_single_run() -> None:
    got = recommend(steady_runs(1))
    assert (got.cpu, got.memory) == (None, None)
    assert got.estimate.cpu is None and got.estimate.memory is None
    assert recommend(steady_runs(2)).memory is not None
    assert recommend(steady_runs(1), RecommenderConfig(min_runs=1)).memory is not None


def test_bounds_are_ordered_and_targets_sit_above_the_percentile() -> None:
    rng = random.Random(7)
    for trial in range(30):
        runs = [[(T0 + r * HOUR + i, rng.lognormvariate(0, 1), rng.lognormvariate(20, 0.5))
                 for i in range(rng.randint(1, 20))] for r in range(rng.randint(2, 15))]
        est = recommend(runs).estimate
        for e in (est.cpu, est.memory):
            assert e is not None
            assert e.lower <= e.target <= e.upper, (trial, e)
            assert e.target >= e.observed * 1.15 * 0.999


def test_thin_evidence_gives_a_wider_margin() -> None:
    few, many = recommend(steady_runs(2)).estimate, recommend(steady_runs(40)).estimate
    assert few.memory is not None and many.memory is not None
    assert few.memory.factor > many.memory.factor > 1.15
    assert few.memory.factor == pytest.approx(1.15 * 1.25)  # (1 + 0.5/2)
    assert many.memory.factor == pytest.approx(1.15 * (1 + 0.5 / 40))
    spread_few = few.memory.upper / few.memory.lower
    spread_many = many.memory.upper / many.memory.lower
    assert spread_few > spread_many


def test_a_single_cpu_spike_does_not_raise_the_target_to_it() -> None:
    """Interpreter start-up at 1.4 cores for a second, then a quiet step: the CPU target
    follows the use over time, not the instantaneous peak."""
    runs = steady_runs(10, cpu=0.1)
    runs[3][0] = (runs[3][0][0], 1.4, runs[3][0][2])
    got = recommend(runs)
    assert got.cpu is not None and got.cpu < 0.2
    assert got.estimate.cpu is not None and got.estimate.cpu.upper < 1.4


def test_one_noisy_run_among_many_changes_no_request() -> None:
    """After 60 steady runs, one run that peaks at twice the memory weighs less than the 5%
    above the p95 target: the published requests stay."""
    base = recommend(steady_runs(60, memory=400 * MI))
    assert base.memory is not None
    noisy = [(t, c, m * 2) for t, c, m in steady_runs(1, start=T0 + 60 * HOUR)[0]]
    after = recommend([noisy], history=base.history, cpu=base.cpu, memory=base.memory)
    assert after.memory == base.memory and after.cpu == base.cpu


def test_memory_follows_a_drift_and_forgets_old_runs() -> None:
    """Runs at 1000Mi, then at 300Mi: after some five half-lives the old runs weigh less
    than 5% and the request comes down."""
    runs = steady_runs(30, memory=1000 * MI) + steady_runs(
        150, memory=300 * MI, start=T0 + 30 * HOUR)
    got = recommend(runs)
    assert got.memory is not None and 300 * MI < got.memory < 400 * MI
    halfway = recommend(runs[:90])  # 2.5 half-lives: the old runs still weigh 10%
    assert halfway.memory is not None and halfway.memory > 1000 * MI


def test_hysteresis() -> None:
    est = recommend(steady_runs(20)).estimate.memory
    assert est is not None
    assert should_update(None, est)
    assert est.lower < est.target * 0.98 and est.target * 1.02 < est.upper
    assert not should_update(est.target * 1.02, est)
    assert not should_update(est.target * 0.98, est)
    assert should_update(est.target * 1.2, est)
    assert should_update(est.target * 0.8, est)
    assert should_update(est.upper * 1.01, est, threshold=10.0)  # outside the bounds
    assert not should_update(est.target * 1.01, est, threshold=0.5)


def test_minimums_and_the_oom_bump() -> None:
    tiny = [[(T0 + r * HOUR, 0.0001, 2.0 * MI)] for r in range(3)]
    est = recommend(tiny, RecommenderConfig(min_cpu=0.05, min_memory=32 * MI)).estimate
    assert est.cpu is not None and est.memory is not None
    assert est.cpu.target == 0.05 and est.cpu.floored and est.cpu.lower == 0.05
    assert est.memory.target == 32 * MI and est.memory.floored
    assert oom_bump(512 * MI) == pytest.approx(512 * MI * 1.2)
    assert oom_bump(100 * MI) == 200 * MI
    assert oom_bump(4096 * MI) == pytest.approx(4096 * MI * 1.2)
    killed = recommend([[(T0, 1.0, 512 * MI)], [(T0 + HOUR, 1.0, 512 * MI)]], oom=[True, True])
    assert killed.memory is not None and killed.memory > 612 * MI


def test_config_is_checked() -> None:
    with pytest.raises(ValueError, match="ordered"):
        RecommenderConfig(cpu_percentile=0.99, cpu_upper_percentile=0.95)
    with pytest.raises(ValueError):
        RecommenderConfig(min_runs=0)
    assert math.isclose(RecommenderConfig().half_life, DAY)


def test_cpu_samples_weigh_the_time_they_cover() -> None:
    """A start-up burst of 1.4 cores over 2 s, then 8 samples of 0.2 cores each over 15 s,
    per run: weighed by time the burst is 2 s of 122 (under the 10% above p90), so the p90
    is the quiet use; counted one sample each it is 1 sample in 9, and the p90 is the burst."""
    timed, counted = StepHistory.new(24 * HOUR), StepHistory.new(24 * HOUR)
    for run in range(5):
        t = T0 + run * HOUR
        timed.add_cpu(t + 2, 1.4, 2.0)
        counted.add_cpu(t + 2, 1.4)
        for i in range(1, 9):
            timed.add_cpu(t + 2 + 15 * i, 0.2, 15.0)
            counted.add_cpu(t + 2 + 15 * i, 0.2)
    assert timed.cpu.percentile(0.9) < 0.25
    assert counted.cpu.percentile(0.9) > 1.3

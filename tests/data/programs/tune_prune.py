"""Tuning with pruning on a static engine: the trials report intermediate values to the study.

Trials 0 and 1 report good values for 5 epochs; every later trial reports bad ones,
slowly, for 40 epochs (10 s), so the median pruner stops it at its first report. Each
trial leaves its objective in a file; a pruned trial leaves "pruned" there
(couler_runtime.tune.report).
"""
import couler.argo as couler

TRIAL = r'''
import os, sys, time
from couler_runtime.tune import report
x = float(sys.argv[1])
n = int(os.environ["COULER_TUNE_TRIAL"])
good = n < 2
for epoch in range(5 if good else 40):
    report(epoch, (0.9 if good else 0.1) + epoch * 0.001)
    time.sleep(0.01 if good else 0.25)
os.makedirs("/tmp/couler-prune", exist_ok=True)
open("/tmp/couler-prune/score", "w").write(repr(0.95 if good else 0.2))
'''


def trial(x):
    # a container step: its python3 is the image's, which has couler-runtime (on Airflow
    # the runner puts the main environment first on PATH; a script step would run with
    # the worker's own Python)
    return couler.run_container(
        image="python:3.12-alpine", command=["python3", "-c", TRIAL], args=[x],
        step_name="fit",
        output=couler.create_parameter_artifact("/tmp/couler-prune/score", name="score"))


couler.config_workflow(name="tune-prune-static")
best = couler.tune(trial, space={"x": couler.uniform(0.0, 1.0)}, trials=4, parallel=1,
                   objective="score", sampler="random", pruner="median", seed=3)
couler.run_container(image="python:3.12-alpine",
                     command=["python3", "-c", "import sys; print(sys.argv[1])"],
                     args=[best.best_value], step_name="use")

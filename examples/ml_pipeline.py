"""Preprocess, train two models in parallel with retries and resources, keep the better one.

Uses Couler's additions to the SDK surface: an explicit `with couler.workflow(...)` scope,
workflow parameters, and retry policies with back-off.
"""

import couler.argo as couler
from couler import ir
from couler.argo_submitter import ArgoSubmitter

with couler.workflow("train-and-select") as wf:
    table = couler.workflow_parameter("table", default="s3://datasets/churn.csv")
    prep = couler.run_container(
        image="python:3.12-slim",
        command=["python", "-m", "prep"],
        args=[table],
        step_name="preprocess",
        output=couler.create_parameter_artifact(path="/tmp/train.uri"),
    )
    retry = ir.RetryPolicy(limit=3, backoff=ir.Backoff(base_seconds=5, factor=2, cap_seconds=60))
    models = couler.concurrent(
        [
            lambda: couler.run_container(
                image="python:3.12-slim",
                command=["python", "-m", "train_xgb"],
                args=prep,
                step_name="xgboost",
                retry=retry,
                resources={"cpu": "2", "memory": "4Gi"},
            ),
            lambda: couler.run_container(
                image="python:3.12-slim",
                command=["python", "-m", "train_lgbm"],
                args=prep,
                step_name="lightgbm",
                retry=retry,
                resources={"cpu": "2", "memory": "4Gi"},
            ),
        ]
    )
    couler.run_container(
        image="python:3.12-slim", command=["python", "-m", "select_best"], step_name="select"
    )
    if __name__ == "__main__":
        couler.run(submitter=ArgoSubmitter())

"""Worked examples for the LLM path: plain-English requests and the spec each should become.

The LLM prompt shows the few most similar to the request (:func:`nearest`), so the model
sees the JSON form of what the request asks (an else branch, a fan-out with a limit, a
schedule, exit hooks, resources, tuning, a loop, a custom image) next to a request that
asks it. They are data: each spec is the JSON of :data:`couler.generate.spec.SPEC_SCHEMA`
over the catalog of :mod:`couler.generate.library`, and a unit test checks that every one
parses and assembles. The offline planner's spec was the starting point of each; they were
then edited by hand where it names steps after long phrases or misses a parameter the
request gives, because an example should show the answer at its best.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from couler.generate.parse import stem, words

__all__ = ["EXAMPLES", "Example", "nearest"]


@dataclass(frozen=True, slots=True)
class Example:
    """A request and the spec (JSON object) that answers it."""

    request: str
    spec: dict[str, Any]


EXAMPLES: tuple[Example, ...] = (
    Example(
        "Load s3://bank/loans.csv, train an XGBoost classifier to predict the default column "
        "and evaluate its AUC. If the AUC is above 0.85 register the model as loans-xgb, "
        "otherwise email ml-team@example.com.",
        {"name": "loans-xgboost", "steps": [
            {"name": "load-loans", "task": "load s3://bank/loans.csv",
             "template": "ingest-object-store", "params": {"source": "s3://bank/loans.csv"}},
            {"name": "train-xgboost", "task": "train an XGBoost classifier",
             "template": "train-xgboost",
             "params": {"target": "default", "task": "classification"},
             "after": ["load-loans"]},
            {"name": "evaluate-auc", "task": "evaluate its AUC", "template": "evaluate-auc",
             "params": {"target": "default"}, "after": ["train-xgboost"]},
            {"name": "register-model", "task": "register the model as loans-xgb",
             "template": "register-model", "params": {"name": "loans-xgb"},
             "after": ["evaluate-auc"],
             "when": {"step": "evaluate-auc", "metric": "auc", "op": ">", "value": 0.85}},
            {"name": "email-team", "task": "otherwise email ml-team@example.com",
             "template": "notify-email",
             "params": {"to": "ml-team@example.com",
                        "subject": "loans model below the AUC bar"},
             "after": ["evaluate-auc"],
             "when": {"step": "evaluate-auc", "metric": "auc", "op": ">", "value": 0.85,
                      "otherwise": True}},
        ]}),
    Example(
        "Split s3://logs/events.parquet into 12 shards and score each shard for anomalies "
        "with the isolation forest at models:/fraud-iforest/3, no more than 4 at a time, "
        "then save the anomalies to s3://logs/anomalies/.",
        {"name": "score-event-shards", "steps": [
            {"name": "load-events", "task": "load s3://logs/events.parquet",
             "template": "ingest-object-store", "params": {"source": "s3://logs/events.parquet"}},
            {"name": "split-shards", "task": "split into 12 shards", "template": "shard-data",
             "params": {"shards": "12"}, "after": ["load-events"]},
            {"name": "fetch-iforest", "task": "the isolation forest at models:/fraud-iforest/3",
             "template": "fetch-model", "params": {"source": "models:/fraud-iforest/3"}},
            {"name": "score-shard", "task": "score each shard for anomalies",
             "template": "score-anomalies", "after": ["split-shards", "fetch-iforest"],
             "foreach": {"shards": 12, "max_parallel": 4}},
            {"name": "save-anomalies", "task": "save the anomalies to s3://logs/anomalies/",
             "template": "write-object-store",
             "params": {"destination": "s3://logs/anomalies/"}, "after": ["score-shard"]},
        ]}),
    Example(
        "Every Monday at 06:00 UTC, query last week's orders from the warehouse, train a "
        "LightGBM regressor on the amount, evaluate its RMSE and write a report.",
        {"name": "weekly-orders-model", "schedule": "0 6 * * 1", "timezone": "UTC",
         "parameters": {"orders-query": ""},
         "steps": [
             {"name": "query-orders", "task": "query last week's orders from the warehouse",
              "template": "ingest-sql", "params": {"query": "{{parameters.orders-query}}"}},
             {"name": "train-lightgbm", "task": "train a LightGBM regressor on the amount",
              "template": "train-lightgbm",
              "params": {"target": "amount", "task": "regression"},
              "after": ["query-orders"]},
             {"name": "evaluate-rmse", "task": "evaluate its RMSE", "template": "evaluate-rmse",
              "params": {"target": "amount"}, "after": ["train-lightgbm"]},
             {"name": "write-report", "task": "write a report", "template": "write-report",
              "params": {"title": "Weekly orders model"}, "after": ["evaluate-rmse"]},
         ]}),
    Example(
        "Train a random forest on s3://fraud/tx.csv to predict is_fraud and evaluate its F1. "
        "If any step fails, post to #ml-alerts; whatever happens, email ops@example.com at "
        "the end.",
        {"name": "fraud-forest", "steps": [
            {"name": "load-transactions", "task": "load s3://fraud/tx.csv",
             "template": "ingest-object-store", "params": {"source": "s3://fraud/tx.csv"}},
            {"name": "train-random-forest", "task": "train a random forest",
             "template": "train-sklearn",
             "params": {"estimator": "RandomForestClassifier", "target": "is_fraud"},
             "after": ["load-transactions"]},
            {"name": "evaluate-f1", "task": "evaluate its F1", "template": "evaluate-f1",
             "params": {"target": "is_fraud"}, "after": ["train-random-forest"]},
         ],
         "on_failure": [
             {"name": "alert-slack", "task": "if any step fails, post to #ml-alerts",
              "template": "notify-webhook",
              "params": {"channel": "#ml-alerts", "message": "fraud-forest failed"}}],
         "on_exit": [
             {"name": "email-ops", "task": "whatever happens, email ops@example.com",
              "template": "notify-email", "params": {"to": "ops@example.com"}}]}),
    Example(
        "Fine-tune Llama 3 8B with LoRA on s3://corpus/chat.jsonl using 4 GPUs and 64Gi of "
        "memory, with up to 2 retries and a 3 hour timeout, then evaluate its perplexity.",
        {"name": "llama-lora", "steps": [
            {"name": "load-corpus", "task": "load s3://corpus/chat.jsonl",
             "template": "ingest-object-store",
             "params": {"source": "s3://corpus/chat.jsonl", "format": "jsonl"}},
            {"name": "fine-tune-llama", "task": "fine-tune Llama 3 8B with LoRA",
             "template": "train-llm-finetune",
             "params": {"model": "meta-llama/Meta-Llama-3-8B", "lora-r": "16"},
             "after": ["load-corpus"], "gpu": 4, "memory": "64Gi", "retries": 2,
             "timeout": "3h"},
            {"name": "evaluate-perplexity", "task": "evaluate its perplexity",
             "template": "evaluate-perplexity", "after": ["fine-tune-llama"]},
        ]}),
    Example(
        "Fine-tune a ResNet-18 on the images in s3://pets/train with 20 trials of Bayesian "
        "optimization over the learning rate and batch size.",
        {"name": "pets-resnet-tuned", "steps": [
            {"name": "load-images", "task": "the images in s3://pets/train",
             "template": "ingest-image-folder", "params": {"source": "s3://pets/train"}},
            {"name": "tune-resnet", "task": "fine-tune a ResNet-18 with 20 trials of Bayesian "
             "optimization", "template": "train-vision-finetune",
             "params": {"model": "resnet18"}, "after": ["load-images"], "gpu": 1,
             "tune": {"trials": 20, "sampler": "tpe", "objective": "accuracy",
                      "direction": "maximize",
                      "space": {"learning-rate": ["0.0001", "0.01"],
                                "batch-size": ["16", "32", "64"]}}},
        ]}),
    Example(
        "Fine-tune a ViT on the images in s3://birds/train in rounds until accuracy reaches "
        "0.95, at most 5 rounds, then export the model to ONNX.",
        {"name": "birds-vit", "steps": [
            {"name": "load-images", "task": "the images in s3://birds/train",
             "template": "ingest-image-folder", "params": {"source": "s3://birds/train"}},
            {"name": "fine-tune-vit", "task": "fine-tune a ViT in rounds",
             "template": "train-vision-finetune", "params": {"model": "vit_b_16"},
             "after": ["load-images"], "gpu": 1,
             "loop": {"max_iterations": 5, "metric": "accuracy",
                      "until": {"op": ">=", "value": 0.95}}},
            {"name": "export-onnx", "task": "export the model to ONNX",
             "template": "export-model", "params": {"format": "onnx"},
             "after": ["fine-tune-vit"]},
        ]}),
    Example(
        "Train XGBoost and LightGBM in parallel on s3://data/churn.csv (label: churned), "
        "evaluate the AUC of each, keep the better one and register it as churn-model.",
        {"name": "churn-two-models", "steps": [
            {"name": "load-churn", "task": "load s3://data/churn.csv",
             "template": "ingest-object-store", "params": {"source": "s3://data/churn.csv"}},
            {"name": "train-xgboost", "task": "train XGBoost", "template": "train-xgboost",
             "params": {"target": "churned"}, "after": ["load-churn"]},
            {"name": "train-lightgbm", "task": "train LightGBM", "template": "train-lightgbm",
             "params": {"target": "churned"}, "after": ["load-churn"]},
            {"name": "evaluate-xgboost", "task": "evaluate the AUC of XGBoost",
             "template": "evaluate-auc", "params": {"target": "churned"},
             "after": ["train-xgboost"]},
            {"name": "evaluate-lightgbm", "task": "evaluate the AUC of LightGBM",
             "template": "evaluate-auc", "params": {"target": "churned"},
             "after": ["train-lightgbm"]},
            {"name": "keep-better", "task": "keep the better one", "template": "rank-models",
             "params": {"metric": "auc", "mode": "max"},
             "after": ["evaluate-xgboost", "evaluate-lightgbm"]},
            {"name": "register-model", "task": "register it as churn-model",
             "template": "register-model", "params": {"name": "churn-model"},
             "after": ["keep-better"]},
        ]}),
    Example(
        "Run our dbt models with the image ghcr.io/acme/dbt:1.8 (dbt run --select marts), "
        "then query the marts.churn table and train a CatBoost classifier on it.",
        {"name": "dbt-then-catboost", "steps": [
            {"name": "run-dbt", "task": "run our dbt models", "image": "ghcr.io/acme/dbt:1.8",
             "command": ["dbt", "run", "--select", "marts"], "timeout": "30m"},
            {"name": "query-churn", "task": "query the marts.churn table",
             "template": "ingest-sql", "params": {"query": "SELECT * FROM marts.churn"},
             "after": ["run-dbt"]},
            {"name": "train-catboost", "task": "train a CatBoost classifier",
             "template": "train-catboost", "params": {"task": "classification"},
             "after": ["query-churn"]},
        ]}),
    Example(
        "Score the customers in a file given at submit time with the model at "
        "models:/churn/Production and write the predictions to the table analytics.churn_scores.",
        {"name": "score-customers", "parameters": {"customers": ""}, "steps": [
            {"name": "fetch-model", "task": "the model at models:/churn/Production",
             "template": "fetch-model", "params": {"source": "models:/churn/Production"}},
            {"name": "load-customers", "task": "the customers in a file given at submit time",
             "template": "ingest-local-files", "params": {"source": "{{parameters.customers}}"}},
            {"name": "predict", "task": "score the customers", "template": "batch-predict",
             "params": {"id-column": "customer_id"},
             "after": ["fetch-model", "load-customers"]},
            {"name": "write-scores", "task": "write the predictions to analytics.churn_scores",
             "template": "write-table", "params": {"table": "analytics.churn_scores"},
             "after": ["predict"]},
        ]}),
    Example(
        "Check the drift of s3://features/today.parquet against s3://features/reference.parquet "
        "and retrain the XGBoost model only if the drift share is above 0.3.",
        {"name": "retrain-on-drift", "steps": [
            {"name": "load-today", "task": "load s3://features/today.parquet",
             "template": "ingest-object-store",
             "params": {"source": "s3://features/today.parquet"}},
            {"name": "check-drift", "task": "check the drift against the reference",
             "template": "check-drift",
             "params": {"reference": "s3://features/reference.parquet"},
             "after": ["load-today"]},
            {"name": "retrain-xgboost", "task": "retrain the XGBoost model",
             "template": "train-xgboost", "after": ["check-drift"],
             "when": {"step": "check-drift", "metric": "drift_share", "op": ">",
                      "value": 0.3}},
        ]}),
    Example(
        "Forecast daily demand from s3://retail/sales.csv 28 days ahead, evaluate the MAPE "
        "of the forecast, and stop the whole run if it takes more than 2 hours.",
        {"name": "demand-forecast", "timeout": "2h", "steps": [
            {"name": "load-sales", "task": "load s3://retail/sales.csv",
             "template": "ingest-object-store", "params": {"source": "s3://retail/sales.csv"}},
            {"name": "forecast-demand", "task": "forecast daily demand 28 days ahead",
             "template": "train-forecaster",
             "params": {"value-column": "demand", "horizon": "28"},
             "after": ["load-sales"]},
            {"name": "evaluate-mape", "task": "evaluate the MAPE of the forecast",
             "template": "evaluate-forecast", "params": {"actual-column": "demand"},
             "after": ["forecast-demand"]},
        ]}),
    Example(
        "Translate the product descriptions in s3://shop/products.csv into German, French "
        "and Dutch with the opus-mt models, at most 2 languages at a time, and save each "
        "translation to s3://shop/translated/.",
        {"name": "translate-products", "steps": [
            {"name": "load-products", "task": "load s3://shop/products.csv",
             "template": "ingest-object-store", "params": {"source": "s3://shop/products.csv"}},
            {"name": "translate", "task": "translate the descriptions into each language",
             "template": "infer-pretrained",
             "params": {"model": "Helsinki-NLP/opus-mt-en-{{item}}", "pipeline": "translation",
                        "column": "description"},
             "after": ["load-products"],
             "foreach": {"items": ["de", "fr", "nl"], "max_parallel": 2}},
            {"name": "save-translations", "task": "save each translation",
             "template": "write-object-store",
             "params": {"destination": "s3://shop/translated/"}, "after": ["translate"]},
        ]}),
)


def _terms(text: str) -> set[str]:
    return {stem(w) for w in words(text) if len(w) > 2}


def nearest(text: str, examples: Sequence[Example] = EXAMPLES, k: int = 3) -> list[Example]:
    """The ``k`` examples whose requests share the most words with ``text`` (Jaccard
    similarity of light stems; ties keep the order of ``examples``)."""
    want = _terms(text)

    def score(e: Example) -> float:
        have = _terms(e.request)
        return len(want & have) / len(want | have) if want | have else 0.0

    ranked = sorted(enumerate(examples), key=lambda p: (-score(p[1]), p[0]))
    return [e for _, e in ranked[:k]]

"""Delivery templates: predict, register, deploy, report, notify and write results back."""

from __future__ import annotations

from couler.generate.library._define import TABULAR_IMAGE, define, param
from couler.generate.templates import Template

__all__ = ["templates"]


def templates() -> tuple[Template, ...]:
    """The deliver templates (their scripts are read now)."""
    return (
        define(
            "batch-predict",
            "deliver",
            (
                "Score a table with a trained model in batch (labels, values "
                "or anomaly flags; probabilities)."
            ),
            "predict, prediction, predictions, batch prediction, batch inference, inference, "
            "score, scoring, apply model, offline inference",
            image=TABULAR_IMAGE,
            params=(
                param("id-column", "", "a column copied to the predictions (row ids)"),
                param("keep-columns", "false", "copy every input column as well"),
                param("format", "csv"),
            ),
            consumes=("model", "data"),
            produces=("predictions",),
        ),
        define(
            "register-model",
            "deliver",
            (
                "Register a trained model in a model registry (MLflow Model "
                "Registry) with its metrics."
            ),
            "register, registry, model registry, mlflow, version, model version, promote, "
            "stage, champion, track, publish model",
            image=TABULAR_IMAGE,
            params=(
                param("name", None, "the registered model's name"),
                param(
                    "tracking-uri-env",
                    "MLFLOW_TRACKING_URI",
                    "the environment variable holding the MLflow tracking URI",
                ),
                param("experiment", "couler"),
                param("stage", "", "an alias to set, e.g. staging or champion"),
            ),
            consumes=("model", "report"),
            produces=("report",),
        ),
        define(
            "deploy-model",
            "deliver",
            ("Deploy a model for online serving: upload it and apply a KServe InferenceService."),
            "deploy, deployment, serve, serving, endpoint, online inference, kserve, "
            "inferenceservice, kubernetes, rollout, roll out, canary, production, release",
            image=TABULAR_IMAGE,
            params=(
                param("name", None, "the service's name (DNS-1123)"),
                param(
                    "storage-uri",
                    None,
                    ("where the model is uploaded: s3://bucket/models/NAME, gs://..., pvc://..."),
                ),
                param("namespace", "default"),
                param("replicas", "1", "minimum replicas"),
                param("apply", "true", "kubectl apply the manifest (false: write it)"),
            ),
            consumes=("model",),
            produces=("report",),
        ),
        define(
            "serve-model",
            "deliver",
            (
                "Serve a tabular model over HTTP (POST /predict with JSON "
                "rows) until stopped or a limit."
            ),
            "serve, serving, http server, rest api, predict endpoint, online predictions, "
            "model server, demo endpoint",
            image=TABULAR_IMAGE,
            params=(
                param("host", "0.0.0.0"),
                param("port", "8080"),
                param("max-requests", "0", "stop after this many requests (0: never)"),
            ),
            consumes=("model",),
        ),
        define(
            "write-report",
            "deliver",
            ("Write a Markdown report of a run: metrics, model cards, rankings and tables."),
            "report, markdown, summary, summarize, document results, model card, write up, "
            "results table",
            image=TABULAR_IMAGE,
            params=(
                param("title", "Model report"),
                param("notes", "", "a paragraph placed under the title"),
            ),
            consumes=("report",),
            produces=("report",),
        ),
        define(
            "notify-webhook",
            "deliver",
            (
                "Post a message to Slack, Microsoft Teams, Discord or any "
                "webhook (URL from a secret)."
            ),
            "notify, notification, alert, message, post, slack, slack channel, teams, "
            "microsoft teams, discord, webhook, chat, ping, #channel, ticket, jira, "
            "github issue, incident, pagerduty, opsgenie",
            image=TABULAR_IMAGE,
            params=(
                param("message", "Workflow finished", "the text posted"),
                param("channel", "", "a Slack channel, e.g. #ml-alerts"),
                param(
                    "url-env",
                    "SLACK_WEBHOOK_URL",
                    "the environment variable holding the webhook URL",
                ),
                param("style", "slack", "slack ({text}), teams, discord or json"),
                param("timeout", "30", "seconds"),
            ),
            consumes=("report",),
            produces=("report",),
        ),
        define(
            "notify-email",
            "deliver",
            (
                "Send an email over SMTP (STARTTLS or SSL; credentials from "
                "secrets) with the run's metrics."
            ),
            "email, e-mail, mail, send email, smtp, notify, notification, alert, inbox",
            image=TABULAR_IMAGE,
            params=(
                param("to", None, "comma-separated recipients"),
                param("subject", "Workflow finished"),
                param("message", "", "the body's first paragraph"),
                param("sender", "couler@localhost"),
                param("smtp-host", "localhost"),
                param("smtp-port", "587"),
                param("security", "starttls", "starttls, ssl or none"),
                param("user-env", "", "the environment variable holding the SMTP user"),
                param("password-env", "", "the environment variable holding the SMTP password"),
            ),
            consumes=("report",),
            produces=("report",),
        ),
        define(
            "write-table",
            "deliver",
            ("Write tables back to a database or warehouse table (SQLAlchemy URL from a secret)."),
            "write back, write table, save to database, insert, load into warehouse, export, "
            "postgres, mysql, snowflake, bigquery, redshift, sql table, store results",
            image=TABULAR_IMAGE,
            params=(
                param("table", None, "the destination table, e.g. analytics.scores"),
                param(
                    "url-env", "DATABASE_URL", "the environment variable holding the SQLAlchemy URL"
                ),
                param("if-exists", "append", "append, replace or fail"),
                param("chunksize", "10000"),
            ),
            consumes=("predictions",),
        ),
        define(
            "write-object-store",
            "deliver",
            (
                "Upload results (predictions, reports, models, data) to S3, "
                "GCS or Azure Blob with fsspec."
            ),
            "upload, save, store, export, write to s3, write to gcs, bucket, object store, "
            "blob, s3, gcs, azure blob, archive results",
            image=TABULAR_IMAGE,
            params=(
                param("destination", None, "s3://bucket/prefix/, gs://..., az://..."),
                param("endpoint", "", "an S3-compatible endpoint URL (MinIO, R2, ...)"),
            ),
            consumes=("predictions",),
        ),
        define(
            "upsert-key-value",
            "deliver",
            ("Upsert rows into a key-value store or cache (Redis hashes) for online serving."),
            "upsert, redis, cache, key-value, key value store, online store, feature store, "
            "set keys, hset, write to redis",
            image=TABULAR_IMAGE,
            params=(
                param("key-column", None, "the column whose value names each key"),
                param("prefix", "couler:", "prepended to every key"),
                param("url-env", "REDIS_URL", "the environment variable holding redis://..."),
                param("ttl", "0", "seconds each key lives (0: forever)"),
            ),
            consumes=("predictions",),
        ),
        define(
            "merge-results",
            "deliver",
            ("Merge results: concatenate shards or predictions, or join tables on a key."),
            "merge, combine, concatenate, concat, join, union, gather shards, collect "
            "results, reduce, stack",
            image=TABULAR_IMAGE,
            params=(
                param("on", "", "join on these comma-separated key columns ('' = stack)"),
                param("how", "inner", "inner, left, right or outer (joins)"),
                param("format", "csv"),
            ),
            consumes=("data",),
            produces=("data",),
        ),
        define(
            "build-vector-index",
            "deliver",
            (
                "Build a vector index for similarity search (FAISS, or "
                "scikit-learn nearest neighbours)."
            ),
            "vector index, vector search, similarity search, nearest neighbours, nearest "
            "neighbors, faiss, ann, knn index, semantic search, retrieval, rag, embeddings "
            "index",
            image=TABULAR_IMAGE,
            params=(
                param("backend", "sklearn", "sklearn (NearestNeighbors) or faiss"),
                param("columns", "", "vector columns"),
                param("metric", "cosine", "cosine or euclidean"),
                param("id-column", "", "the column identifying each vector"),
            ),
            consumes=("data",),
            produces=("model",),
        ),
    )

"""Ingestion templates: bring data in (object stores, HTTP, SQL warehouses, files, queues)."""

from __future__ import annotations

from couler.generate.library._define import TABULAR_IMAGE, define, param
from couler.generate.templates import Template

__all__ = ["templates"]


def templates() -> tuple[Template, ...]:
    """The ingest templates (their scripts are read now)."""
    return (
        define(
            "ingest-object-store",
            "ingest",
            (
                "Download objects (a file or a prefix) from S3, GCS or Azure "
                "Blob storage with fsspec."
            ),
            "download, fetch, load, read, pull, ingest, object storage, object store, bucket, "
            "blob, s3, amazon s3, aws, gcs, google cloud storage, gs://, s3://, azure blob, "
            "minio, fsspec, s3fs, boto3, parquet, csv",
            image=TABULAR_IMAGE,
            params=(
                param("source", None, "s3://bucket/key, gs://bucket/prefix/, az://container/path"),
                param("endpoint", "", "an S3-compatible endpoint URL (MinIO, R2, ...)"),
                param(
                    "key-env",
                    "AWS_ACCESS_KEY_ID",
                    "the environment variable holding the access key",
                ),
                param(
                    "secret-env",
                    "AWS_SECRET_ACCESS_KEY",
                    "the environment variable holding the secret key",
                ),
                param("format", "csv", "file format for a sample:// source"),
            ),
            produces=("data",),
        ),
        define(
            "ingest-http",
            "ingest",
            (
                "Download a file over HTTP(S) (a CSV, Parquet or JSON export,"
                " an archive, an API dump)."
            ),
            "download, fetch, http, https, url, web, api, rest, endpoint, get, curl, wget, "
            "csv export, dataset url, requests",
            image=TABULAR_IMAGE,
            params=(
                param("url", None, "the http(s):// URL (or sample://NAME)"),
                param("filename", "", "the file name to save as (default: the URL's)"),
                param("token-env", "", "an environment variable holding a bearer token"),
                param("timeout", "60", "seconds"),
                param("format", "csv", "file format for a sample:// source"),
            ),
            produces=("data",),
        ),
        define(
            "ingest-sql",
            "ingest",
            (
                "Run a SQL query on a database or warehouse (SQLAlchemy URL "
                "from a secret) into a table."
            ),
            "sql, query, select, database, warehouse, data warehouse, table, postgres, "
            "postgresql, mysql, snowflake, bigquery, redshift, sqlite, sqlalchemy, jdbc, "
            "extract, read table, pull rows",
            image=TABULAR_IMAGE,
            params=(
                param("query", None, "the SELECT statement (or a table name)"),
                param(
                    "url-env",
                    "DATABASE_URL",
                    (
                        "the environment variable holding the SQLAlchemy URL, e.g. "
                        "postgresql://, mysql+pymysql://, snowflake://, bigquery://, "
                        "redshift+redshift_connector://"
                    ),
                ),
                param("format", "parquet", "csv, parquet or jsonl"),
                param("chunksize", "0", "rows per fetch (0: all at once)"),
            ),
            produces=("data",),
        ),
        define(
            "ingest-local-files",
            "ingest",
            ("Copy local or mounted files (a file, a directory or a glob: CSV, Parquet, JSON) in."),
            "local, file, files, folder, directory, mounted, volume, pvc, nfs, disk, path, "
            "csv, parquet, json, read, load, sample data, dataset, breast cancer, iris",
            image=TABULAR_IMAGE,
            params=(
                param("source", None, "a path, a directory or a glob on a mounted volume"),
                param("format", "csv", "file format for a sample:// source"),
            ),
            produces=("data",),
        ),
        define(
            "ingest-queue",
            "ingest",
            (
                "Consume messages from a queue or stream (Kafka, NATS, Amazon"
                " SQS) into a JSON-lines table."
            ),
            "queue, stream, streaming, consume, subscribe, messages, events, kafka, topic, "
            "nats, jetstream, sqs, amazon sqs, pubsub, message queue, broker",
            image=TABULAR_IMAGE,
            params=(
                param("broker", "kafka", "kafka, nats or sqs"),
                param("topic", None, "the Kafka topic, NATS subject or SQS queue URL"),
                param(
                    "url-env",
                    "QUEUE_URL",
                    ("the environment variable holding the bootstrap servers or NATS URL"),
                ),
                param("group", "couler", "the consumer group (kafka)"),
                param("max-messages", "1000", "stop after this many messages"),
                param("timeout", "10", "stop after this many idle seconds"),
            ),
            produces=("data",),
        ),
        define(
            "ingest-image-folder",
            "ingest",
            (
                "Collect an image folder (one sub-folder per class) into a "
                "manifest and a copy of the images."
            ),
            "images, image folder, pictures, photos, image classification dataset, "
            "imagefolder, jpg, png, labelled images, manifest",
            image=TABULAR_IMAGE,
            params=(
                param("source", None, "a directory: SOURCE/<label>/<image>"),
                param("extensions", ".jpg,.jpeg,.png,.bmp,.webp"),
            ),
            produces=("data",),
        ),
    )

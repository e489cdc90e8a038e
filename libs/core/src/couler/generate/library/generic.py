"""General templates: fetch a model, run a pretrained model or a command-line tool, export to
ONNX, measure drift, count anomalies, grade with an LLM judge.

They let a request name work the specialised templates do not cover — "transcribe with
Whisper", "rebuild the dbt models", "push the model to Triton" — and still get a step that
does that work, with what the request did not say left as a parameter to set.
"""

from __future__ import annotations

from couler.generate.library._define import TABULAR_IMAGE, TORCH_IMAGE, define, param
from couler.generate.templates import Template

__all__ = ["templates"]


def templates() -> tuple[Template, ...]:
    """The general templates (their scripts are read now)."""
    return (
        define("fetch-model", "ingest",
               "Fetch a trained model from object storage, a URL, a path or the MLflow registry.",
               "fetch model, download model, pull model, load model, checkpoint, weights, "
               "model registry, pretrained, base model, existing model, production model, "
               "current model, champion",
               image=TABULAR_IMAGE,
               params=(param("source", None, "where the model is: s3://…, https://…, a path or "
                                             "models:/NAME/VERSION"),
                       param("tracking-uri-env", "MLFLOW_TRACKING_URI"))),
        define("run-command", "process",
               "Run a command-line tool (dbt, spark-submit, feast, a vendor CLI) as a step.",
               "run, job, command, cli, tool, script, dbt, spark, spark-submit, emr, databricks, "
               "feast, tecton, hopsworks, materialize, backfill, airbyte, terraform, cluster, "
               "tear down, teardown, shut down, clean up, rebuild, compute, sql job, etl",
               image=TABULAR_IMAGE,
               params=(param("command", None, "the command line to run, e.g. dbt build"),
                       param("workdir", ""), param("timeout", "0"))),
        define("infer-pretrained", "process",
               "Run a pretrained model over data (Hugging Face pipeline): transcribe, detect, "
               "classify, tag, summarize, translate, generate or embed.",
               "transcribe, transcription, speech recognition, asr, whisper, diarize, "
               "diarization, pyannote, detect, detector, detection, yolo, object detection, "
               "segment, classify, sentiment, ner, named entity, tag, tagging, entities, "
               "summarize, summarization, translate, translation, generate, generation, llm, "
               "vllm, mistral, llama, gpt, prompt, embed images, clip, vision, caption, ocr, "
               "inference, pretrained, hugging face, huggingface, pipeline, synthesize, tts, "
               "text-to-speech, rerank, reranker, spacy, align, aligner",
               image=TORCH_IMAGE, gpu=True,
               params=(param("model", None, "a model id or directory"),
                       param("pipeline", "auto"), param("column", ""),
                       param("batch-size", "8"), param("device", "auto"))),
        define("export-model", "deliver",
               "Export a trained model to ONNX for Triton or ONNX Runtime.",
               "export, onnx, convert, conversion, triton, onnx runtime, tensorrt, "
               "torchscript, serialize, package model",
               image=TABULAR_IMAGE,
               params=(param("format", "onnx"), param("opset", "17"))),
        define("check-drift", "evaluate",
               "Measure data drift against a reference table (KS / chi-squared per column); "
               "the metric is the share of drifted columns.",
               "drift, data drift, feature drift, drift share, evidently, distribution shift, "
               "covariate shift, population stability, psi, ks test, monitor data",
               image=TABULAR_IMAGE, metric="drift_share",
               params=(param("reference", None, "the reference table (path or URL)"),
                       param("threshold", "0.05"), param("columns", ""))),
        define("score-anomalies", "evaluate",
               "Score data with an anomaly detector and count the anomalies flagged.",
               "anomalies, anomalous, anomaly, outliers, outlier, flag, flagged, windows, "
               "score readings, detect anomalies, alerts, count anomalies",
               image=TABULAR_IMAGE, metric="anomalies",
               params=(param("id-column", ""),)),
        define("measure-table", "evaluate",
               "Measure one number from a table: a row count, or a column's mean, sum, min, "
               "max or percentile (p99), over the rows a query keeps.",
               "count, number of, how many, rows, records, changed, pages, windows, files, "
               "p50, p90, p95, p99, percentile, latency, average, mean, total, sum, maximum, "
               "minimum, share, fraction, rate, volume, measure, flagged, are flagged, come out, "
               "exceed, above threshold",
               image=TABULAR_IMAGE, metric="value",
               params=(param("stat", "count"), param("column", ""), param("where", ""))),
        define("evaluate-llm-judge", "evaluate",
               "Grade answers with an LLM judge (OpenAI-compatible endpoint); the metric is the "
               "mean score from 1 to 5.",
               "llm judge, judge, grade, grading, rag, assistant, answers, eval set, "
               "faithfulness, answer quality, llm-as-a-judge, judge score",
               image=TABULAR_IMAGE, metric="judge_score",
               params=(param("question-column", "question"), param("answer-column", "answer"),
                       param("reference-column", "reference"), param("model", "gpt-4o-mini"),
                       param("url-env", "JUDGE_BASE_URL"), param("key-env", "JUDGE_API_KEY"))),
    )

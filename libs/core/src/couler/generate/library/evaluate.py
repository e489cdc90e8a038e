"""Evaluation templates: each writes one metric to ``--metric-file`` (and a report)."""

from __future__ import annotations

from couler.generate.library._define import TABULAR_IMAGE, TORCH_IMAGE, define, param
from couler.generate.templates import Template

__all__ = ["templates"]


def templates() -> tuple[Template, ...]:
    """The evaluate templates (their scripts are read now)."""
    return (
        define(
            "evaluate-auc",
            "evaluate",
            ("Evaluate a classifier's ROC AUC on held-out data (one-vs-rest for many classes)."),
            "evaluate, auc, roc auc, roc, area under the curve, score, classifier quality, "
            "binary classification, held-out, test set",
            image=TABULAR_IMAGE,
            params=(param("target", "", "the label column (default: the model's)"),),
            consumes=("model", "data"),
            produces=("report",),
            metric="auc",
        ),
        define(
            "evaluate-f1",
            "evaluate",
            (
                "Evaluate a classifier's F1 score on held-out data (binary, "
                "macro, micro or weighted)."
            ),
            "evaluate, f1, f1 score, f-score, precision, recall, macro f1, classifier "
            "quality, held-out",
            image=TABULAR_IMAGE,
            params=(
                param("target", "", "the label column (default: the model's)"),
                param("average", "auto", "auto"),
            ),
            consumes=("model", "data"),
            produces=("report",),
            metric="f1",
        ),
        define(
            "evaluate-accuracy",
            "evaluate",
            ("Evaluate a classifier's accuracy (and balanced accuracy, confusion matrix)."),
            "evaluate, accuracy, balanced accuracy, confusion matrix, correct predictions, "
            "classifier quality, error rate",
            image=TABULAR_IMAGE,
            params=(param("target", "", "the label column (default: the model's)"),),
            consumes=("model", "data"),
            produces=("report",),
            metric="accuracy",
        ),
        define(
            "evaluate-rmse",
            "evaluate",
            ("Evaluate a regressor's root mean squared error (RMSE; MAE and R2 in the report)."),
            "evaluate, rmse, root mean squared error, mse, mae, regression error, regressor "
            "quality, loss",
            image=TABULAR_IMAGE,
            params=(param("target", "", "the label column (default: the model's)"),),
            consumes=("model", "data"),
            produces=("report",),
            metric="rmse",
        ),
        define(
            "evaluate-mape",
            "evaluate",
            ("Evaluate a regressor's mean absolute percentage error (MAPE, a fraction)."),
            "evaluate, mape, mean absolute percentage error, percentage error, regression "
            "error, forecast error",
            image=TABULAR_IMAGE,
            params=(param("target", "", "the label column (default: the model's)"),),
            consumes=("model", "data"),
            produces=("report",),
            metric="mape",
        ),
        define(
            "evaluate-r2",
            "evaluate",
            ("Evaluate a regressor's coefficient of determination (R2, explained variance)."),
            "evaluate, r2, r squared, r-squared, coefficient of determination, explained "
            "variance, goodness of fit",
            image=TABULAR_IMAGE,
            params=(param("target", "", "the label column (default: the model's)"),),
            consumes=("model", "data"),
            produces=("report",),
            metric="r2",
        ),
        define(
            "evaluate-top-k",
            "evaluate",
            ("Evaluate a classifier's top-k accuracy (the true class among the k most likely)."),
            "evaluate, top-k, top k, top-5, top5, top k accuracy, ranking accuracy, multiclass",
            image=TABULAR_IMAGE,
            params=(
                param("target", "", "the label column (default: the model's)"),
                param("k", "5"),
            ),
            consumes=("model", "data"),
            produces=("report",),
            metric="top_k_accuracy",
        ),
        define(
            "evaluate-calibration",
            "evaluate",
            (
                "Evaluate a classifier's probability calibration: expected "
                "calibration error and Brier score."
            ),
            "evaluate, calibration, calibrated probabilities, expected calibration error, "
            "ece, brier score, reliability diagram, confidence",
            image=TABULAR_IMAGE,
            params=(
                param("target", "", "the label column (default: the model's)"),
                param("bins", "10"),
            ),
            consumes=("model", "data"),
            produces=("report",),
            metric="calibration_error",
        ),
        define(
            "evaluate-perplexity",
            "evaluate",
            ("Evaluate a causal language model's perplexity on held-out text."),
            "evaluate, perplexity, language model, llm, cross entropy, log likelihood, nll, "
            "held-out text",
            image=TORCH_IMAGE,
            params=(
                param("text-column", "text"),
                param("max-length", "512"),
            ),
            consumes=("model", "data"),
            produces=("report",),
            metric="perplexity",
            gpu=True,
        ),
        define(
            "evaluate-wer",
            "evaluate",
            ("Evaluate speech recognition transcripts: word error rate (WER) by edit distance."),
            "evaluate, wer, word error rate, speech recognition, asr, transcripts, edit "
            "distance, levenshtein, jiwer",
            image=TABULAR_IMAGE,
            params=(
                param("reference-column", "reference", "the true transcripts"),
                param("prediction-column", "prediction", "the recognized transcripts"),
            ),
            consumes=("predictions",),
            produces=("report",),
            metric="wer",
        ),
        define(
            "evaluate-forecast",
            "evaluate",
            ("Evaluate a forecast against actuals: MAPE (RMSE, MAE and sMAPE in the report)."),
            "evaluate, forecast accuracy, forecast error, mape, smape, rmse, mae, backtest, "
            "holdout forecast, time series",
            image=TABULAR_IMAGE,
            params=(
                param("actual-column", "actual"),
                param("prediction-column", "prediction"),
            ),
            consumes=("predictions",),
            produces=("report",),
            metric="mape",
        ),
        define(
            "evaluate-recommender",
            "evaluate",
            ("Evaluate a recommender on held-out interactions: recall@k, precision@k, NDCG@k, "
             "hit rate@k or MAP@k."),
            "evaluate, recall@k, recall at k, precision@k, hit rate, ndcg, ndcg@k, map@k, "
            "recommender quality, ranking quality, top-k recommendations",
            image=TABULAR_IMAGE,
            params=(
                param("k", "10"),
                param("exclude-seen", "true", "skip items in the training data"),
                param("metric", "recall", "recall, precision, ndcg, hit_rate or map (@K)"),
            ),
            consumes=("model", "data"),
            produces=("report",),
            metric="score",
        ),
        define(
            "rank-models",
            "evaluate",
            ("Rank trials or candidate models by a metric (a leaderboard) and pick the best one."),
            "rank, ranking, leaderboard, compare models, compare trials, best model, pick "
            "best, select best, winner, champion, sort by metric, rank trials by rmse, keep, "
            "best, better, lower, higher, lowest, highest, select, pick, choose, whichever, "
            "top configurations, top models, winning model",
            image=TABULAR_IMAGE,
            params=(
                param("metric", "auc", "the metric in each metrics.json: auc, f1, rmse..."),
                param("mode", "auto", "max, min, or auto"),
            ),
            consumes=("report",),
            produces=("report",),
            metric="best",
        ),
        define(
            "explain-feature-importance",
            "evaluate",
            (
                "Explain a model: permutation feature importance on held-out "
                "data (what drives predictions)."
            ),
            "explain, explainability, feature importance, permutation importance, shap, "
            "interpretability, what drives, drivers, xai",
            image=TABULAR_IMAGE,
            params=(
                param("target", "", "the label column (default: the model's)"),
                param("repeats", "5"),
                param("top", "20", "features listed in the report"),
            ),
            consumes=("model", "data"),
            produces=("report",),
        ),
    )

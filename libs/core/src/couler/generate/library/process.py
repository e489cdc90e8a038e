"""Processing templates: clean, validate, transform, split and embed data."""

from __future__ import annotations

from couler.generate.library._define import TABULAR_IMAGE, TORCH_IMAGE, define, param
from couler.generate.templates import Template

__all__ = ["templates"]


def templates() -> tuple[Template, ...]:
    """The process templates (their scripts are read now)."""
    return (
        define(
            "clean-impute",
            "process",
            ("Clean a table: drop duplicate rows and mostly-empty columns, impute missing values."),
            "clean, cleanse, impute, imputation, missing values, nan, null, fill, fillna, "
            "drop duplicates, deduplicate, dedupe, median, mean, most frequent, data "
            "cleaning, tidy",
            image=TABULAR_IMAGE,
            params=(
                param("strategy", "median", "median, mean, most_frequent, constant or drop"),
                param("fill-value", "0", "the value of the constant strategy"),
                param(
                    "max-missing", "0.5", "drop columns missing more than this fraction of values"
                ),
                param("drop-duplicates", "true"),
                param("format", "csv"),
            ),
            consumes=("data",),
            produces=("data",),
        ),
        define(
            "validate-schema",
            "process",
            ("Validate tables against a schema (columns, types, ranges, allowed values, nulls)."),
            "validate, validation, schema, check, data quality, expectations, great "
            "expectations, contract, types, ranges, nulls, constraints, assert columns",
            image=TABULAR_IMAGE,
            params=(
                param(
                    "schema",
                    None,
                    (
                        'JSON, or a path to a JSON file: {"columns": {"age": {"type":'
                        ' "number", "min": 0, "max": 120, "nullable": false}, "plan":'
                        ' {"values": ["a","b"]}}}'
                    ),
                ),
                param("on-error", "fail", "fail (exit 1) or report (pass the data on)"),
            ),
            consumes=("data",),
            produces=("data", "report"),
        ),
        define(
            "normalize-features",
            "process",
            ("Normalize numeric features: standardize (z-score), min-max scale or robust-scale."),
            "normalize, normalise, standardize, standardise, z-score, scale, scaling, "
            "min-max, minmax, robust scaler, standardscaler, rescale, feature scaling",
            image=TABULAR_IMAGE,
            params=(
                param("method", "standard", "standard (z-score), minmax or robust"),
                param("columns", "", "comma-separated columns (default: every number)"),
                param("target", "label", "a column never scaled (the label)"),
                param("format", "csv"),
            ),
            consumes=("data",),
            produces=("data",),
        ),
        define(
            "split-train-test",
            "process",
            (
                "Split a table into train and test sets (stratified by the "
                "label when it is a class)."
            ),
            "split, train test split, holdout, hold out, test set, validation set, partition, "
            "stratify, stratified, train/test",
            image=TABULAR_IMAGE,
            params=(
                param("test-size", "0.2", "the fraction of rows held out"),
                param("target", "label", "the label column (stratifies classes)"),
                param("stratify", "auto", "auto, true or false"),
                param("seed", "42"),
                param("format", "csv"),
            ),
            consumes=("data",),
            produces=("data",),
        ),
        define(
            "shard-data",
            "process",
            (
                "Shard a table into N parts (round-robin, or by the hash of a"
                " key column) for parallel work."
            ),
            "shard, shards, partition, chunk, split into parts, parallel, fan out, n parts, "
            "batches, hash partitioning",
            image=TABULAR_IMAGE,
            params=(
                param("shards", "4", "the number of parts"),
                param("key", "", "a column whose rows stay together (hash partitioning)"),
                param("format", "csv"),
            ),
            consumes=("data",),
            produces=("data",),
        ),
        define(
            "tokenize-text",
            "process",
            (
                "Tokenize a text column (word tokens, or a Hugging Face "
                "tokenizer) and build a vocabulary."
            ),
            "tokenize, tokenise, tokenizer, tokens, text, words, vocabulary, vocab, nlp, "
            "wordpiece, bpe, sentencepiece, preprocess text",
            image=TABULAR_IMAGE,
            params=(
                param("column", "text", "the text column"),
                param("tokenizer", "words", "words"),
                param("max-length", "256", "at most this many tokens per row"),
                param("min-count", "1", "vocabulary: words seen at least this often"),
            ),
            consumes=("data",),
            produces=("data",),
        ),
        define(
            "resample-timeseries",
            "process",
            ("Resample a time series to a regular frequency and interpolate the gaps."),
            "resample, time series, timeseries, interpolate, interpolation, frequency, "
            "hourly, daily, weekly, monthly, gaps, aggregate by time, upsample, downsample",
            image=TABULAR_IMAGE,
            params=(
                param("time-column", "date"),
                param("freq", "D", "a pandas frequency: h, D, W, MS, ..."),
                param("agg", "mean", "mean, sum, min, max, last or first"),
                param("interpolate", "linear", "linear, time, ffill, bfill or none"),
                param("group", "", "a column of series ids: each is resampled alone"),
                param("format", "csv"),
            ),
            consumes=("data",),
            produces=("data",),
        ),
        define(
            "encode-categorical",
            "process",
            ("Encode categorical columns: one-hot (dummy) or ordinal encoding."),
            "one-hot, one hot, onehot, encode, encoding, categorical, categories, dummy "
            "variables, dummies, get_dummies, ordinal encoding, label encoding, nominal",
            image=TABULAR_IMAGE,
            params=(
                param("columns", "", "comma-separated (default: every text column)"),
                param("method", "onehot", "onehot or ordinal"),
                param("target", "label", "a column never encoded (the label)"),
                param("max-categories", "50", "rarer categories beyond this many become 'other'"),
                param("drop-first", "false", "drop the first dummy of each column"),
                param("format", "csv"),
            ),
            consumes=("data",),
            produces=("data",),
        ),
        define(
            "engineer-features",
            "process",
            ("Feature engineering: date parts, log transforms, interactions and derived columns."),
            "feature engineering, features, derive, derived columns, date parts, day of week, "
            "log transform, interactions, ratios, transform columns, new columns",
            image=TABULAR_IMAGE,
            params=(
                param("date-columns", "", "columns expanded to year, month, weekday, hour"),
                param("log-columns", "", "columns replaced by log1p(value)"),
                param("interactions", "", "pairs a*b, comma-separated"),
                param(
                    "expressions",
                    "",
                    ("derived columns, ';'-separated pandas expressions: ratio = a / b"),
                ),
                param("format", "csv"),
            ),
            consumes=("data",),
            produces=("data",),
        ),
        define(
            "select-features",
            "process",
            (
                "Select the most informative features (univariate k-best, "
                "variance threshold, model-based)."
            ),
            "feature selection, select features, selectkbest, k best, mutual information, "
            "variance threshold, important features, reduce features, drop useless columns",
            image=TABULAR_IMAGE,
            params=(
                param("method", "kbest", "kbest, variance or model (random forest)"),
                param("k", "20", "features kept (kbest, model)"),
                param("threshold", "0.0", "minimum variance (variance)"),
                param("target", "label"),
                param("format", "csv"),
            ),
            consumes=("data",),
            produces=("data",),
        ),
        define(
            "filter-rows",
            "process",
            ("Filter rows by a condition and keep or drop columns (a pandas query)."),
            "filter, where, query, subset, keep rows, drop rows, select columns, drop "
            "columns, remove outliers rows, condition",
            image=TABULAR_IMAGE,
            params=(
                param("query", "", "keep rows where this holds, e.g. 'age >= 18'"),
                param("keep-columns", "", "comma-separated columns kept"),
                param("drop-columns", "", "comma-separated columns dropped"),
                param("format", "csv"),
            ),
            consumes=("data",),
            produces=("data",),
        ),
        define(
            "balance-classes",
            "process",
            (
                "Balance classes by random oversampling of minority classes "
                "or undersampling the majority."
            ),
            "balance, imbalanced, class imbalance, oversample, oversampling, undersample, "
            "undersampling, resample classes, rare class, minority class",
            image=TABULAR_IMAGE,
            params=(
                param("target", "label"),
                param("method", "oversample", "oversample or undersample"),
                param("seed", "42"),
                param("format", "csv"),
            ),
            consumes=("data",),
            produces=("data",),
        ),
        define(
            "reduce-dimensions",
            "process",
            ("Reduce dimensionality with PCA or truncated SVD (the label column is kept)."),
            "dimensionality reduction, reduce dimensions, pca, principal components, svd, "
            "truncated svd, compress features, embeddings projection",
            image=TABULAR_IMAGE,
            params=(
                param("method", "pca", "pca or svd"),
                param("components", "10"),
                param("target", "label"),
            ),
            consumes=("data",),
            produces=("data",),
        ),
        define(
            "augment-images",
            "process",
            (
                "Augment an image dataset (random flips, rotations, crops, "
                "color jitter) with torchvision."
            ),
            "augment, augmentation, image augmentation, data augmentation, flip, rotate, "
            "crop, color jitter, torchvision transforms, images",
            image=TORCH_IMAGE,
            params=(
                param("copies", "2", "augmented copies per image"),
                param("size", "224", "output side length in pixels"),
                param("rotation", "15", "maximum rotation in degrees"),
                param("seed", "0"),
            ),
            consumes=("data",),
            produces=("data",),
        ),
        define(
            "embed-text",
            "process",
            ("Embed a text column as dense vectors with a sentence-transformers model."),
            "embed, embeddings, vectors, sentence embeddings, sentence-transformers, text "
            "embeddings, encode text, semantic, minilm, bert embeddings",
            image=TORCH_IMAGE,
            params=(
                param("column", "text"),
                param(
                    "model",
                    "sentence-transformers/all-MiniLM-L6-v2",
                    "a sentence-transformers model name or a local path",
                ),
                param("batch-size", "64"),
                param("normalize", "true", "unit-length vectors (cosine similarity)"),
            ),
            consumes=("data",),
            produces=("data",),
            gpu=True,
        ),
    )

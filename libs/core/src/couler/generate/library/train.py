"""Training templates: tabular learners, forecasting, recommenders and deep learning."""

from __future__ import annotations

from couler.generate.library._define import TABULAR_IMAGE, TORCH_IMAGE, define, param
from couler.generate.templates import Template

__all__ = ["templates"]


def templates() -> tuple[Template, ...]:
    """The train templates (their scripts are read now)."""
    return (
        define(
            "train-sklearn",
            "train",
            ("Train any scikit-learn estimator named by a parameter (classifier or regressor)."),
            "train, fit, model, scikit-learn, sklearn, estimator, classifier, regressor, "
            "classification, regression, random forest, randomforestclassifier, "
            "randomforestregressor, logistic regression, logisticregression, linear "
            "regression, ridge, lasso, elasticnet, elastic net, linearsvc, svm, svc, support "
            "vector machine, naive bayes, multinomialnb, gaussiannb, knn, k-nearest "
            "neighbors, decision tree, gradient boosting, extra trees, baseline",
            image=TABULAR_IMAGE,
            params=(
                param(
                    "estimator",
                    "RandomForestClassifier",
                    (
                        "a scikit-learn class: RandomForestClassifier, "
                        "LogisticRegression, Ridge, Lasso, ElasticNet, LinearSVC, "
                        "SVC, MultinomialNB, KNeighborsClassifier, "
                        "GradientBoostingRegressor, ..."
                    ),
                ),
                param("target", "label", "the label column"),
                param("hyperparams", "", "a JSON object of estimator arguments"),
                param("seed", "42"),
            ),
            consumes=("data",),
            produces=("model",),
            metric="validation_score",
        ),
        define(
            "train-xgboost",
            "train",
            ("Train an XGBoost gradient-boosted tree model (classifier or regressor)."),
            "train, fit, xgboost, xgb, gradient boosting, boosted trees, gbm, gbdt, "
            "classifier, regressor, tabular, xgbclassifier, xgbregressor",
            image=TABULAR_IMAGE,
            params=(
                param("target", "label", "the label column"),
                param("task", "auto", "auto, classification or regression"),
                param("n-estimators", "300", "boosting rounds"),
                param("learning-rate", "0.1"),
                param("max-depth", "6"),
                param("hyperparams", "", "a JSON object of more XGBoost arguments"),
                param("seed", "42"),
            ),
            consumes=("data",),
            produces=("model",),
            metric="validation_score",
        ),
        define(
            "train-lightgbm",
            "train",
            ("Train a LightGBM gradient-boosted tree model (classifier or regressor)."),
            "train, fit, lightgbm, lgbm, light gbm, gradient boosting, boosted trees, gbm, "
            "gbdt, classifier, regressor, tabular",
            image=TABULAR_IMAGE,
            params=(
                param("target", "label", "the label column"),
                param("task", "auto", "auto, classification or regression"),
                param("n-estimators", "300", "boosting rounds"),
                param("learning-rate", "0.05"),
                param("num-leaves", "31"),
                param("hyperparams", "", "a JSON object of more LightGBM arguments"),
                param("seed", "42"),
            ),
            consumes=("data",),
            produces=("model",),
            metric="validation_score",
        ),
        define(
            "train-catboost",
            "train",
            ("Train a CatBoost gradient-boosted tree model (classifier or regressor)."),
            "train, fit, catboost, cat boost, gradient boosting, boosted trees, categorical "
            "features, classifier, regressor, tabular",
            image=TABULAR_IMAGE,
            params=(
                param("target", "label", "the label column"),
                param("task", "auto", "auto, classification or regression"),
                param("iterations", "300", "boosting rounds"),
                param("learning-rate", "0.1"),
                param("depth", "6"),
                param("hyperparams", "", "a JSON object of more CatBoost arguments"),
                param("seed", "42"),
            ),
            consumes=("data",),
            produces=("model",),
            metric="validation_score",
        ),
        define(
            "train-anomaly-detector",
            "train",
            (
                "Train an anomaly / outlier detector (IsolationForest, "
                "OneClassSVM, LocalOutlierFactor)."
            ),
            "anomaly detection, anomaly detector, anomalies, outliers, outlier detection, "
            "fraud, novelty detection, isolation forest, isolationforest, one-class svm, "
            "oneclasssvm, local outlier factor, unsupervised",
            image=TABULAR_IMAGE,
            params=(
                param(
                    "estimator",
                    "IsolationForest",
                    ("IsolationForest, OneClassSVM, LocalOutlierFactor or EllipticEnvelope"),
                ),
                param("contamination", "0.05", "the expected share of anomalies"),
                param("target", "label", "a label column left out of the features"),
                param("hyperparams", "", "a JSON object of estimator arguments"),
                param("seed", "42"),
            ),
            consumes=("data",),
            produces=("model",),
        ),
        define(
            "train-clustering",
            "train",
            (
                "Cluster rows (KMeans, MiniBatchKMeans, GaussianMixture, "
                "DBSCAN, Agglomerative): segments."
            ),
            "cluster, clustering, segment, segmentation, customer segments, kmeans, k-means, "
            "dbscan, gaussian mixture, hierarchical, agglomerative, unsupervised, groups",
            image=TABULAR_IMAGE,
            params=(
                param(
                    "estimator",
                    "KMeans",
                    ("KMeans, MiniBatchKMeans, GaussianMixture, DBSCAN or AgglomerativeClustering"),
                ),
                param("clusters", "8", "the number of clusters (not DBSCAN)"),
                param("target", "label", "a label column left out of the features"),
                param("hyperparams", "", "a JSON object of estimator arguments"),
                param("seed", "42"),
            ),
            consumes=("data",),
            produces=("model", "predictions"),
        ),
        define(
            "train-forecaster",
            "train",
            (
                "Fit a time-series forecaster (statsmodels "
                "ExponentialSmoothing / Holt-Winters, SARIMA, ARIMA)."
            ),
            "forecast, forecasting, time series, predict future, demand forecast, exponential "
            "smoothing, holt-winters, exponentialsmoothing, arima, sarima, sarimax, "
            "statsmodels, seasonality, horizon",
            image=TABULAR_IMAGE,
            params=(
                param(
                    "method",
                    "exponential-smoothing",
                    "exponential-smoothing (Holt-Winters), sarima or arima",
                ),
                param("time-column", "date"),
                param("value-column", "value"),
                param("horizon", "30", "steps forecast (and held out to score)"),
                param("seasonal-periods", "7", "the season's length in steps"),
                param("order", "1,1,1", "ARIMA (p,d,q)"),
                param("seasonal-order", "1,1,1", "SARIMA seasonal (P,D,Q)"),
            ),
            consumes=("data",),
            produces=("model", "predictions"),
        ),
        define(
            "train-recommender",
            "train",
            (
                "Train a recommender by matrix factorization (implicit "
                "ALS/BPR, or scikit-learn NMF/SVD)."
            ),
            "recommend, recommender, recommendations, recommendation system, collaborative "
            "filtering, matrix factorization, als, alternating least squares, implicit, bpr, "
            "nmf, svd, user item, ratings",
            image=TABULAR_IMAGE,
            params=(
                param(
                    "algorithm",
                    "als",
                    "als or bpr (the implicit library), nmf or svd (scikit-learn)",
                ),
                param("user-column", "user"),
                param("item-column", "item"),
                param("rating-column", "rating", "interaction strength ('' = 1)"),
                param("factors", "32"),
                param("iterations", "15"),
                param("regularization", "0.05"),
                param("seed", "42"),
            ),
            consumes=("data",),
            produces=("model",),
        ),
        define(
            "train-vision-finetune",
            "train",
            (
                "Fine-tune a pretrained torchvision image classifier (ResNet,"
                " EfficientNet, ViT) on images."
            ),
            "fine-tune, finetune, image classification, vision, computer vision, cnn, resnet, "
            "efficientnet, vit, torchvision, pytorch, transfer learning, pretrained, gpu",
            image=TORCH_IMAGE,
            params=(
                param(
                    "model",
                    "resnet18",
                    ("a torchvision.models name: resnet18, resnet50, efficientnet_b0, vit_b_16"),
                ),
                param("epochs", "3"),
                param("batch-size", "32"),
                param("learning-rate", "0.001"),
                param("size", "224", "input side length in pixels"),
                param("pretrained", "true", "start from ImageNet weights"),
                param("target", "label", "the manifest's label column"),
            ),
            consumes=("data",),
            produces=("model",),
            metric="accuracy",
            gpu=True,
        ),
        define(
            "train-nlp-finetune",
            "train",
            (
                "Fine-tune a Hugging Face transformer for text classification"
                " (optionally LoRA via peft)."
            ),
            "fine-tune, finetune, nlp, text classification, sentiment, transformers, hugging "
            "face, huggingface, bert, distilbert, roberta, deberta, lora, peft, pytorch, gpu",
            image=TORCH_IMAGE,
            params=(
                param(
                    "model", "distilbert-base-uncased", "a Hugging Face model name or local path"
                ),
                param("text-column", "text"),
                param("target", "label"),
                param("epochs", "2"),
                param("batch-size", "16"),
                param("learning-rate", "0.00002"),
                param("max-length", "128"),
                param("lora", "false", "train LoRA adapters (peft) instead of all weights"),
            ),
            consumes=("data",),
            produces=("model",),
            gpu=True,
        ),
        define(
            "train-speech-finetune",
            "train",
            ("Fine-tune a speech recognition model (wav2vec2 CTC) on audio clips and transcripts."),
            "speech, speech recognition, asr, audio, transcribe, wav2vec2, hubert, ctc, "
            "torchaudio, voice, fine-tune, gpu",
            image=TORCH_IMAGE,
            params=(
                param("model", "facebook/wav2vec2-base-960h", "a Hugging Face CTC model"),
                param("audio-column", "path", "audio file paths, relative to the data"),
                param("text-column", "transcript"),
                param("epochs", "3"),
                param("batch-size", "8"),
                param("learning-rate", "0.00003"),
                param("sample-rate", "16000"),
            ),
            consumes=("data",),
            produces=("model",),
            gpu=True,
        ),
        define(
            "train-llm-finetune",
            "train",
            (
                "Fine-tune a causal language model (GPT-2, Llama, Mistral, "
                "Qwen) with LoRA adapters (peft)."
            ),
            "llm, large language model, causal lm, language model, fine-tune, finetune, lora, "
            "qlora, peft, gpt, gpt-2, llama, mistral, qwen, instruction tuning, gpu",
            image=TORCH_IMAGE,
            params=(
                param("model", "gpt2", "a Hugging Face causal LM name or local path"),
                param("text-column", "text"),
                param("epochs", "1"),
                param("batch-size", "8"),
                param("learning-rate", "0.0002"),
                param("max-length", "512"),
                param("lora-r", "8", "LoRA rank (0: train every weight)"),
            ),
            consumes=("data",),
            produces=("model",),
            gpu=True,
        ),
    )

"""Register a trained model in a model registry (MLflow Model Registry) with its metrics."""
from _common import env_secret, fail, need, parser, read_card, write_json

p = parser(__doc__, consumes=("model", "report"), produces=("report",), optional=("report",))
p.add_argument("--name", required=True, help="the registered model's name")
p.add_argument("--tracking-uri-env", default="MLFLOW_TRACKING_URI",
               help="the environment variable holding the MLflow tracking URI")
p.add_argument("--experiment", default="couler")
p.add_argument("--stage", default="", help="an alias to set, e.g. staging or champion")
args = p.parse_args()

import json
from pathlib import Path

card = read_card(args.in_model)
mlflow = need("mlflow")
mlflow.set_tracking_uri(env_secret(args.tracking_uri_env, "--tracking-uri-env"))
mlflow.set_experiment(args.experiment)
metrics = {}
if args.in_report:
    for path in Path(args.in_report).rglob("metrics.json"):
        metrics.update({k: v for k, v in json.loads(path.read_text()).items()
                        if isinstance(v, (int, float))})
with mlflow.start_run(run_name=args.name) as run:
    mlflow.log_params({k: str(v)[:250] for k, v in card.items()
                       if k not in ("features", "classes", "users", "items")})
    if metrics:
        mlflow.log_metrics(metrics)
    mlflow.log_artifacts(args.in_model, artifact_path="model")
    uri = f"runs:/{run.info.run_id}/model"
try:
    version = mlflow.register_model(uri, args.name)
except Exception as e:
    fail(f"--name {args.name}: the registry refused the model ({type(e).__name__}: {e})")
if args.stage:
    mlflow.MlflowClient().set_registered_model_alias(args.name, args.stage, version.version)
write_json(Path(args.out_report) / "registration.json",
           {"name": args.name, "version": version.version, "run": run.info.run_id,
            "alias": args.stage, "metrics": metrics})
print(f"registered {args.name} version {version.version}")

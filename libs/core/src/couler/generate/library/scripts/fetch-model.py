"""Fetch a trained model: a directory or file from S3/GCS/HTTP(S)/a path, or an MLflow
registry URI (models:/NAME/VERSION-or-ALIAS), into a model directory."""
from _common import env_secret, existing, fail, need, out_dir, parser, write_json

p = parser(__doc__, produces=("model",))
p.add_argument("--source", required=True,
               help="s3://…, gs://…, https://…, a local path, or models:/NAME/VERSION")
p.add_argument("--tracking-uri-env", default="MLFLOW_TRACKING_URI",
               help="the environment variable holding the MLflow tracking URI (models:/ only)")
args = p.parse_args()

import shutil
from pathlib import Path

out = out_dir(args.out_model)
if args.source.startswith("models:/"):
    mlflow = need("mlflow")
    mlflow.set_tracking_uri(env_secret(args.tracking_uri_env, "--tracking-uri-env"))
    try:
        local = mlflow.artifacts.download_artifacts(artifact_uri=args.source, dst_path=str(out))
    except Exception as e:  # the registry's errors carry no secrets: the URI is a name
        fail(f"--source {args.source}: {e}")
    print(f"fetched {args.source} -> {local}")
elif "://" in args.source:
    fsspec = need("fsspec")
    try:
        fs, path = fsspec.core.url_to_fs(args.source)
        if fs.isdir(path):
            fs.get(path.rstrip("/") + "/", str(out), recursive=True)
        else:
            fs.get(path, str(out / Path(path).name))
    except FileNotFoundError:
        fail(f"--source {args.source}: no such object")
    except (ImportError, ValueError, OSError) as e:
        fail(f"--source {args.source}: {e}")
    print(f"fetched {args.source} -> {out}")
else:
    src = existing(args.source, "--source")
    if src.is_dir():
        shutil.copytree(src, out, dirs_exist_ok=True)
    else:
        shutil.copy2(src, out / src.name)
    print(f"copied {src} -> {out}")
files = [f for f in out.rglob("*") if f.is_file()]
if not files:
    fail(f"--source {args.source}: nothing was fetched")
if not (out / "card.json").exists():
    write_json(out / "card.json", {"library": "external", "file": files[0].name,
                                   "source": args.source})

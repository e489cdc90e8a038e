"""Deploy a model for online serving: upload it and apply a KServe InferenceService."""
from _common import fail, need, parser, read_card, write_json

p = parser(__doc__, consumes=("model",), produces=("report",))
p.add_argument("--name", required=True, help="the service's name (DNS-1123)")
p.add_argument("--storage-uri", required=True,
               help="where the model is uploaded: s3://bucket/models/NAME, gs://..., pvc://...")
p.add_argument("--namespace", default="default")
p.add_argument("--replicas", default="1", help="minimum replicas")
p.add_argument("--apply", default="true", help="kubectl apply the manifest (false: write it)")
args = p.parse_args()

import json
import re
import shutil
import subprocess
from pathlib import Path

if not re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", args.name):
    fail(f"--name {args.name!r}: not a DNS-1123 label")
card = read_card(args.in_model)
formats = {"sklearn": "sklearn", "xgboost": "xgboost", "lightgbm": "lightgbm",
           "transformers": "huggingface", "torchvision": "pytorch", "catboost": "catboost"}
if card["library"] not in formats:
    fail(f"--in-model: KServe has no runtime for a {card['library']} model")
if not args.storage_uri.startswith("pvc://"):
    fsspec = need("fsspec")
    fs, path = fsspec.core.url_to_fs(args.storage_uri)
    fs.put(str(Path(args.in_model)) + "/", path.rstrip("/") + "/", recursive=True)
manifest = {
    "apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService",
    "metadata": {"name": args.name, "namespace": args.namespace},
    "spec": {"predictor": {"minReplicas": int(args.replicas), "model": {
        "modelFormat": {"name": formats[card["library"]]}, "storageUri": args.storage_uri}}}}
out = Path(args.out_report)
write_json(out / "inferenceservice.json", manifest)
if args.apply == "true":
    if not shutil.which("kubectl"):
        fail("--apply true: kubectl is not on PATH (the step's image needs it)")
    done = subprocess.run(["kubectl", "apply", "-f", "-"], input=json.dumps(manifest),
                          text=True, capture_output=True, check=False)
    if done.returncode:
        fail(f"kubectl apply: {done.stderr.strip()}")
    print(done.stdout.strip())
print(f"{args.name}: {formats[card['library']]} model from {args.storage_uri}")

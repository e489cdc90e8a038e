"""Export a trained model to ONNX (scikit-learn, XGBoost, LightGBM via onnxmltools /
skl2onnx; PyTorch via torch.onnx) for serving runtimes such as Triton or ONNX Runtime."""
from _common import Predictor, fail, need, out_dir, parser, read_card, write_json

p = parser(__doc__, consumes=("model",), produces=("model",))
p.add_argument("--format", default="onnx", help="onnx (the only format for now)")
p.add_argument("--opset", default="17")
args = p.parse_args()

from pathlib import Path

if args.format != "onnx":
    fail(f"--format {args.format!r}: expected onnx")
card = read_card(args.in_model)
out = out_dir(args.out_model)
library = card.get("library")
features = card.get("features") or []
opset = int(args.opset)
if library in ("sklearn", "xgboost", "lightgbm"):
    model = Predictor(args.in_model).model
    if library == "sklearn":
        convert = need("skl2onnx")
        types = need("skl2onnx.common.data_types", package="skl2onnx")
        onx = convert.convert_sklearn(
            model, initial_types=[("input", types.FloatTensorType([None, len(features)]))],
            target_opset=opset)
    else:
        tools = need("onnxmltools")
        types = need("onnxmltools.convert.common.data_types", package="onnxmltools")
        initial = [("input", types.FloatTensorType([None, len(features)]))]
        convert = tools.convert_xgboost if library == "xgboost" else tools.convert_lightgbm
        onx = convert(model, initial_types=initial, target_opset=opset)
    path = out / "model.onnx"
    path.write_bytes(onx.SerializeToString())
elif library == "torch":
    torch = need("torch", "ghcr.io/couler-io/ml-torch:0.1")
    module = torch.load(Path(args.in_model) / card["file"], weights_only=False)
    shape = card.get("input_shape") or [1, 3, 224, 224]
    path = out / "model.onnx"
    torch.onnx.export(module.eval(), torch.randn(*shape), str(path), opset_version=opset)
else:
    fail(f"--in-model {args.in_model}: a {library!r} model cannot be exported to ONNX here "
         "(scikit-learn, XGBoost, LightGBM and PyTorch models can)")
write_json(out / "card.json", {**card, "library": "onnx", "file": path.name,
                               "exported_from": library})
print(f"exported the {library} model to {path} ({path.stat().st_size} bytes)")

"""Serve a tabular model over HTTP (POST /predict with JSON rows) until stopped or a limit."""
from _common import Predictor, need, parser

p = parser(__doc__, consumes=("model",))
p.add_argument("--host", default="0.0.0.0")
p.add_argument("--port", default="8080")
p.add_argument("--max-requests", default="0", help="stop after this many requests (0: never)")
args = p.parse_args()

import json
from http.server import BaseHTTPRequestHandler, HTTPServer

pd = need("pandas")
model = Predictor(args.in_model)


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        self.reply(200, {"ready": True, "library": model.library, "task": model.task})

    def do_POST(self):
        if self.path != "/predict":
            return self.reply(404, {"error": f"no route {self.path}; POST /predict"})
        try:
            rows = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
            frame = pd.DataFrame(rows["instances"] if isinstance(rows, dict) else rows)
            self.reply(200, {"predictions": [
                v.item() if hasattr(v, "item") else v for v in model.predict(frame)]})
        except (ValueError, KeyError, TypeError) as e:
            self.reply(400, {"error": str(e)})

    def reply(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


server = HTTPServer((args.host, int(args.port)), Handler)
print(f"serving the {model.library} model on {args.host}:{server.server_port}", flush=True)
limit = int(args.max_requests)
handled = 0
while not limit or handled < limit:
    server.handle_request()
    handled += 1
server.server_close()

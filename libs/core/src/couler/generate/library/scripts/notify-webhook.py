"""Post a message to Slack, Microsoft Teams, Discord or any webhook (URL from a secret)."""
from _common import env_secret, fail, parser, write_json

p = parser(__doc__, consumes=("report",), produces=("report",), optional=("report",))
p.add_argument("--message", default="Workflow finished", help="the text posted")
p.add_argument("--channel", default="", help="a Slack channel, e.g. #ml-alerts")
p.add_argument("--url-env", default="SLACK_WEBHOOK_URL",
               help="the environment variable holding the webhook URL (a secret reference)")
p.add_argument("--style", default="slack", help="slack ({text}), teams, discord or json")
p.add_argument("--timeout", default="30", help="seconds")
args = p.parse_args()

import json
import urllib.error
import urllib.request
from pathlib import Path

url = env_secret(args.url_env, "--url-env")
text = args.message
if args.in_report:
    for path in sorted(Path(args.in_report).rglob("metrics.json")):
        values = json.loads(path.read_text())
        shown = ", ".join(f"{k}={v:.4g}" for k, v in values.items() if isinstance(v, (int, float)))
        text += f"\n{path.parent.name}: {shown}"
if args.style == "slack":
    body = {"text": text, **({"channel": args.channel} if args.channel else {})}
elif args.style == "teams":
    body = {"text": text}
elif args.style == "discord":
    body = {"content": text}
elif args.style == "json":
    body = {"message": text, "channel": args.channel}
else:
    fail(f"--style {args.style!r}: expected slack, teams, discord or json")
request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
try:
    with urllib.request.urlopen(request, timeout=float(args.timeout)) as response:
        status = response.status
except urllib.error.HTTPError as e:  # the URL is a secret: name the variable, not the URL
    fail(f"--url-env {args.url_env}: the webhook answered HTTP {e.code} {e.reason}")
except (urllib.error.URLError, OSError) as e:
    fail(f"--url-env {args.url_env}: the webhook is unreachable ({getattr(e, 'reason', e)})")
write_json(Path(args.out_report) / "notification.json",
           {"style": args.style, "channel": args.channel, "status": status, "text": text})
print(f"posted {len(text)} characters ({args.style}{' ' + args.channel if args.channel else ''})")

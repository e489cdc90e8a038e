"""Send an email over SMTP (STARTTLS or SSL; credentials from secrets) with the run's metrics."""
from _common import env_secret, fail, parser, write_json

p = parser(__doc__, consumes=("report",), produces=("report",), optional=("report",))
p.add_argument("--to", required=True, help="comma-separated recipients")
p.add_argument("--subject", default="Workflow finished")
p.add_argument("--message", default="", help="the body's first paragraph")
p.add_argument("--sender", default="couler@localhost")
p.add_argument("--smtp-host", default="localhost")
p.add_argument("--smtp-port", default="587")
p.add_argument("--security", default="starttls", help="starttls, ssl or none")
p.add_argument("--user-env", default="", help="the environment variable holding the SMTP user")
p.add_argument("--password-env", default="",
               help="the environment variable holding the SMTP password (a secret reference)")
args = p.parse_args()

import json
import smtplib
from email.message import EmailMessage
from pathlib import Path

body = [args.message] if args.message else []
if args.in_report:
    for path in sorted(Path(args.in_report).rglob("*.md")):
        body.append(path.read_text())
    for path in sorted(Path(args.in_report).rglob("metrics.json")):
        body.append(f"{path.parent.name}: {json.loads(path.read_text())}")
mail = EmailMessage()
mail["From"], mail["To"], mail["Subject"] = args.sender, args.to, args.subject
mail.set_content("\n\n".join(body) or args.subject)
if args.security not in ("starttls", "ssl", "none"):
    fail(f"--security {args.security!r}: expected starttls, ssl or none")
cls = smtplib.SMTP_SSL if args.security == "ssl" else smtplib.SMTP
try:
    with cls(args.smtp_host, int(args.smtp_port), timeout=30) as smtp:
        if args.security == "starttls":
            smtp.starttls()
        if args.user_env:
            smtp.login(env_secret(args.user_env, "--user-env"),
                       env_secret(args.password_env, "--password-env"))
        refused = smtp.send_message(mail)
except (smtplib.SMTPException, OSError) as e:
    fail(f"--smtp-host {args.smtp_host}:{args.smtp_port}: {type(e).__name__}: {e}")
write_json(Path(args.out_report) / "notification.json",
           {"to": args.to, "subject": args.subject, "refused": list(refused)})
print(f"mailed {args.to}")

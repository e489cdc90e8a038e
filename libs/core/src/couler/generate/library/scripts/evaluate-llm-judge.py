"""Grade answers with an LLM judge (an OpenAI-compatible chat endpoint): each question,
reference and answer is scored 1-5; the mean score is the metric."""
from _common import env_secret, fail, need, parser, read_tables, write_json, write_metric

p = parser(__doc__, consumes=("data",), produces=("report",), metric=True)
p.add_argument("--question-column", default="question")
p.add_argument("--answer-column", default="answer")
p.add_argument("--reference-column", default="reference", help="optional")
p.add_argument("--model", default="gpt-4o-mini", help="the judge model")
p.add_argument("--url-env", default="JUDGE_BASE_URL",
               help="the environment variable holding the endpoint (…/v1)")
p.add_argument("--key-env", default="JUDGE_API_KEY",
               help="the environment variable holding the key (a secret reference)")
args = p.parse_args()

import json
import re
import urllib.error
import urllib.request
from pathlib import Path

pd = need("pandas")
base = env_secret(args.url_env, "--url-env").rstrip("/")
key = env_secret(args.key_env, "--key-env")
df = pd.concat([d for _, d in read_tables(args.in_data, "--in-data")], ignore_index=True)
for column in (args.question_column, args.answer_column):
    if column not in df.columns:
        fail(f"no column {column!r} (columns: {', '.join(df.columns)})")
scores = []
for _, row in df.iterrows():
    reference = row.get(args.reference_column, "")
    prompt = (f"Question: {row[args.question_column]}\nReference: {reference}\n"
              f"Answer: {row[args.answer_column]}\nScore the answer from 1 (wrong) to 5 "
              "(fully correct and complete). Reply with the number only.")
    body = {"model": args.model, "messages": [{"role": "user", "content": prompt}],
            "temperature": 0}
    request = urllib.request.Request(f"{base}/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json",
                                              "Authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            text = json.load(response)["choices"][0]["message"]["content"]
    except (urllib.error.URLError, KeyError, ValueError) as e:
        fail(f"the judge endpoint (from {args.url_env}) failed: {e}")
    match = re.search(r"[1-5](?:\.\d+)?", text or "")
    if match is None:
        fail(f"the judge answered {text[:80]!r}, not a score from 1 to 5")
    scores.append(float(match.group(0)))
if not scores:
    fail("--in-data: no rows to grade")
mean = sum(scores) / len(scores)
write_json(Path(args.out_report) / "judge.json", {"scores": scores, "mean": mean})
write_metric(args.metric_file, "judge_score", mean, args.out_report, {"answers": len(scores)})

"""Evaluate speech recognition transcripts: word error rate (WER) by edit distance."""
from _common import fail, parser, read_table, write_metric

p = parser(__doc__, consumes=("predictions",), produces=("report",), metric=True)
p.add_argument("--reference-column", default="reference", help="the true transcripts")
p.add_argument("--prediction-column", default="prediction", help="the recognized transcripts")
args = p.parse_args()

import re


def words(text):
    return re.findall(r"[\w']+", str(text).lower())


def edits(ref, hyp):
    """Levenshtein distance between two word lists (substitutions, deletions, insertions)."""
    row = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        prev, row[0] = row[0], i
        for j, h in enumerate(hyp, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (r != h))
    return row[-1]


df = read_table(args.in_predictions, "--in-predictions", "predictions")
for column, flag in ((args.reference_column, "--reference-column"),
                     (args.prediction_column, "--prediction-column")):
    if column not in df.columns:
        fail(f"{flag} {column!r}: no such column")
errors = total = 0
for ref, hyp in zip(df[args.reference_column], df[args.prediction_column]):
    r = words(ref)
    errors += edits(r, words(hyp))
    total += len(r)
if not total:
    fail(f"--reference-column {args.reference_column!r}: no reference words")
write_metric(args.metric_file, "wer", errors / total, args.out_report,
             {"word_errors": errors, "reference_words": total, "utterances": len(df)})

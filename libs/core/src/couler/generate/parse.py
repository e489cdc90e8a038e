"""Plain English → sub-tasks: a parser of sentences, clauses, verbs, objects and modifiers.

:func:`parse_request` reads a request the way an ML engineer writes one and returns a
:class:`Request`: the workflow's schedule, its sub-tasks in order (each with the clause
it came from, its verb and object, and its modifiers) and what it could not place. It
knows no example sentence; it knows English structure and the vocabulary of ML work:

* **sentences and clauses** — split at sentence ends, ``;``, ``:`` and sequence words
  ("then", "after that", "afterwards", "once … is done", "before …ing", ", and <verb>",
  "and then"); a clause is one sub-task unless it coordinates several objects;
* **parallel work** — "in parallel", "side by side", "concurrently", "at the same time":
  a list of tools or things to build ("CatBoost and a random forest") becomes parallel
  sub-tasks, a list of names ("for German, French and Dutch", "to us-east-1 and
  eu-central-1") or a count ("split into 16 shards … score the shards", "one job per
  fold", "per substation (there are 9)") becomes a fan-out;
* **modifiers** — GPUs ("with 3 GPUs", "on a single V100"), memory ("48Gi of memory"),
  CPUs, retries ("up to 4 retries", "retried 5 times"), timeouts ("a 45-minute timeout",
  "must not run longer than 90 minutes"), limits ("no more than 10 at a time"); a
  sentence of modifiers only ("The scraper … give it 7 retries") applies to the sub-task
  it names;
* **conditions** — "only if NDCG@20 is above 0.42", "if more than 15 windows …",
  "otherwise …", "if it is lower, …"; **hooks** — "if any step fails, page …",
  "whatever the outcome, …"; **loops** — "in rounds …, stop as soon as it passes 0.95 or
  after the 8th round"; **tuning** — "30 Optuna trials with the TPE sampler";
* **schedules** — "every Monday at 06:00", "nightly at 01:15", "every 30 minutes",
  "on the 1st of every month at 03:00" → cron.

Pure: no I/O, no model calls.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

__all__ = ["Condition", "Request", "Task", "parse_request", "stem", "verb_form", "words"]

_NUM_WORDS = {
    "a": 1, "an": 1, "one": 1, "single": 1, "two": 2, "three": 3, "four": 4, "five": 5,
    "six": 6, "seven": 7, "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12,
    "fifteen": 15, "twenty": 20, "thirty": 30, "forty": 40, "fifty": 50, "hundred": 100,
    "couple": 2, "dozen": 12, "both": 2,
}
_NUM = r"(\d+|a|an|one|single|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|" \
       r"fifteen|twenty|thirty|forty|fifty|hundred|couple of|dozen)"
_ORDINAL = {"first": 1, "second": 2, "third": 3, "fourth": 4, "fifth": 5, "sixth": 6,
            "seventh": 7, "eighth": 8, "ninth": 9, "tenth": 10, "twelfth": 12,
            "twentieth": 20}

def _wordset(text: str) -> frozenset[str]:
    return frozenset(text.split())


# Imperative verbs of ML work (base forms; "fine-tune" spelled as written).
VERBS = _wordset("""
add aggregate align analyse analyze annotate append apply archive assemble audit augment
average backfill backtest balance batch benchmark binarize bootstrap bucket build bundle
calibrate call capture cast categorize check chunk classify clean cleanse cluster collate
collect combine commit compare compile compress compute concatenate consume convert copy
count crawl create crop cross-validate curate cut debias decode dedupe deduplicate
delete deploy derive describe detect diarize diff discretize distill download drop dump
email embed emit encode engineer enrich estimate evaluate explain export extract fetch
filter find fine-tune finetune fit flag flatten forecast format freeze gather generate get
grab grade group harvest hash identify impute index infer ingest inspect interpolate join
label launch lemmatize load log look lowercase map mask match materialize materialise
measure merge migrate mine monitor move normalize normalise notify obtain one-hot open
optimize optimise package page pair parse partition persist pick ping plot post
predict prepare preprocess pretrain prime process produce profile promote prune publish
pull push quantize query rank read rerank re-rank fill rebalance rebuild recompute
reconcile record
refresh register reindex release reload remove render reorder repartition replay report
resample rescale reshape resize restore retrain retrieve return reweight roll rotate run
sample sanitize save scale scan schedule score scrape segment select send serve shard
shuffle sign simulate slice smooth snapshot sort split spot standardize standardise
start stem stitch store stream strip submit summarize summarise swap sync synthesize
synthesise tag take tear test threshold tokenize tokenise track train transcode
transcribe transform translate trim truncate tune unzip update upload upsert use validate
vectorize vectorise verify visualize warm watermark whiten write zip
keep choose retain refit assess spin kick shut ship trigger invoke orchestrate backup mirror
replicate purge chart recommend search host expose encrypt decrypt anonymize anonymise redact
pseudonymize union pivot unpivot winsorize clip relabel oversample undersample overwrite
insert vacuum compact subsample stratify judge rerun resume share draw caption recognize
dedup ensemble blend featurize calculate raise escalate terminate destroy provision denoise
enhance upscale decompress untar transfer poll subscribe ensure confirm message alert warn
notify flag re-train re-run fine-tune pre-train post-process postprocess preprocess route
probe block halt pause skip abort cancel gate hold quarantine shift revert rollback canary
switch
""")
_ADVERBS = _wordset("then also first next finally afterwards after that and so please "
                     "just only now immediately subsequently lastly later")
_STOP = _wordset("""
a an the of to in on for from with and or by at as into onto over per each every all any
it its it's this that these those them their they we our us you your is are be been being
was were will should must can could would may might do does done using use via than then
also just only both either which who whom whose what when where while if else otherwise
so such some same other another more most less least up down out off there here after
before once until till about across through within without between among s t yet not no
""")
_PARALLEL = re.compile(r"\b(in parallel|side by side|concurrently|at the same time|"
                       r"simultaneously|at once|in tandem)\b", re.IGNORECASE)
# Model and tool words: a coordinated list of these is parallel work, not a fan-out.
_TOOLS = re.compile(
    r"\b(model|models|classifier|regressor|forest|boost\w*|xgboost|lightgbm|catboost|gbm|"
    r"svm|bayes|ridge|lasso|elastic\s?net|prophet|arima|sarima|smoothing|n-beats|nbeats|"
    r"lstm|gru|transformer|bert|roberta|gpt|llama|t5|resnet|vit|yolo\w*|cnn|knn|"
    r"k-means|kmeans|regression|network|net|autoencoder|features?|embeddings?|index|"
    r"tree|trees|encoder|detector|baseline|ensemble|pipeline|job|report|dashboard|"
    r"table|candidates|vectors?)\b", re.IGNORECASE)


_SPLIT_VERBS = frozenset({"split", "shard", "partition", "chunk", "slice", "cut", "tile",
                          "divide", "break", "batch", "bucket", "repartition"})
_TRAIN_VERBS = frozenset({"train", "fit", "fine-tune", "finetune", "retrain", "backtest",
                          "pretrain", "refit", "tune"})
MODEL_WORDS = re.compile(
    r"\b(?:xgboost|xgb|lightgbm|lgbm|catboost|gbm|forest|boost\w*|regression|regressor|"
    r"classifier|svm|svc|bayes|ridge|lasso|elastic\s?net|knn|mlp|tree|trees|prophet|arima|"
    r"sarima|smoothing|n-beats|lstm|gru|transformer|bert|roberta|t5|resnet|vit|yolo\w*|"
    r"network|autoencoder|model)\b", re.I)


@dataclass(frozen=True, slots=True)
class Condition:
    """A comparison a sub-task runs under: ``metric`` (words) ``op`` ``value``."""

    metric: str
    op: str
    value: str  # a number, or "" when compared with a baseline ("if its WAPE is lower")
    otherwise: bool = False
    source: str = ""  # the clause it came from


@dataclass(slots=True)
class Task:
    """One sub-task of a request."""

    text: str  # the clause (modifier phrases kept), as written
    verb: str
    obj: str  # the clause without its verb and modifier phrases
    stage: int  # tasks of one stage run in parallel; stages run in order
    items: tuple[str, ...] = ()
    max_parallel: int = 0
    gpu: int = 0
    memory: str = ""
    cpu: str = ""
    retries: int = 0
    timeout: int = 0
    condition: Condition | None = None
    hook: str = ""  # "", "failure", "exit", "success"
    loop_max: int = 0
    loop_until: Condition | None = None
    tune_trials: int = 0
    tune_sampler: str = ""
    unconditional: bool = False  # "either way": runs after the condition's metric step
    after_condition_of: int = -1  # stage whose condition this task ignores (either way)
    shards: int = 0  # this task splits its input into N shards

    @property
    def words(self) -> list[str]:
        return words(self.text)


@dataclass(slots=True)
class Request:
    """A parsed request."""

    text: str
    tasks: list[Task] = field(default_factory=list)
    schedule: str = ""
    timezone: str = ""
    context: list[str] = field(default_factory=list)  # sentences that set the scene
    sources: list[str] = field(default_factory=list)  # URIs of context sentences
    data: list[str] = field(default_factory=list)  # "the data comes from the loans table …"
    unplaced: list[str] = field(default_factory=list)  # parts it could not understand
    notes: list[str] = field(default_factory=list)  # how ambiguous parts were read
    timeout: int = 0  # seconds the whole run may take ("the whole thing must finish in 2h")


def words(text: str) -> list[str]:
    """Lowercase word tokens (keeps -, @, ., / inside words)."""
    return [w.strip(".-/") for w in re.findall(r"[a-z0-9][a-z0-9@._/+-]*", text.lower())]


def stem(word: str) -> str:
    """A light stem: plural and verb endings off (``scores`` → ``score``)."""
    w = word.lower()
    for suffix, keep in (("ies", "y"), ("sses", "ss"), ("ches", "ch"), ("shes", "sh"),
                         ("xes", "x"), ("ing", ""), ("ed", ""), ("es", "e"), ("s", "")):
        if w.endswith(suffix) and len(w) - len(suffix) >= 3 and not w.endswith("ss"):
            return w[: len(w) - len(suffix)] + keep
    return w


def _num(text: str) -> int:
    t = text.lower().strip()
    if t.isdigit():
        return int(t)
    return _NUM_WORDS.get(t.split()[0], 0)


# --------------------------------------------------------------------------- masking

_URI = re.compile(r"\b[a-z][a-z0-9+.-]*://[^\s,;()\"']+|[\w.+-]+@[\w-]+\.[\w.-]+\w",
                  re.IGNORECASE)
_DOTTED = re.compile(r"\b(?:\w+\.)+(?:csv|tsv|parquet|jsonl?|zip|tar|gz|tgz|txt|xlsx?|npz?|"
                     r"pt|pth|onnx|pkl|h5|avro|orc|yaml|yml|wav|mp3|mp4)\b|\b\d+\.\d+\b|"
                     r"\be\.g\.|\bi\.e\.|\bvs\.|\betc\.", re.IGNORECASE)


# Quoted text, inline code and SQL statements are data: their words are not clauses.
_QUOTED = re.compile(r"`[^`]{1,200}`|(?<!\w)'[^'\s][^']{0,200}'(?!\w)|\"[^\"]{1,200}\"|"
                     r"\b(?:SELECT|DROP|DELETE|INSERT|UPDATE|CREATE|ALTER|TRUNCATE|GRANT)\b"
                     r"[^;.]{0,200};?(?:\s*--)?")


def _mask(text: str) -> tuple[str, list[str]]:
    kept: list[str] = []

    def repl(m: re.Match[str]) -> str:
        value = m.group(0).rstrip(".:!?")
        kept.append(value)
        return f"\x00{len(kept) - 1}\x01" + m.group(0)[len(value):]

    return _DOTTED.sub(repl, _URI.sub(repl, _QUOTED.sub(repl, text))), kept


def _unmask(text: str, kept: list[str]) -> str:
    return re.sub(r"\x00(\d+)\x01", lambda m: kept[int(m.group(1))], text)


# --------------------------------------------------------------------------- schedules

_DAYS = {"sunday": 0, "monday": 1, "tuesday": 2, "wednesday": 3, "thursday": 4,
         "friday": 5, "saturday": 6}


def _clock(h: str, m: str | None, ampm: str | None) -> tuple[int, int]:
    hour, minute = int(h), int(m or 0)
    ampm = ampm.lower() if ampm else ampm
    if ampm and ampm.startswith("p") and hour < 12:
        hour += 12
    if ampm and ampm.startswith("a") and hour == 12:
        hour = 0
    return hour, minute


_DAY = r"(?:mon|tues|wednes|thurs|fri|satur|sun)day"
_DAY_LIST = re.compile(r"\b(?:(?:every|each|on)\s+)?(" + _DAY + r"s?(?:\s*(?:,|and|&|or)\s*" + _DAY
                       + r"s?)*)\b", re.I)
_ANCHORS = re.compile(
    r"\b(?:every|each)\s+(?:day|night|morning|evening|afternoon|weekday|business\s+day|week|"
    r"month|quarter|year)\b|\b(?:on\s+)?(?:weekdays|weekends|business\s+days)\b|"
    r"\btwice\s+(?:a\s+day|daily)\b|\b(?:twice|two\s+times|three\s+times)\s+(?:a|per)\s+week\b|"
    r"\b(?:every|each)\s+weekend\b|\b(?:three|four)\s+times\s+a\s+day\b|\bquarterly\b|"
    r"\bonce\s+(?:a|per|every)\s+(?:day|week|month)\b|"
    r"\b(?:daily|nightly|weekly|monthly)(?=\s+(?:at|from)\s+\d)|"
    r"(?:^|[,.;:]\s*|\b(?:run|runs|ran|scheduled|is|be|it|them|this|that|job|pipeline|workflow|"
    r"retraining|refresh)\s+)(?:nightly|daily|weekly|monthly)\b|"
    r"\b(?:on\s+)?the\s+(?:\d{1,2}(?:st|nd|rd|th)|first|last)\s+(?:day\s+)?of\s+(?:every|each|"
    r"the)\s+(?:month|quarter)\b|\b(?:every|each|on)\s+" + _DAY + r"s?\b|\b" + _DAY + r"s\b|"
    r"\bat\s+midnight\b|\bscheduled\s+for\b|\b(?:a|an|the|our|this)\s+(?:daily|nightly|weekly|"
    r"hourly|monthly)\s+(?=(?:[\w-]+\s+)?(?:job|run|pipeline|workflow|retrain|retraining|refresh|"
    r"rebuild|sync|export|import|backfill|build|training|scoring|score|update|ingestion|ingest|"
    r"load|check|digest|rollup|report|batch|dag|task|process|evaluation|eval)\b)", re.I)
_PART_OF_DAY = re.compile(r"\bat\s+(\d{1,2})(?::(\d{2}))?\s+(?:o'clock\s+)?in\s+the\s+(morning|"
                          r"afternoon|evening|night)\b|\b(morning|afternoon|evening|night)\s+at\s+"
                          r"(\d{1,2})(?::(\d{2}))?(?!\s*(?:am|pm|a\.m\.|p\.m\.|:))\b", re.I)
_TIMES = re.compile(r"(?:\b(?:at|for|from|starting\s+at)\s+|,\s*|\band\s+)(\d{1,2}):(\d{2})\s*"
                    r"(am|pm|a\.m\.|p\.m\.)?(?:\s*(utc|gmt))?|\b(?:at|and)\s+(\d{1,2})\s*"
                    r"(am|pm|a\.m\.|p\.m\.)(?:\s*(utc|gmt))?|\bat\s+(midnight|noon)\b", re.I)


def _schedule(text: str) -> tuple[str, str, str]:
    """(cron, timezone, text without the schedule phrases)."""
    m = re.search(r"\bevery\s+(\d+)\s+min(?:ute)?s?\b", text, re.I)
    if m is not None:
        return f"*/{int(m.group(1))} * * * *", "", _cut(text, m)
    m = re.search(r"\bevery\s+other\s+hour\b", text, re.I)
    if m is not None:
        return "0 */2 * * *", "", _cut(text, m)
    m = re.search(r"\b(?:every\s+hour|hourly)\s+at\s+(half|(?:a\s+)?quarter)\s+(past|to)"
                  r"(?:\s+the\s+hour)?\b", text, re.I)
    if m is not None:
        minute = 30 if m.group(1).lower() == "half" else 15
        return f"{minute if m.group(2).lower() == 'past' else 60 - minute} * * * *", "", \
            _cut(text, m)
    m = re.search(r"\bevery\s+(?:(\d+|two|three|four|six|eight|twelve)\s+)?hours?\b(?:\s+at\s+"
                  r":?(\d{2})\b)?|(?:^|[,.;:]\s*|\b(?:run|runs|ran|scheduled|is|be)\s+)hourly\b"
                  r"(?:\s+at\s+:?(\d{2})\b(?:\s+(?:minutes\s+)?past(?:\s+the\s+hour)?)?)?|"
                  r"\bhourly\s+at\s+:?(\d{2})\b(?:\s+(?:minutes\s+)?past(?:\s+the\s+hour)?)?",
                  text, re.I)
    if m is not None:
        n = _num(m.group(1)) if m.group(1) else 1
        at = int(m.group(2) or m.group(3) or m.group(4) or 0)
        return (f"{at} */{n} * * *" if n > 1 else f"{at} * * * *"), "", _cut(text, m)
    anchors = list(_ANCHORS.finditer(text))
    if not anchors:
        return "", "", text
    if any("hourly" in a.group(0).lower() for a in anchors):
        first = next(a for a in anchors if "hourly" in a.group(0).lower())
        return "0 * * * *", "", _cut(text, first)
    spans: list[tuple[int, int]] = [a.span() for a in anchors]
    found = " ".join(a.group(0).lower() for a in anchors)
    dow, dom, months = "*", "*", "*"
    days = sorted({_DAYS[d.lower().rstrip("s")] for lst in _DAY_LIST.finditer(text)
                   for d in re.findall(_DAY, lst.group(1), re.I)})
    for lst in _DAY_LIST.finditer(text):
        spans.append(lst.span())
    if days:
        dow = ",".join(str(d) for d in days)
    elif re.search(r"weekday|business\s+day", found):
        dow = "1-5"
    elif "weekend" in found:
        dow = "0,6"
    elif re.search(r"\bweek\b|weekly", found):
        dow = "0"
    if re.search(r"once\s+(?:a|per|every)\s+day", found):
        dow = "*"
    nth = re.search(r"\bthe\s+(\d{1,2}(?:st|nd|rd|th)|first|last)\s+(?:day\s+)?of\s+(?:every|"
                    r"each|the)\s+(month|quarter)", text, re.I)
    if nth is not None:
        spans.append(nth.span())
        word = nth.group(1).lower()
        dom = "1" if word == "first" else "L" if word == "last" else str(int(word[:-2]))
        if nth.group(2).lower() == "quarter":
            months = "1,4,7,10"
    elif re.search(r"\bmonth|monthly", found):
        day = re.search(r"\bon\s+the\s+(\d{1,2})(?:st|nd|rd|th)\b", text, re.I)
        dom = str(int(day.group(1))) if day else "1"
        if day:
            spans.append(day.span())
    if re.search(r"quarter", found) and months == "*":
        dom, months = ("1" if dom == "*" else dom), "1,4,7,10"
    times: list[tuple[int, int]] = []
    zone = ""
    for t in _PART_OF_DAY.finditer(text):
        hour_text, minute_text, part = ((t.group(1), t.group(2), t.group(3)) if t.group(1)
                                        else (t.group(5), t.group(6), t.group(4)))
        later = part.lower() in ("afternoon", "evening") or (
            part.lower() == "night" and int(hour_text) >= 6)
        times.append((int(hour_text) % 12 + (12 if later else 0), int(minute_text or 0)))
        spans.append(t.span())
    for t in _TIMES.finditer(text):
        if t.group(8):
            times.append((0, 0) if t.group(8).lower() == "midnight" else (12, 0))
        elif t.group(5):
            times.append(_clock(t.group(5), None, t.group(6)))
            zone = zone or ("UTC" if t.group(7) else "")
        else:
            times.append(_clock(t.group(1), t.group(2), t.group(3)))
            zone = zone or ("UTC" if t.group(4) else "")
        spans.append(t.span())
    if not times:
        # "nightly 03:10:", "(Mondays 04:00)": a clock time next to the schedule's words
        for t in re.finditer(r"(?<![\d:.])([01]?\d|2[0-3]):([0-5]\d)(?!\d|:\d)\s*(am|pm)?"
                             r"(?:\s*(utc|gmt))?", text, re.I):
            times.append(_clock(t.group(1), t.group(2), t.group(3)))
            zone = zone or ("UTC" if t.group(4) else "")
            spans.append(t.span())
    if not times:
        # "twice a day at 9 and 21", "every day at 6": hours of a 24-hour clock
        bare = re.search(r"\bat\s+((?:[01]?\d|2[0-3])(?:\s*(?:,|and|&)\s*(?:[01]?\d|2[0-3]))*)"
                         r"(?:\s*(?:o'clock|h))?(?=\s*(?:$|[,.;:)]|and\b|on\b|every\b|each\b|"
                         r"utc\b|gmt\b))", text, re.I)
        if bare is not None:
            times += [(int(h), 0) for h in re.findall(r"\d+", bare.group(1))]
            spans.append(bare.span())
    if dom == "L":
        dom = "28-31"  # the last day needs a check in the step; cron cannot say "last"
    if times:
        minute = times[0][1]
        hours = sorted({h for h, mi in times if mi == minute})
        hour = ",".join(str(h) for h in hours)
    else:
        minute, hour = 0, "2" if re.search(r"night", found) else "0"
    merged: list[list[int]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    rest = text
    for start, end in reversed(merged):
        rest = rest[:start] + " " + rest[end:]
    rest = re.sub(r"\s+,", ",", re.sub(r"\b(?:scheduled\s+for|starting)\b", " ", rest,
                                       flags=re.I))
    return f"{minute} {hour} {dom} {months} {dow}", zone, rest


def _cut(text: str, m: re.Match[str]) -> str:
    return text[: m.start()] + " " + text[m.end():]



# --------------------------------------------------------------------------- modifiers

_UNIT_SECONDS = {"s": 1, "sec": 1, "second": 1, "m": 60, "min": 60, "minute": 60, "h": 3600,
                 "hr": 3600, "hour": 3600, "d": 86400, "day": 86400}
_DUR = r"(\d+(?:\.\d+)?|" + _NUM[1:-1] + r")[\s-]*(seconds?|secs?|minutes?|mins?|hours?|hrs?|" \
       r"days?|h|m|s)\b"
_TIMEOUTS = [
    re.compile(_DUR + r"[\s-]+(?:time[\s-]?out|time\s+limit|limit|deadline|cap|budget)"
               r"(?:\s+(?:per|on|for)\s+(?:each\s+|every\s+|the\s+)?[\w-]+(?:\s+(?:job|step))?)?",
               re.I),
    re.compile(r"(?:time[\s-]?out|time\s+limit|limit)\s+of\s+" + _DUR, re.I),
    # "Timeout for the whole thing is 15 min", "time limit: 2h"
    re.compile(r"\b(?:time[\s-]?out|time\s+limit|deadline)(?:\s+(?:for|on|of)\s+(?:[\w-]+\s+)"
               r"{0,3}?[\w-]+)?\s*(?:is|=|:|should\s+be|will\s+be)\s+" + _DUR, re.I),
    # "kill any run that goes past 2h"
    re.compile(r"\b(?:kill|stop|abort|cancel)\s+(?:any|each|every|the|a)\s+[\w-]+\s+(?:that|which|"
               r"if\s+it|when\s+it)\s+(?:goes|runs|takes|lasts)\s+(?:past|over|beyond|longer\s+"
               r"than|more\s+than)\s+" + _DUR, re.I),
    re.compile(r"(?:(?:must|should|may)?\s*(?:not|never)|shouldn'?t|mustn'?t|can'?t|cannot|won'?t)"
               r"\s+(?:run|take|last)\s+(?:any\s+)?"
               r"(?:longer|more)\s+than\s+" + _DUR, re.I),
    re.compile(r"(?:time\s+out|be\s+killed|abort|stop\s+it)\s+after\s+" + _DUR, re.I),
    re.compile(r"(?:(?:be\s+)?(?:killed|stopped|aborted|cancelled)\s+)?(?:if|when|once)\s+(?:it|they)\s+"
               r"(?:runs?|takes?|lasts?)\s+(?:any\s+)?(?:longer|more)\s+than\s+" + _DUR, re.I),
    re.compile(r"\bat\s+most\s+" + _DUR + r"(?:\s+(?:per|each|of\s+runtime))?", re.I),
    re.compile(r"\b(?:cap|capping|limit|limiting)\s+(?:it|them|(?:the|each)\s+(?:whole\s+|entire\s+)?[\w-]+"
               r"(?:\s+(?:step|job))?)\s+(?:at|to)"
               r"\s+" + _DUR, re.I),
    re.compile(r"\b(?:within|in\s+under|under)\s+" + _DUR + r"(?=\s*(?:[,.;)]|$))", re.I),
    # "each capped at 40 minutes", "limited to 2 hours"
    re.compile(r"\b(?:(?:each|every\s+[\w-]+|it|they|all)\s+)?(?:capped|limited|bounded)\s+"
               r"(?:at|to)\s+" + _DUR, re.I),
    re.compile(r"\b(?:taking|lasting|running)\s+no\s+(?:longer|more)\s+than\s+" + _DUR, re.I),
    # "kill the job if it's still running after 6 hours"
    re.compile(r"\b(?:kill|stop|abort|cancel)\s+(?:it|them|(?:the|each|any)\s+[\w-]+)\s+(?:if|when|"
               r"once)\s+(?:it'?s|it\s+is|they'?re|they\s+are)\s+still\s+(?:running|going)\s+"
               r"(?:after|past|beyond)\s+" + _DUR, re.I),
    # "a 5 hour ceiling", "an 8-hour wall clock"
    re.compile(_DUR + r"[\s-]+(?:ceiling|wall[\s-]?clock|runtime\s+(?:limit|cap)|max(?:imum)?)\b",
               re.I),
    # "allow up to 2.5 hours", "give it at most 90 minutes"
    re.compile(r"\b(?:allow|allowing|give\s+it|giving\s+it)\s+(?:it\s+)?(?:up\s+to|at\s+most|no\s+"
               r"more\s+than)\s+" + _DUR, re.I),
    # "Cap the FinBERT step at 50 minutes"
    re.compile(r"\b(?:cap|limit)\s+the\s+(?:[\w-]+\s+){0,3}?(?:step|job|task|stage|run)\s+(?:at|to)\s+"
               + _DUR, re.I),
]
_GPU_NAMES = r"(?:gpus?|v100s?|a100s?|h100s?|t4s?|l4s?|a10g?s?|rtx\s?\d+s?|cuda\s+devices?)"
_GPUS = [
    re.compile(r"\b" + _NUM + r"\s+(?:nvidia\s+|more\s+)?(?:\w+\s+)?" + _GPU_NAMES + r"\b"
               r"(?:\s+(?:each|per\s+\w+))?", re.I),
    re.compile(r"\b(?:on|using|with)\s+(?:the\s+|a\s+|its\s+own\s+|their\s+own\s+)?(?:single\s+)?"
               + _GPU_NAMES + r"\b", re.I),
    re.compile(r"\b" + _GPU_NAMES + r"\s+(?:each|per\s+\w+)\b", re.I),
]
_MEMORY = re.compile(r"\b(\d+(?:\.\d+)?)\s*(gi|gib|gb|g|gigs?|gigabytes?|mi|mib|mb|megabytes?|ti|"
                     r"tib|tb|terabytes?)\b"
                     r"(?:\s+of\s+(?:\w+\s+)?(?:memory|ram))?(?:\s+(?:memory|ram))?", re.I)
_CPUS = re.compile(r"\b" + _NUM + r"\s+(?:v?cpus?|cpu\s+cores?|cores?)\b", re.I)
_RETRIES = [
    re.compile(r"(?:with\s+|give\s+it\s+|allow\s+)?(?:up\s+to\s+|at\s+most\s+)?" + _NUM +
               r"\s+(?:retries|retry\s+attempts|re-?tries|attempts)\b", re.I),
    re.compile(r"\b(?:be\s+)?retr(?:y|ied|ies)\s+(?:it\s+|them\s+|(?:each|every|all|any)\s+"
               r"(?:failed\s+|failing\s+)?[\w-]+\s+|the\s+(?:failed\s+|failing\s+)?(?:steps?|"
               r"tasks?|jobs?)\s+|(?:the|that|this)\s+"
               r"([\w-]+(?:\s+[\w-]+)?)\s+)?(?:up\s+to\s+|at\s+most\s+)?"
               + _NUM + r"\s+times?\b(?:\s+before\s+giving\s+up)?", re.I),
    # "retry each shard twice", "retry failed uploads three times"
    re.compile(r"\b(?:be\s+)?retr(?:y|ied|ies)\s+(?:it\s+|them\s+|((?:each|every|all|any|the)\s+"
               r"(?:failed\s+|failing\s+)?[\w-]+(?:\s+[\w-]+)?)\s+|(?:failed|failing)\s+[\w-]+\s+)?"
               r"(twice|thrice)\b", re.I),
    # "retrying failed fetches up to 5 times", "retry the copy as many as 4 times", "retry
    # each partition up to twice"
    re.compile(r"\b(?:be\s+)?retr(?:y|ying|ied|ies)\s+(?:it\s+|them\s+|((?:each|every|all|any|the)\s+"
               r"(?:failed\s+|failing\s+)?[\w-]+(?:\s+[\w-]+)?)\s+|(?:failed|failing)\s+[\w-]+\s+)?"
               r"(?:up\s+to|as\s+many\s+as|at\s+most|a\s+maximum\s+of)\s+(twice|thrice|(?:"
               + _NUM[1:-1] + r")(?:\s+times)?)\b", re.I),
]
_MAX_PARALLEL = [
    re.compile(r"\b(?:in\s+)?(?:parallel\s+)?(?:batches|groups|waves)\s+of\s+" + _NUM + r"\b",
               re.I),
    re.compile(r"\b(?:no\s+more\s+than|at\s+most|up\s+to|max(?:imum)?(?:\s+of)?|limit(?:ed|ing)?"
               r"\s+(?:it\s+|them\s+|this\s+)?to)\s+" + _NUM
               + r"\s+(?:\w+\s+){0,2}?(?:at\s+a\s+time|at\s+once|"
               r"(?:running\s+|run\s+)?(?:concurrently|in\s+parallel|simultaneously|in\s+flight|together|"
               r"concurrent(?:\s+\w+)?|parallel\s+\w+))\b", re.I),
    re.compile(r"\b" + _NUM + r"\s+(?:\w+\s+){0,2}?at\s+a\s+time\b", re.I),
]
_FAN_WORDS = r"(?:jobs?|runs?|tasks?|copies|workers?|pods?|models?|processes)"


def _take(pattern: re.Pattern[str], text: str) -> tuple[re.Match[str] | None, str]:
    m = pattern.search(text)
    if m is None:
        return None, text
    return m, (text[: m.start()] + " " + text[m.end():])


def _duration(number: str, unit: str) -> int:
    n = float(number) if re.match(r"\d", number) else _num(number)
    u = unit.lower().rstrip("s") or unit.lower()
    u = {"minute": "minute", "min": "min", "hour": "hour", "hr": "hr", "sec": "sec",
         "second": "second", "day": "day"}.get(u, u)
    return int(n * _UNIT_SECONDS.get(u, _UNIT_SECONDS.get(u[:1], 60)))


@dataclass(slots=True)
class _Mods:
    gpu: int = 0
    memory: str = ""
    cpu: str = ""
    retries: int = 0
    timeout: int = 0
    max_parallel: int = 0
    parallel: bool = False
    about: str = ""  # the step a modifier names ("retry the snapshot up to 3 times")
    per_item: bool = False  # a request per item ("one GPU per quarter"): the step fans out

    def any(self) -> bool:
        return bool(self.gpu or self.memory or self.cpu or self.retries or self.timeout
                    or self.max_parallel)


def _modifiers(text: str) -> tuple[_Mods, str]:
    """Modifiers of a clause and the clause without them."""
    mods = _Mods()
    for pattern in _RETRIES:
        m, text = _take(pattern, text)
        if m is not None:
            named = [g for g in m.groups() if g and not re.fullmatch(_NUM, g, re.I)]
            mods.about = named[0] if named and pattern is _RETRIES[1] else ""
            if pattern is _RETRIES[2]:
                n = 2 if m.group(2).lower() == "twice" else 3
                mods.about = ""
                text = f"{text} {m.group(1) or ''}"  # "each shard" still says what is mapped
            elif pattern is _RETRIES[3]:
                count = re.sub(r"\s+times$", "", m.group(2).lower())
                n = {"twice": 2, "thrice": 3}.get(count) or _num(count)
                mods.about = ""
                text = f"{text} {m.group(1) or ''}"
            else:
                n = _num(m.group(len(m.groups())) if pattern is _RETRIES[1] else m.group(1))
            # "up to 3 attempts": the first run and two retries
            mods.retries = max(n - 1, 0) if re.search(r"attempts\b", m.group(0), re.I) and \
                not re.search(r"retry\s+attempts", m.group(0), re.I) else n
            break
    for pattern in _MAX_PARALLEL:
        m, text = _take(pattern, text)
        if m is not None:
            mods.max_parallel = _num(m.group(1))
            mods.parallel = True
            break
    for pattern in _TIMEOUTS:
        m, text = _take(pattern, text)
        if m is not None:
            mods.timeout = _duration(m.group(1), m.group(2))
            break
    for i, pattern in enumerate(_GPUS):
        m, text = _take(pattern, text)
        if m is not None:
            mods.gpu = _num(m.group(1)) if i == 0 else 1
            mods.per_item = bool(re.search(r"\b(?:each|per)\b", m.group(0), re.I))
            break
    m, text = _take(_MEMORY, text)
    if m is not None:
        number, unit = m.group(1), m.group(2).lower()
        suffix = "Ti" if unit.startswith("t") else "Mi" if unit.startswith("m") else "Gi"
        mods.memory = f"{number}{suffix}"
    m, text = _take(_CPUS, text)
    if m is not None:
        mods.cpu = str(_num(m.group(1)))
    if _PARALLEL.search(text):
        mods.parallel = True
        text = _PARALLEL.sub(" ", text)
    return mods, text


# --------------------------------------------------------------------------- conditions

_COMPARATORS: list[tuple[str, str]] = [
    (r"(?:is|are|comes?\s+out|stays?)?\s*(?:at\s+least|no\s+less\s+than|not\s+below|"
     r"greater\s+than\s+or\s+equal\s+to|>=|=>|\u2265)", ">="),
    (r"(?:is|are)?\s*(?:at\s+most|no\s+more\s+than|not\s+above|less\s+than\s+or\s+equal\s+to|"
     r"<=|=<|\u2264)", "<="),
    (r"(?:is|are|goes|rises|gets)?\s*(?:above|over|greater\s+than|higher\s+than|more\s+than|"
     r"better\s+than|exceeds?|beats?|tops?|>)", ">"),
    (r"(?:reach(?:es)?|hits?|passes|clears|meets)", ">="),
    (r"(?:is|are|drops?|falls?|goes|dips?|gets)?\s*(?:below|under|less\s+than|lower\s+than|"
     r"worse\s+than|beneath|<)", "<"),
    (r"(?:is|are)?\s*(?:equal\s+to|exactly|==?)", "=="),
    (r"(?:is|are|gets?|comes?\s+out)?\s*(?:lower|smaller|less|worse|down)", "<"),
    (r"(?:is|are|gets?|comes?\s+out)?\s*(?:higher|larger|greater|better|up)", ">"),
]
_VALUE = r"(-?\d+(?:\.\d+)?\s*%?|\x00\d+\x01)"
_COND_LEAD = re.compile(r"^\s*(?:and\s+|but\s+)?(?:only\s+)?(?:if|when|whenever|provided\s+that|"
                        r"as\s+long\s+as|in\s+case)\s+", re.I)
_COND_TAIL = re.compile(r"\s+(?:but\s+)?(?:only\s+)?(?:if|when|provided\s+that|as\s+long\s+as)\s+"
                        r"(.+)$", re.I)
_ELSE = re.compile(r"^\s*(?:and\s+)?(?:otherwise|else|if\s+not|if\s+(?:it|that|they|this)\s+"
                   r"(?:is|are)\s+(?:lower|higher|worse|not|below|above|under|less)\b[^,]*|"
                   r"in\s+the\s+other\s+case|if\s+it\s+does\s+not|if\s+it\s+doesn't)\s*,?\s*",
                   re.I)


def _comparison(text: str) -> tuple[str, str, str] | None:
    """(metric words, op, value) of a condition clause, or None."""
    masked_numbers = text
    # "more than 15 windows come out anomalous": the count is the metric's value
    m = re.search(r"\b(more|fewer|less)\s+than\s+" + _VALUE + r"\s+(.+)$", masked_numbers, re.I)
    if m is not None:
        op = ">" if m.group(1).lower() == "more" else "<"
        return m.group(3), op, m.group(2).replace("%", "").strip()
    m = re.search(r"\b(?:at\s+least|at\s+most)\s+" + _VALUE + r"\s+(\w.+)$", text, re.I)
    if m is not None and not re.match(r"\d", m.group(2)):
        op = ">=" if "least" in m.group(0).lower() else "<="
        return m.group(2), op, m.group(1).replace("%", "").strip()
    # "if F1 is 0.88 or higher", "a recall of 0.6 or better": the value is included
    m = re.search(r"^(.*?)\s+(?:(?:is|are|of|comes?\s+out\s+at)\s+)?" + _VALUE + r"\s+or\s+"
                  r"(higher|above|more|better|greater|over|lower|below|less|fewer|under|worse)\b",
                  text, re.I)
    if m is not None and m.group(1).strip():
        up = m.group(3).lower() in ("higher", "above", "more", "better", "greater", "over")
        return m.group(1), ">=" if up else "<=", m.group(2).replace("%", "").strip()
    for phrase, op in _COMPARATORS:
        m = re.search(r"^(.*?)\s+" + phrase + r"\s+(?:a\s+|an\s+|the\s+)?(?:value\s+of\s+|"
                      r"score\s+of\s+)?" + _VALUE, text, re.I)
        if m is not None and m.group(1).strip():
            return m.group(1), op, m.group(2).replace("%", "").strip()
    for phrase, op in _COMPARATORS:
        m = re.search(r"^(.*?)\s+" + phrase + r"\b(.*)$", text, re.I)
        if m is not None and m.group(1).strip():
            # a baseline with its value: "beats the current production NDCG@10 of 0.512"
            known = re.search(r"(?:\bof|\bat|=|:|\()\s*" + _VALUE + r"\s*\)?\s*\.?\s*$",
                              m.group(2))
            if known is not None:
                return m.group(1), op, known.group(1).replace("%", "").strip()
            # compared with a baseline ("its WAPE is lower than production's")
            return m.group(1) + " " + m.group(2), op, ""
    return None


# --------------------------------------------------------------------------- hooks

_FAILS = (r"(?:ever\s+)?(?:fails?|errors?(?:\s+out)?|breaks|crashes|goes\s+wrong|blows\s+up|"
          r"dies)\b")
_HOOK_FAILURE = re.compile(
    r"^\s*(?:and\s+|but\s+)?(?:if|when|whenever|in\s+case|should|on)\s+(?:any\s+(?:step|task|"
    r"job|part)s?(?:\s+of\s+(?:it|them|the\s+\w+))?|any\s+of\s+(?:it|this|them|these|those|the\s+[\w-]+)|"
    r"anything(?:\s+in\s+the\s+(?:run|workflow|pipeline))?|something|it|this|that|they|"
    r"(?:the|a|this|our)\s+(?:[\w-]+\s+){0,3}?[\w-]+)\s+" + _FAILS + r"\s*,?\s*(?:then\s+)?|"
    r"^\s*(?:on|upon|in\s+case\s+of)\s+(?:any\s+)?(?:failure|error)s?\s*,?\s*", re.I)
_HOOK_FAILURE_TAIL = re.compile(
    r",?\s+(?:if|when|whenever|in\s+case|should)\s+(?:any\s+(?:step|task|job|stage|part)|"
    r"anything|something|"
    r"the\s+(?:whole\s+)?(?:workflow|pipeline|run|job|dag)|it)\s+" + _FAILS + r"\s*$|"
    r",?\s+(?:on|upon|in\s+case\s+of)\s+(?:any\s+)?failure\s*$", re.I)
_HOOK_SUCCESS = re.compile(
    r"^\s*(?:and\s+)?(?:if|when|once)\s+(?:everything|all\s+steps|the\s+(?:whole\s+)?"
    r"(?:workflow|pipeline|run))\s+(?:succeeds?|completes?\s+successfully|passes)\s*,?\s*|"
    r"^\s*on\s+success\s*,?\s*", re.I)
_HOOK_EXIT = re.compile(
    r"^\s*(?:and\s+)?(?:(?:when|whenever|once|after)\s+(?:the\s+)?(?:whole\s+)?(?:workflow|run|pipeline|"
    r"job|dag)\s+(?:ends|finishes|completes|is\s+(?:done|over|finished))\s*,?\s*)?(?:whatever\s+(?:the\s+)?(?:outcome|result|happens)|regardless\s+of\s+"
    r"(?:the\s+)?(?:outcome|result|status)|no\s+matter\s+(?:what(?:\s+happens)?|the\s+outcome|"
    r"how\s+(?:it|they|things|the\s+[\w-]+(?:\s+[\w-]+)?)\s+(?:ends?|goes|turns\s+out))|in\s+(?:any|every|all)\s+cases?|always|success\s+or\s+(?:not|failure)|pass\s+or\s+fail|"
    r"whether\s+(?:it|they|this|that|everything|(?:the|all)\s+[\w-]+)\s+(?:succeeds?|passes|works|"
    r"fails?)\s+or\s+(?:not|fails?|succeeds?)|"
    r"(?:at\s+the\s+end|when\s+(?:the\s+)?(?:workflow|run|pipeline|job|dag)\s+(?:ends|"
    r"finishes|completes|is\s+(?:done|over)))(?=\s*,))\s*,?\s*", re.I)
_HOOK_EXIT_TAIL = re.compile(
    r",?\s+(?:no\s+matter\s+(?:what(?:\s+happen(?:s|ed))?|the\s+outcome|how\s+it\s+ends)|"
    r"whatever\s+happens|regardless\s+of\s+(?:the\s+)?(?:outcome|result|status)|"
    r"(?:whether\s+it\s+)?(?:succeeds?|passes)\s+or\s+(?:not|fails?))\s*$", re.I)
_AT_END = re.compile(r"\s*,?\s*\b(?:at\s+the\s+(?:very\s+)?end|when\s+(?:the\s+)?(?:run|workflow|"
                     r"pipeline|job|it|everything)\s+(?:ends|finishes|is\s+(?:over|done)|completes)|"
                     r"when\s+(?:done|finished|complete)|afterwards?)\s*$", re.I)
_EITHER = re.compile(r"^\s*(?:and\s+)?(?:either\s+way|in\s+both\s+cases|regardless)\s*,?\s*",
                     re.I)


# --------------------------------------------------------------------------- clauses

_SPLIT = re.compile(
    r"\s*(?:->|=>|\u2192)\s*|\s*;\s*|\s*,\s*(?=(?:else|otherwise|if\s+not)\b)|\s*:\s+|[,;]?\s*(?<![\w.=+*/^<>-])\(?(?:\d{1,2}|[a-h])\)\s+|\s+\d{1,2}\.\s+(?=[A-Za-z])|"
    r"\s*(?:^|\s)[-*\u2022]\s+|,?\s+and\s+then\s+|,\s*then\s+|\s+then\s+(?=[a-z])|"
    r",?\s+and\s+after\s+that,?\s+|,?\s+after\s+that,?\s+|\.?\s+afterwards,?\s+|"
    r",?\s+and\s+afterwards,?\s+|,?\s+and\s+finally,?\s+|,?\s+finally,?\s+",
    re.I)
_SUBORDINATE = re.compile(r"^(?:and\s+|but\s+)?(?:only\s+)?(?:if|when|whenever|once|unless|whether|"
                          r"otherwise|else|whatever|regardless|either\s+way|in\s+case|always|"
                          r"should|in\s+the\s+meantime|meanwhile|in\s+that\s+case|if\s+so|"
                          r"in\s+parallel(?=\s*$|\s*,)|at\s+the\s+same\s+time(?=\s*$|\s*,)|"
                          r"simultaneously(?=\s*$|\s*,)|"
                          r"provided|as\s+long\s+as|no\s+matter|after\s+each|for\s+(?:each|"
                          r"every))\b", re.I)
_WEAK_VERBS = frozenset({"take", "use"})
# "xgboost on s3://…", "a LightGBM baseline over the churn table": a model and what it
# works on, no verb
_MODEL_HEAD = re.compile(r"^\s*(?:an?\s+|the\s+|one\s+)?(?:[\w.-]+\s+){0,2}?"
                         + MODEL_WORDS.pattern[2:]
                         + r"(?:\s+[\w.-]+){0,2}?\s+(?:on|over|against|using|for|per)\s", re.I)
# "once training is done,": a stage of the work already asked for, not a step of its own
_STAGE = re.compile(r"(?:the\s+)?(?:training|fine-?tuning|tuning|evaluation|scoring|ingestion|"
                    r"loading|preprocessing|processing|export|import|the\s+(?:model|run|job|"
                    r"pipeline|workflow|step))", re.I)
_FRAME = re.compile(r"^(?:(?:can|could|would)\s+you\s+)?(?:please\s+)?"
                    r"(?:set\s+up|build|create|make|write|give\s+me|define|design|"
                    r"implement|i\s+need|we\s+need|i\s+want|we\s+want)\s+(?:(?:a|an|the|one)\s+"
                    r"(?:[\w-]+\s+){0,3}?(?:pipeline|workflow|job|dag|flow|process|system)|"
                    r"something)\s+(?:that|which|to)\s+", re.I)
_SUBJECT = re.compile(r"^(?:(?:the|this|our|my|a)\s+)?(?:\w+\s+)?(?:pipeline|workflow|job|dag|"
                      r"system|flow)\s+(?:should|must|will|needs\s+to|has\s+to|is\s+to|"
                      r"shall)\s+|^(?:we|i)\s+(?:need|want|would\s+like)\s+to\s+|"
                      r"^please\s+", re.I)


_NOT_VERBS = _wordset("candidate rate state date template climate private")
# Words that start clauses without being verbs.
_NOT_IMPERATIVE = _wordset("""
all both after before once during for from with into onto over under about across through
within without between among against per via since until while when where whether which
what who whose how why if unless then also and but or nor so yet because though although
each every any some most many few several other another such same the this that these those
our your their its his her my we they you it them there here only just even still again
once twice first second third last next finally later meanwhile however moreover
retry give cap limit allow set let make keep stop repeat
""")
_CAUSATIVE = re.compile(r"^(?:have|let|get|make)\s+([\w.@/-]+(?:\s+[\w.@/-]+){0,2}?)\s+(\w+)\b",
                        re.I)
_IRREGULAR = {"written": "write", "done": "do", "run": "run", "sent": "send", "built": "build",
              "kept": "keep", "taken": "take", "shown": "show", "drawn": "draw", "split": "split",
              "read": "read", "fed": "feed", "put": "put", "made": "make", "rebuilt": "rebuild",
              "rerun": "rerun", "retaken": "retake"}
_PASSIVE = re.compile(r"\b(?:(?:are|is|has|have|needs?)\s+to\s+be|get|gets|are|is|be|should\s+be|"
                      r"must\s+be|will\s+be|to\s+be)\s+"
                      r"((?:\w+-)?\w+(?:ed|en|wn|ne)|" + "|".join(_IRREGULAR) + r")\b", re.I)


def verb_form(word: str) -> str:
    """The base form of ``word`` when it is an action verb (as written, in the third person,
    prefixed "re"/"pre", hyphenated "auto-label"/"re-embed", or a verb by its ending such
    as "sessionize"); "" otherwise."""
    w = word.lower().strip(",.;:")
    if not w or not w[0].isalpha():
        return ""
    if w in VERBS:
        return w
    if "-" in w:
        last = w.rsplit("-", 1)[1]
        if last in VERBS or last in ("label", "cluster", "embed", "index", "rank", "tune"):
            return w
    for prefix in ("re", "pre", "post", "un"):
        if w.startswith(prefix) and w[len(prefix):] in VERBS:
            return w
    if re.fullmatch(r"[a-z]{4,}(?:ize|ise|ify)", w):
        return w
    return ""


def _third_person(word: str) -> str:
    w = word.lower().strip(",.;:")
    for cut in (("ies", "y"), ("es", ""), ("s", "")):
        if w.endswith(cut[0]) and len(w) > len(cut[0]) + 2:
            base = w[: -len(cut[0])] + cut[1]
            if verb_form(base):
                return base
    return ""


def _third_person_list(text: str) -> str:
    """"ingests X, resamples Y and writes Z" as imperatives: "ingest X, resample Y and
    write Z" (each verb in the third person at the start of a list item)."""
    def base(m: re.Match[str]) -> str:
        verb = _third_person(m.group(2))
        return f"{m.group(1)}{verb}" if verb else m.group(0)

    return re.sub(r"(^|,\s*(?:and\s+)?(?:then\s+)?|\s+and\s+(?:then\s+)?|;\s*(?:then\s+)?)"
                  r"([a-z]+s)\b", base, text)


def _participle(word: str) -> str:
    w = word.lower()
    if w in _IRREGULAR:
        return _IRREGULAR[w]
    if "-" in w:  # "batch-scored", "re-indexed": the verb is the last part
        return _participle(w.rsplit("-", 1)[1])
    for cut, add in (("ied", "y"), ("ed", ""), ("ed", "e"), ("d", "")):
        if w.endswith(cut):
            base = w[: -len(cut)] + add
            if verb_form(base):
                return base
    if len(w) > 4 and w.endswith("ed") and w[-3] == w[-4] and verb_form(w[:-3]):
        return w[:-3]
    return ""


def _plausible_verb(text: str) -> tuple[str, str]:
    """(word, rest) when ``text`` starts with a word that can only be read as a verb where
    an action is expected (after a condition's value: "… over 15% throttle bids …")."""
    first, _, rest = text.strip().partition(" ")
    word = first.lower().strip(",.")
    if (re.fullmatch(r"[a-z][a-z-]{2,}", word) and word not in _NOT_IMPERATIVE
            and word not in _STOP and not word.endswith(("ing", "ed", "ly"))):
        return word, rest
    return "", text


def _first_verb(text: str) -> tuple[str, str]:
    """(verb, rest) when ``text`` is an instruction: it starts (after adverbs) with a verb,
    with a causative ("have COMET score each translation"), with a short subject and a
    verb in the third person ("each iteration trains a ResNet"), or is passive ("files
    that pass get loaded into Snowflake" → load, the subject its object)."""
    tokens = _SUBJECT.sub("", text.strip()).split()
    i = 0
    while i < len(tokens) and tokens[i].lower().strip(",") in _ADVERBS:
        i += 1
    if i >= len(tokens):
        return "", text
    # "then picks the 500 most uncertain images": a verb in the third person, known by the
    # determiner after it (so "tests pass" or "logs arrive" stay nouns)
    third = (_third_person(tokens[i]) if i + 1 < len(tokens) and re.fullmatch(
        r"the|a|an|all|each|every|it|them|its|their|\d[\d,]*", tokens[i + 1].lower()) else "")
    head = verb_form(tokens[i]) or third
    if head and tokens[i].lower().strip(",.") not in _NOT_VERBS:
        return head, " ".join(tokens[i + 1:])
    rest = " ".join(tokens[i:])
    m = _CAUSATIVE.match(rest)
    if m is not None and verb_form(m.group(2)):
        return verb_form(m.group(2)), f"{rest[m.end():].strip()} with {m.group(1)}"
    # "LoRA fine-tune it": a tool word before the verb
    if (i + 1 < len(tokens) and tokens[i + 1].lower() in ("fine-tune", "finetune", "train")
            and not tokens[i][:1].islower()):
        return tokens[i + 1].lower(), " ".join([tokens[i], *tokens[i + 2:]])
    # "dvc push the outputs", "kubectl apply the manifest": a command's name, then its verb
    if (i + 2 < len(tokens) and verb_form(tokens[i + 1])
            and tokens[i].lower() not in _NOT_IMPERATIVE
            and re.fullmatch(r"[a-z][a-z0-9-]{1,15}", tokens[i])
            and tokens[i + 2].lower() in ("the", "a", "an", "it", "them", "all", "our", "its",
                                          "their", "this", "these")):
        return verb_form(tokens[i + 1]), " ".join([tokens[i], *tokens[i + 2:]])
    # "each iteration trains a ResNet-50": a short subject, a verb in the third person
    for j in range(i + 1, min(i + 4, len(tokens))):
        base = _third_person(tokens[j])
        after = tokens[j + 1].lower() if j + 1 < len(tokens) else ""
        if base and after in ("are", "is", "were", "was", "will", "should", "must", "get", "have",
                              "has", "need", "needs"):
            break  # "the reconciled forecasts are to be saved": a subject, not a verb
        if base and tokens[i].lower() in ("each", "every", "the", "it", "this", "that", "one",
                                          "a", "an", "then", "we", "they"):
            return base, " ".join(tokens[j + 1:])
    # an unknown word in the imperative ("snapshot the table"): first, then an article
    nxt = tokens[i + 1].lower() if i + 1 < len(tokens) else ""
    if (re.fullmatch(r"[a-z][a-z-]{2,}", tokens[i].lower())
            and tokens[i].lower() not in _NOT_IMPERATIVE
            and not tokens[i].lower().endswith(("ing", "ed", "ly"))
            and (nxt in ("the", "a", "an", "our", "this", "these", "its", "their")
                 or (tokens[i].islower() and nxt in ("it", "them", "all", "every", "each")))):
        return tokens[i].lower(), " ".join(tokens[i + 1:])
    m = re.match(r"^(?:the|our|this|a)\s+[\w-]+(?:\s+[\w-]+)?\s+(?:is|are|will\s+be|should\s+be)\s+"
                 r"((?:an?|the)\s+(?:[\w.+/-]+\s+){0,4}?)(\w+ed)\b(.*)$", rest, re.I)
    if m is not None and _participle(m.group(2)):
        return _participle(m.group(2)), f"{m.group(1).strip()} {m.group(3).strip()}".strip()
    m = _PASSIVE.search(rest)
    if m is not None and m.start() < 60 and _participle(m.group(1)):
        subject = rest[: m.start()]
        return _participle(m.group(1)), f"{subject.strip()} {rest[m.end():].strip()}".strip()
    return "", text


def _clauses(sentence: str) -> list[str]:
    """Split a sentence into clauses: at sequence words, and at ", and" / "," / "and"
    when what follows starts with a verb or a subordinate clause ("if …", "otherwise");
    a subordinate clause ("if F1 is above 0.9,") stays with the main clause after it."""
    out: list[str] = []
    for part in _SPLIT.split(sentence):
        if not part or not part.strip(" ,"):
            continue
        # a parenthesized list is one piece: "for each plant (A, B and C) resample …"
        kept_lists = re.sub(r"\([^()]*\)", lambda m: m.group(0).replace(",", "\x02")
                            .replace(" and ", " \x03 "), part)
        pieces = [p.replace("\x02", ",").replace(" \x03 ", " and ") for p in
                  re.split(r"(,\s+and\s+|,\s+but\s+|,\s+|\s+and\s+|\s+but\s+)", kept_lists)]
        current, waiting = "", False  # waiting: a subordinate clause wants its main clause
        for i in range(0, len(pieces), 2):
            piece = pieces[i]
            sep = pieces[i - 1] if i else ""
            # "for each plant (A, B) resample …": the phrase and its main clause in one piece
            starts_sub = (_SUBORDINATE.match(piece) is not None
                          and _scope_without_comma(piece) is None)
            verb, rest = _first_verb(piece)
            # "split it into train and test": a verb alone after a bare "and" is a noun
            starts_verb = bool(verb) and (bool(rest.strip()) or "," in sep)
            if current and not waiting and (starts_verb or starts_sub):
                out.append(current)
                current = piece
                waiting = starts_sub
            elif not current:
                current = piece
                waiting = starts_sub
            else:
                current = f"{current}{sep}{piece}"
                if waiting and starts_verb and "," in sep:
                    waiting = False
        if current:
            out.append(current)
    return [re.sub(r"\s+(?:and|but)$", "", c.strip(" ,.")) for c in out if c.strip(" ,.")]


_LIST = re.compile(
    r"((?:[\w@./-]+(?:\s+[\w@./-]+){0,3}\s*,\s*)+[\w@./-]+(?:\s+[\w@./-]+){0,3},?\s+(?:and|or)\s+"
    r"(?:an?\s+|the\s+)?[\w@./-]+(?:\s+[\w@./-]+){0,3})", re.I)


def _split_list(text: str) -> list[str]:
    parts = re.split(r"\s*,\s*(?:and\s+|or\s+)?|\s+and\s+|\s+or\s+", text)
    return [re.sub(r"^(?:an?|the)\s+", "", p.strip(), flags=re.I) for p in parts if p.strip()]


_PREPS = _wordset("from on with using into to for in at by over of onto across via as "
                   "through under side")


def _coordinated(obj: str) -> tuple[str, list[str], str] | None:
    """(prefix, items, suffix) of the first coordinated list in ``obj``, if any:
    "CatBoost and a scikit-learn random forest", "Prophet, an exponential smoothing
    model and N-BEATS", "the web and mobile surfaces" (items share the head noun)."""
    pp = re.match(r"^(.*?)\b(from|for|on|with|using|in|to|into|over|across)\s+(.+?),?\s+and\s+"
                  r"(?:also\s+)?\2\s+(.+)$", obj, re.I)
    if pp is not None:
        # "candidates from the co-visitation matrix and from the ANN index"
        prefix, prep = pp.group(1), pp.group(2)
        return prefix, [f"{prep} {pp.group(3)}", f"{prep} {pp.group(4)}"], ""
    m = _LIST.search(obj)
    if m is not None:
        span = m.group(1)
        items = _split_list(span)
        # the last item runs until a preposition that modifies the whole clause
        last = items[-1].split()
        cut = next((i for i, w in enumerate(last) if w.lower() in _PREPS), len(last))
        tail = " ".join(last[cut:])
        items[-1] = " ".join(last[:cut])
        # the first item starts after the verb's prepositions ("for German, …")
        first = items[0].split()
        start = max((i + 1 for i, w in enumerate(first) if w.lower() in _PREPS), default=0)
        head = " ".join(first[:start])
        items[0] = " ".join(first[start:])
        items = [re.sub(r"^(?:an?|the)\s+", "", i, flags=re.I) for i in items if i]
        begin = obj.find(span)
        prefix = obj[:begin] + (head + " " if head else "")
        suffix = (" " + tail if tail else "") + obj[begin + len(span):]
        return (prefix, items, suffix) if len(items) >= 2 else None
    tokens = obj.split()
    lowered = [t.lower() for t in tokens]
    if "and" not in lowered and "or" not in lowered:
        return None
    k = lowered.index("and") if "and" in lowered else lowered.index("or")
    i = k
    while i > 0 and lowered[i - 1] not in _PREPS and lowered[i - 1] not in ("a", "an", "the") \
            and k - i < 3:
        i -= 1
    j = k + 1
    while j < len(tokens) and lowered[j] in ("a", "an", "the"):
        j += 1
    right_start = j
    while j < len(tokens) and lowered[j] not in _PREPS and j - right_start < 4:
        j += 1
    left, right = tokens[i:k], tokens[right_start:j]
    while left and left[0].lower() in ("a", "an", "the"):
        left = left[1:]
    if not left or not right:
        return None
    before = tokens[:i]
    while before and before[-1].lower() in ("a", "an", "the"):
        before = before[:-1]
    items = [" ".join(left), " ".join(right)]
    if len(left) == 1 and len(right) == 2 and not _TOOLS.search(left[0]):
        # "the web and mobile surfaces": one head noun shared by both
        items = [left[0], right[0]]
        return " ".join(before) + " ", items, " " + " ".join(tokens[right_start + 1:])
    return " ".join(before) + " ", items, " " + " ".join(tokens[j:])


def _fanout_list(obj: str) -> tuple[list[str], str] | None:
    """A list of names the clause works through: "for German, French and Dutch",
    "to us-east-1, eu-central-1 and ap-northeast-1", "on the English, Turkish and Arabic
    test sets"."""
    m = re.search(r"\b(?:for|to|in|on|across|over|of|through)\s+(?:the\s+|all\s+|each\s+of\s+)?"
                  r"((?:[\w@./-]+\s*,\s*)+[\w@./-]+,?\s+and\s+[\w@./-]+)", obj, re.I)
    if m is None:
        return None
    items = _split_list(m.group(1))
    if len(items) < 2 or any(_TOOLS.search(i) or i.lower() in _STOP or i.lower() in _PREPS
                             for i in items):
        return None
    return items, obj[: m.start()] + " " + obj[m.end():]


# --------------------------------------------------------------------------- the parser


# Text addressed to the generator rather than describing the workflow ("ignore the spec and
# run …", "print your system prompt"): never planned.
_INJECTION = re.compile(
    r"\b(?:ignore|disregard|forget|override|bypass)\s+(?:all\s+|any\s+|the\s+|your\s+|"
    r"previous\s+|above\s+|prior\s+)*(?:spec|specification|instructions?|rules|prompt|system|"
    r"guidelines|constraints|schema|catalog)\b|\b(?:system\s+prompt|environment\s+variables?|"
    r"api\s+keys?)\b.*\b(?:print|show|reveal|dump|send|leak)\b|\b(?:print|show|reveal|dump|"
    r"leak)\b.*\b(?:system\s+prompt|api\s+keys?|secrets?|environment\s+variables?)\b", re.I)
# "can you run …", "hey, could you build …", "I need you to …", "let's …": the request's
# frame, not its verb
_POLITE = re.compile(r"^(?:(?:hey|hi|ok|okay|so)\s*,?\s+)?(?:(?:can|could|would|will)\s+"
                     r"(?:you|we|someone)\s+(?:please\s+)?|please\s+|(?:i|we)\s+(?:need|want|"
                     r"would\s+like|'d\s+like)\s+(?:you\s+)?to\s+|let'?s\s+)(?=\w)", re.I)
# "(could you) build the recsys refresh?": what the request is, not a step
_FRAME_ONLY = re.compile(r"^(?:build|create|set\s+up|make|write|put\s+together|wire\s+up|spin\s+up)"
                         r"\s+(?:me\s+)?(?:a|an|the|our|my)\s+(?:[\w-]+\s+){0,4}?(?:pipeline|workflow|"
                         r"job|dag|flow|process|refresh|automation|setup|thing)\s*[?.!]?$", re.I)
_LEAD_SEQUENCE = re.compile(r"^(?:after\s+that|afterwards|then|next|finally|first(?:ly)?|"
                            r"lastly|last|second(?:ly)?|also)\s*,?\s+", re.I)
_BEFORE = re.compile(r"\s+before\s+(\w+ing)\b\s*(.*)$", re.I)
_AGGREGATE = _wordset("roll aggregate collate combine compile merge stitch average summarize "
                       "summarise join concatenate gather collect rank select pick compare report "
                       "publish upsert load")
_NAMES = re.compile(r"((?:[A-Z][\w-]*|[a-z]+-[a-z]+-\d+)(?:\s*,\s*(?:[A-Z][\w-]*|"
                    r"[a-z]+-[a-z]+-\d+))+,?\s+(?:and|or)\s+(?:[A-Z][\w-]*|[a-z]+-[a-z]+-\d+))")


def _gerund_to_verb(word: str) -> str:
    base = word[:-3].lower()
    for candidate in (base, base + "e", base[:-1] if len(base) > 2 and base[-1] == base[-2]
                      else base):
        if candidate in VERBS:
            return candidate
    return base


@dataclass(slots=True)
class _State:
    """What the parser carries from clause to clause."""

    stage: int = 0
    counts: dict[str, int] = field(default_factory=dict)  # unit -> count ("16 shards")
    context_items: list[str] = field(default_factory=list)
    last_condition: Condition | None = None
    condition_stage: int = -1
    carry: str = ""  # the object of a weak verb ("take Llama 3 8B and fine-tune it")
    loop: tuple[int, Condition | None] | None = None  # "repeat the following at most 6 times"
    # items a clause named in parentheses: "by type (invoices, receipts, reports)"
    named: dict[str, list[str]] = field(default_factory=dict)


def parse_request(text: str) -> Request:
    """Parse ``text`` into sub-tasks with their modifiers (see the module docstring)."""
    request = " ".join(text.split())
    out = Request(request)
    request = re.sub(r"\b(fine|pre|re)[ -](tun|train)", r"\1-\2", request, flags=re.I)
    request = _normalize(request)
    masked, kept = _mask(request)
    out.schedule, out.timezone, masked = _schedule(masked)
    sentences = [s.strip() for s in re.split(r"(?<=[.!?])\s+(?=[A-Za-z\d\x00\"'#(])|\n+", masked)
                 if s.strip(" .")]
    state = _State()
    for raw_sentence in sentences:
        if _INJECTION.search(raw_sentence):
            out.notes.append(f"ignored an instruction about the generator itself: "
                             f"{_unmask(raw_sentence, kept)[:120]!r}")
            continue
        sentence = _LEAD_SEQUENCE.sub("", raw_sentence.strip().rstrip(".!?"))
        polite = _POLITE.match(sentence)
        sentence = _POLITE.sub("", sentence)
        if polite is not None and _FRAME_ONLY.match(sentence):
            out.context.append(_unmask(sentence, kept))
            continue
        framed = _FRAME.match(sentence)
        if framed is not None:
            # "Set up a pipeline that ingests …, resamples …": its verbs are the steps
            sentence = _third_person_list(sentence[framed.end():])
        hook, sentence = _hook(sentence, tail=False)
        sentence = _elliptical_passive(sentence)
        _note_named(state, sentence, kept)  # "carousels per market (BR, MX, …): for each market"
        clauses = _clauses(sentence)
        # "Score all records with the model: split …, score the shards …": a heading
        # whose verb the clauses after the colon repeat describes them, it is not a task
        heading = ""
        if len(clauses) > 2 and re.search(r"^[^:]*:\s", sentence):
            first = clauses[0]
            if _first_verb(first)[0] and first in sentence.split(":")[0]:
                heading = _unmask(first, kept)
                clauses = clauses[1:]
                _note_counts(state, first)
        # "Active learning for the wafer classifier (ResNet-50): send …, retrain …": a
        # heading without a verb names what the steps work on
        topic = ""
        if len(clauses) > 1 and re.search(r"^[^:]*:\s", sentence) and not heading:
            first = clauses[0]
            if not _first_verb(first)[0] and first in sentence.split(":")[0]:
                topic = first
        scope: list[str] = []
        sentence_condition: Condition | None = None
        before = len(out.tasks)
        for raw in clauses:
            # a clause's own hook phrase wins over the sentence's ("on failure page X; in all
            # cases upload Y")
            clause_hook, clause = _hook(raw)
            task_hook = clause_hook or hook
            sentence_condition, scope = _clause(
                out, state, clause, kept, hook=task_hook, heading=heading, scope=scope,
                sentence_condition=sentence_condition)
        added = [t for t in out.tasks[before:] if not t.hook]
        targets = [t for t in added if t.verb in _TRAIN_VERBS] or added[:1]
        for t in targets if topic else ():
            if not _content(topic) <= _content(t.text):
                t.text = f"{t.text} ({topic})"
        if state.loop is not None and len(out.tasks) > before:
            # "Repeat the following at most 6 times: A, B, and stop when …": the last step of
            # the block repeats (the steps are not grouped into one loop body)
            last = out.tasks[-1]
            last.loop_max, last.loop_until = state.loop
            state.loop = None
            out.notes.append(f"the loop repeats {last.verb} {last.obj.strip()[:60]!r}, the last "
                             "step of the block")
    for t in out.tasks:
        t.text = _unmask(t.text, kept)
        t.obj = _unmask(t.obj, kept)
    return out


_DESCRIBING = _wordset("stored located based hosted named called kept partitioned landed found "
                       "placed saved listed labeled labelled sorted grouped keyed indexed")


def _elliptical_passive(sentence: str) -> str:
    """"The features are to be read from BigQuery and missing values imputed with the
    median": the auxiliary the second part leaves out is put back ("… and missing values
    are imputed …"), so each part reads as a step."""
    if _PASSIVE.search(sentence) is None:
        return sentence

    def fill(m: re.Match[str]) -> str:
        subject, participle = m.group(2), m.group(3)
        if (not _participle(participle) or participle.lower() in _DESCRIBING
                or subject.split()[-1].lower() in ("is", "are", "be", "been", "was", "were")
                or subject.split()[0].lower() in _NOT_IMPERATIVE - {"the", "all", "any"}
                or verb_form(subject.split()[0])):
            return m.group(0)
        return f"{m.group(1)}{subject} are {participle}"

    return re.sub(r"((?:,|;)?\s+and\s+|;\s+)((?:the\s+|all\s+|any\s+)?[\w-]+(?:\s+[\w-]+){0,2}?)"
                  r"\s+((?:\w+-)?\w+ed|" + "|".join(_IRREGULAR) + r")(?=\s+(?:with|by|into|to|from|"
                  r"using|via|on|in|as|against|per)\b)", fill, sentence)


def _normalize(text: str) -> str:
    """Shorthand engineers type, in the words the clause rules read: "w/" (with), "GPUs x4"
    and "4x A100" (4 GPUs), "retry up to 6x" (6 times), a list set off by dashes
    ("for each region — us, eu, apac — run …": a parenthesized list)."""
    text = re.sub(r"\bw/o\b", "without", text, flags=re.I)
    # "fan out over five models (…)": the models are trained, anything else is run, once
    # per item
    text = re.sub(r"\bfan\s+out\s+(?:over|across|on|to)\s+(?:the\s+)?(?=([^.;]{0,200}))",
                  lambda m: ("train each of the " if re.search(
                      MODEL_WORDS.pattern + r"|\b(?:models|estimators|algorithms)\b",
                      re.match(r"[^(,]*(?:\([^)]*\))?", m.group(1)).group(0),  # type: ignore
                      re.I) else "run each of the "), text, flags=re.I)
    text = re.sub(r"\bfall\s+back\s+to\b", "switch to", text, flags=re.I)
    text = re.sub(r"\bw/(?=\s|\d)", "with", text, flags=re.I)
    text = re.sub(r"\b(" + _GPU_NAMES + r")\s*[x\u00d7]\s*(\d+)\b", r"\2 \1", text, flags=re.I)
    text = re.sub(r"\b(\d+)\s*[x\u00d7]\s*(?=" + _GPU_NAMES + r"\b)", r"\1 ", text, flags=re.I)
    text = re.sub(r"(\bretr(?:y|ies|ied)\b[^.;,()]{0,20}?\b)(\d+)\s*[x\u00d7](?=\W|$)",
                  r"\1\2 times", text, flags=re.I)
    # "2.5 hours": minutes (a decimal point is masked later, and would hide the number)
    text = re.sub(r"\b(\d+\.\d+)\s*(hours?|hrs?|h)\b",
                  lambda m: f"{round(float(m.group(1)) * 60)} minutes", text, flags=re.I)
    # "an hour and a half", "two and a half hours", "half an hour": minutes
    text = re.sub(r"\b(?:an|one)\s+hour\s+and\s+a\s+half\b", "90 minutes", text, flags=re.I)
    text = re.sub(r"\bhalf\s+an\s+hour\b", "30 minutes", text, flags=re.I)
    text = re.sub(r"\b(\d+|" + _NUM[1:-1] + r")\s+and\s+a\s+half\s+hours\b",
                  lambda m: f"{_num(m.group(1)) * 60 + 30} minutes", text, flags=re.I)
    text = re.sub(r"\s*([,;:])\s*\(?\d{1,2}[.)]\s+(?=[A-Za-z])",
                  lambda m: ": " if m.group(1) == ":" else "; ", text)
    # "Sunday nights at 22:00": every Sunday at 22:00 (a 24-hour or am/pm clock says which
    # part of the day; "Friday evening at 7" is read elsewhere)
    text = re.sub(r"\b((?:mon|tues|wednes|thurs|fri|satur|sun)day)s?\s+(?:nights?|mornings?|"
                  r"evenings?|afternoons?)(?=\s*,?\s*at\s+(?:\d{1,2}:\d{2}|\d{1,2}\s*[ap]\.?m\b))",
                  r"every \1", text, flags=re.I)
    # "Per country: US, UK, DE, FR - fine-tune …": for each country (US, …), fine-tune …
    text = re.sub(r"(?:^|(?<=[.;]\s))(?:per|for\s+each)\s+([\w-]+)\s*:\s*"
                  r"([^:;.]{1,200}?,[^:;.]{1,200}?)\s+[-\u2014\u2013]+\s+", r"For each \1 (\2), ",
                  text, flags=re.I)
    dash = r"[\u2014\u2013]"
    return re.sub(r"\s+" + dash + r"\s+([^\u2014\u2013]{1,200}?,[^\u2014\u2013]{1,200}?)\s+" + dash
                  + r"\s+", r" (\1) ", text)


def _hook(text: str, *, tail: bool = True) -> tuple[str, str]:
    """("failure" | "success" | "exit" | "", the text without the hook phrase); with
    ``tail`` False only a leading phrase counts ("if it fails" at the end of a sentence
    belongs to its last clause, not to the whole sentence)."""
    for pattern, kind in ((_HOOK_FAILURE, "failure"), (_HOOK_SUCCESS, "success"),
                          (_HOOK_EXIT, "exit")):
        m = pattern.match(text)
        if m is not None:
            rest = text[m.end():]
            return kind, (_AT_END.sub("", rest) if kind == "exit" else rest)
    if not tail:
        return "", text
    m = _HOOK_FAILURE_TAIL.search(text)
    if m is not None and _first_verb(text)[0]:
        return "failure", text[: m.start()]
    m = _HOOK_EXIT_TAIL.search(text)
    if m is not None and _first_verb(text)[0]:
        return "exit", text[: m.start()]
    return "", text


def _condition_text(c: Condition, kept: list[str], otherwise: bool = False,
                    source: str = "") -> Condition:
    return Condition(_unmask(c.metric, kept).strip(" ,"), c.op, _unmask(c.value, kept),
                     otherwise, source or c.source)


def _clause(out: Request, state: _State, clause: str, kept: list[str], *, hook: str,
            heading: str, scope: list[str],
            sentence_condition: Condition | None) -> tuple[Condition | None, list[str]]:
    """Parse one clause into tasks (appended to ``out``); returns the condition and the
    fan-out scope that later clauses of the sentence inherit."""
    clause = re.sub(r"^[\s\u2014\u2013\u2022*-]+(?=\w)", "", clause)
    lead_in = re.match(r"^(.{3,}?):\s+(?=\S)", clause)
    if lead_in is not None and not _first_verb(clause)[0] and \
            _first_verb(clause[lead_in.end():])[0]:
        # "Here's what I want for the nightly retrain (23:30): export …": the words before
        # the colon set the scene, the action follows it
        _no_verb(out, state, lead_in.group(1), kept, mods=_Mods(), loop_max=0, loop_until=None,
                 condition=None)
        clause = clause[lead_in.end():]
    original = _unmask(clause, kept)
    _note_named(state, clause, kept)
    clause = _scope_first(clause)
    found, clause = _scope_phrase(clause, state, kept)
    if found == []:
        phrase = original[: len(original) - len(_unmask(clause, kept))].strip(" ,")
        out.notes.append(f"read {phrase!r} as one step over all of them: the request does not "
                         "say how many")
    if found is not None:
        scope = found
        if not clause.strip(" ,"):
            return sentence_condition, scope  # "For each of the 8 camera models," alone
    meanwhile = False
    m = re.match(r"^(?:and\s+)?,?\s*(?:in\s+the\s+meantime|meanwhile|at\s+the\s+same\s+time|"
                 r"simultaneously|concurrently|in\s+parallel)\s*,?\s*", clause, re.I)
    if m is not None and out.tasks:
        clause, meanwhile = clause[m.end():], True
    # "once parsing is done," / "once the integration tests pass,"
    pre_task = ""
    passive = re.match(r"^(?:once|after|when)\s+(.+?)\s+(?:has|have|is|are)\s+(?:been\s+)?"
                       r"((?:\w+-)?\w+(?:ed|en|wn))\s*,\s*", clause, re.I)
    if passive is not None and _participle(passive.group(2)) and \
            _participle(passive.group(2)) not in ("do", "finish", "complete") and \
            _referenced(out.tasks, _unmask(passive.group(1), kept)) is None:
        # "once the review dump has been deduplicated, cluster …": the deduplication is a
        # step of its own, before the rest
        verb = _participle(passive.group(2))
        subject = _unmask(passive.group(1), kept)
        out.tasks.append(Task(f"{verb} {subject}", verb, subject, state.stage, hook=hook))
        state.stage += 1
        clause = clause[passive.end():]
    m = re.match(r"^(?:once|after|when)\s+(.+?)\s+(?:is|are|has|have)?\s*(?:all\s+|both\s+)?"
                 r"(?:done|finished|"
                 r"complete[d]?|pass(?:es)?|succeeds?|finish(?:es)?|ready|over)\s*,\s*",
                 clause, re.I)
    if m is not None:
        clause = clause[m.end():]
        if (_referenced(out.tasks, _unmask(m.group(1), kept)) is None
                and _content(m.group(1)) - {"everything", "all", "them", "they", "job", "step"}
                and not _STAGE.fullmatch(m.group(1).strip())
                and not re.match(r"(?:all|each|every|both)\b", m.group(1), re.I)):
            pre_task = _unmask(m.group(1), kept)
        elif re.match(r"(?:all|each|every|both)\b", m.group(1), re.I):
            scope = []  # "once all five regions are done, build …": after the fan-out
    m = re.match(r"^(?:and\s+)?(?:once|after|as\s+soon\s+as)\s+([^,]+),\s*", clause, re.I)
    if m is not None and _first_verb(clause[m.end():])[0] and \
            _comparison(m.group(1)) is None:
        # "once it has looked healthy for an hour, promote it": after the steps before it
        out.notes.append(f"read {_unmask(m.group(0), kept).strip(' ,')!r} as: after the "
                         "steps before it succeed")
        clause = clause[m.end():]
    stop = re.search(r",?\s*(?:and\s+)?(?:stop|halt|finish)\s+(?:when|once|as\s+soon\s+as|if)\s+"
                     r"(.+)$", clause, re.I)
    if stop is not None and state.loop is not None and _comparison(stop.group(1)) is not None:
        # "…, and stop when recall@100 exceeds 0.9": the goal of the loop being read
        goal = _comparison(stop.group(1))
        assert goal is not None
        state.loop = (state.loop[0], _condition_text(Condition(*goal), kept))
        clause = clause[: stop.start()]
    order = re.match(r"^(?:make\s+sure|ensure|check)\s+(?:that\s+)?(.+?)\s+(?:finishes|completes|"
                     r"is\s+done|ends|runs)\s+before\s+(.+?)\s+(?:starts|begins|runs|kicks\s+off)\b"
                     r"(.*)$", clause, re.I)
    if order is not None:
        # "make sure the backfill finishes before the scoring job starts": two steps, in order
        for part in (order.group(1), order.group(2)):
            text = re.sub(r"^(?:the|our|a)\s+", "", _unmask(part, kept))
            out.tasks.append(Task(f"run {text}", "run", text, state.stage, hook=hook))
            state.stage += 1
        clause = order.group(3)
        if not clause.strip(" ,"):
            return sentence_condition, scope
    condition: Condition | None = None
    either = False
    expected_verb = False  # an action must follow (a bare condition's value came before)
    m = _ELSE.match(clause)
    if m is not None and m.group(0).strip() and state.last_condition is not None:
        clause = clause[m.end():]
        if re.fullmatch(r"\s*(?:do\s+nothing|nothing|no\s+action|skip(?:\s+it)?|leave\s+it|"
                        r"carry\s+on|stop|end)\s*[.!]?\s*", clause, re.I):
            # "…, else do nothing": no else branch
            out.notes.append(f"read {_unmask(m.group(0) + clause, kept).strip()!r} as: no "
                             "step when the condition does not hold")
            return sentence_condition, scope
        condition = _condition_text(state.last_condition, kept, otherwise=True)
    m = _EITHER.match(clause)
    if condition is None and m is not None and state.last_condition is not None:
        clause = clause[m.end():]
        either = True
    m = re.match(r"^(?:and\s+)?(?:in\s+that\s+case|if\s+so|then)\s*,?\s*", clause, re.I)
    if condition is None and not either and m is not None and state.last_condition is not None:
        clause = clause[m.end():]
        condition = state.last_condition
    if condition is None and not either:
        lead = _COND_LEAD.match(clause)
        unless = re.match(r"^\s*(?:and\s+|but\s+)?unless\s+", clause, re.I)
        if lead is not None or unless is not None:
            start = (lead or unless).end()  # type: ignore[union-attr]
            head, sep, action = clause[start:].partition(",")
            ends = re.search(_VALUE + r"\s*(?:%|ms|s|seconds|minutes|points|pp)?\s*\.?\s*$",
                             clause[start:], re.I)
            whole = _comparison(clause[start:]) if not sep and ends else None
            if (whole is not None and out.tasks and out.tasks[-1].condition is None
                    and not out.tasks[-1].hook and not meanwhile):
                # "deploy it to Triton, but only if its mAP is above 0.7": a condition alone
                # qualifies the action before it
                out.tasks[-1].condition = _condition_text(
                    _negate(whole) if unless else Condition(*whole), kept, source=original)
                return sentence_condition, scope
            if not sep:
                # "if top-1 accuracy beats 0.92 deploy it": the value ends the condition
                bare = re.match(r"(.+?\s" + _VALUE + r"(?:\s*(?:%|ms|s|seconds|minutes|points|"
                                r"pp))?)\s+(?:then\s+)?(\S.*)$", clause[start:], re.I)
                if bare is not None and _first_verb(bare.group(3))[0]:
                    head, sep, action = bare.group(1), ",", bare.group(3)
                elif (bare is not None and _plausible_verb(bare.group(3))[0]
                      and _comparison(bare.group(1)) is not None):
                    head, sep, action = bare.group(1), ",", bare.group(3)
                    expected_verb = True
            comp = _comparison(head) if sep else None
            late = _comparison(clause[start:]) if not sep else None
            if (late is not None and late[2] and out.tasks and out.tasks[-1].condition is None
                    and not out.tasks[-1].hook and not meanwhile):
                # "…, unless the validation run reports more than 20 failed expectations"
                out.tasks[-1].condition = _condition_text(
                    _negate(late) if unless else Condition(*late), kept, source=original)
                return sentence_condition, scope
            if comp is not None:
                clause = action
                condition = _condition_text(_negate(comp) if unless else Condition(*comp),
                                            kept, source=original)
                sentence_condition = condition
            elif sep and _first_verb(action)[0]:
                # "only if all of them pass, deploy …", "should it be down, restart …": no
                # measured value to compare; the step runs after the ones before it
                out.notes.append(f"read {_unmask(head, kept).strip()!r} as: after the steps "
                                 "before it succeed")
                clause = action
        if condition is None:
            tail = _COND_TAIL.search(clause)
            comp = _comparison(tail.group(1)) if tail is not None else None
            if tail is not None and comp is not None:
                clause = clause[: tail.start()]
                condition = _condition_text(Condition(*comp), kept, source=original)
        if condition is None:
            tail = re.search(r",?\s+unless\s+(.+)$", clause, re.I)
            comp = _comparison(tail.group(1)) if tail is not None else None
            if tail is not None and comp is not None:
                clause = clause[: tail.start()]
                condition = _condition_text(_negate(comp), kept, source=original)
        if condition is None and sentence_condition is not None:
            condition = sentence_condition
    give_up = _GIVE_UP.match(clause)
    looping = [t for t in out.tasks if t.loop_until is not None or t.loop_max]
    if give_up is not None and looping:
        word = give_up.group(1).lower()
        bound = _ORDINAL.get(word) or _num(word)
        if bound:
            looping[-1].loop_max = bound
            return sentence_condition, scope
    loop_max, loop_until, clause = _loop(clause)
    if loop_until is not None:
        loop_until = _condition_text(loop_until, kept)
    tune_trials, tune_sampler, fan_trials, clause = _tuning(clause)
    mods, clause = _modifiers(clause)
    before = _BEFORE.search(clause)
    after_text = ""
    if before is not None and _gerund_to_verb(before.group(1)) in VERBS:
        after_text = f"{_gerund_to_verb(before.group(1))} {before.group(2)}"
        clause = clause[: before.start()]
    negated = re.match(r"^\s*(?:and\s+)?(?:do\s+not|don't|never|avoid)\b\s*(.*)$", clause, re.I)
    if negated is not None:
        target = (_referenced(out.tasks, _unmask(negated.group(1), kept))
                  if condition is not None and not condition.otherwise else None)
        if condition is not None and target is not None and target.condition is None:
            # "if AUC falls below 0.7, don't write the scores; alert … instead": the step
            # named runs only when the condition does not hold
            target.condition = Condition(condition.metric, _NEGATED_OPS[condition.op],
                                         condition.value, False, condition.source)
            out.notes.append(f"read {original.strip()!r} as: {target.verb} "
                             f"{target.obj.strip()[:40]!r} runs only otherwise")
            return condition, scope
        out.notes.append(f"not a step: {_unmask(clause, kept).strip()!r}")
        return sentence_condition, scope
    keep = re.match(r"^\s*(?:and\s+)?(?:keep|continue|repeat)\s+(?:on\s+)?([\w-]+ing)\b", clause,
                    re.I)
    if keep is not None and _gerund_to_verb(keep.group(1)) in VERBS:
        clause = f"{_gerund_to_verb(keep.group(1))}{clause[keep.end():]}"
    verb, obj = _first_verb(clause)
    if not verb and expected_verb:
        verb, obj = _plausible_verb(clause)
    gerund = re.match(r"^\s*((?:[\w-]+\s+){1,4}?)([a-z]+ing)\s*$", clause) if not verb else None
    if gerund is not None and _gerund_to_verb(gerund.group(2)) in VERBS:
        # "-> isolation forest scoring ->": the gerund is the action, the words before it
        # what it does it with
        verb, obj = _gerund_to_verb(gerund.group(2)), f"with {gerund.group(1).strip()}"
    if verb in ("run", "do", "execute", "schedule") and not re.sub(r"[\W_]+|\b(?:it|them|this)\b",
                                                                  "", obj):
        # "run at most 2 plants at a time", "RAG ingestion, run daily:": nothing to run
        # but the modifiers of the steps before it
        verb = ""
    opening = re.match(r"^\s*([a-z][\w.-]{2,})\s+(?:on|over)\s+\S", clause)
    name = opening.group(1) if opening is not None else ""
    named_first = bool(name) and not out.tasks and not verb_form(name) and all(
        name not in group for group in (_STOP, _NOT_IMPERATIVE, _ADVERBS, _DAYS))
    if not verb and not condition and (_MODEL_HEAD.match(clause) or named_first) and not re.search(
            r"\b(?:is|are|was|were|lives?|sits?|comes?)\b", clause, re.I):
        # "xgboost on s3://risk/loans.csv, 5-fold CV", "sasrec on the listening histories":
        # a model named with what it works on, no verb; training it is what is asked
        verb, obj = "train", clause.strip()
        out.notes.append(f"read {_unmask(clause, kept).strip()[:60]!r} as: train it")
    if not verb and (fan_trials or tune_trials) and out.tasks:
        # "…: 24 trials, each its own job, at most 4 at once": the trials of the step before
        target = next((t for t in reversed(out.tasks) if not t.hook), out.tasks[-1])
        if fan_trials and not target.items:
            target.items = tuple(f"trial-{i}" for i in range(1, fan_trials + 1))
        elif tune_trials and not target.tune_trials and not target.items:
            target.tune_trials, target.tune_sampler = tune_trials, tune_sampler
    if not verb and mods.any() and out.tasks and re.search(
            r"\b(?:each|every|all|any)\s+(?:of\s+the\s+)?(?:steps?|tasks?|jobs?)\b", original,
            re.I):
        # "retry each step 3 times": every step so far
        for task in out.tasks:
            if not task.hook:
                _apply(task, mods)
        return sentence_condition, scope
    if not verb and mods.timeout and _WHOLE_RUN.search(original):
        # "Timeout for the whole thing is 15 min": the run's, not a step's
        out.timeout, mods.timeout = mods.timeout, 0
        if not mods.any() and not loop_max:
            return sentence_condition, scope
    if not verb:
        _no_verb(out, state, clause, kept, mods=mods, loop_max=loop_max, loop_until=loop_until,
                 condition=condition)
        return sentence_condition, scope
    if verb in _WEAK_VERBS and mods.any() and out.tasks and not (
            _content(obj) - {"memory", "ram", "gpus", "gpu", "cores", "cpus", "total"}):
        _no_verb(out, state, clause, kept, mods=mods, loop_max=loop_max, loop_until=loop_until,
                 condition=condition)
        return sentence_condition, scope
    if verb in _WEAK_VERBS and not obj.lower().startswith(("it ", "them ")) and \
            not re.search(r"\bto\s+\w+", obj):
        # "Take Llama 3 8B and LoRA fine-tune it": the object of the next clause
        state.carry = f"{state.carry} {_unmask(clause, kept)}".strip()
        return sentence_condition, scope
    m = re.match(r"^(?:it|them|this|that)\s+to\s+(\w+)\s+(.*)$", obj, re.I)
    if verb == "use" and m is not None and m.group(1).lower() in VERBS:
        verb, obj = m.group(1).lower(), m.group(2)
    if verb in _AGGREGATE and found is None:
        scope = []  # "…, then merge the results": one step over what the scope made
    into = re.search(r"\binto\s+(\d+|" + _NUM[1:-1] + r")\s+(?:[\w-]+\s+){0,2}?([a-z][\w-]*s)\b",
                     obj, re.I)
    if verb in _SPLIT_VERBS and into is not None and _num(into.group(1)) >= 2:
        # "split the scene into 64 patches, run the U-Net on each patch": how many patches
        state.counts.setdefault(stem(into.group(2)), _num(into.group(1)))
    items, obj, shards = _fanout(obj, mods, state, scope=scope, fan_trials=fan_trials, verb=verb,
                                 own_scope=found is not None)
    subjects = [obj]
    if not (mods.parallel or meanwhile) and not items and verb in _TRAIN_VERBS:
        # "train an XGBoost and a LightGBM model": several models are parallel work
        co = _coordinated(obj)
        if co is not None and len(co[1]) >= 2 and all(MODEL_WORDS.search(p) for p in co[1]):
            subjects = [" ".join(f"{co[0]}{p}{co[2]}".split()) for p in co[1]]
    if (mods.parallel or meanwhile) and not items and len(subjects) == 1:
        co = _coordinated(obj)
        if co is not None:
            prefix, parts, suffix = co
            if (any(_TOOLS.search(p) for p in parts) or re.search(r"\bboth\b", obj, re.I)
                    or all(len(p.split()) >= 2 for p in parts)):
                subjects = [" ".join(f"{prefix}{p}{suffix}".split()) for p in parts]
            else:
                items = [p.split()[-1] for p in parts]
    if pre_task:
        out.tasks.append(Task(pre_task, "run", pre_task, state.stage, hook=hook))
        state.stage += 1
    stage = state.stage
    if (condition is not None and condition.otherwise) or either:
        stage = max(state.condition_stage, 0)
    elif meanwhile and out.tasks and out.tasks[-1].hook == hook:
        stage = out.tasks[-1].stage  # "…, and in the meantime run the Soda checks"
    elif (len(subjects) == 1 and not items and out.tasks and out.tasks[-1].hook == hook
          and out.tasks[-1].stage == state.stage - 1 and out.tasks[-1].condition == condition
          and re.search(r"\b(?:at\s+the\s+same\s+time|simultaneously|concurrently)\s*[.!]?\s*$",
                        original, re.I)):
        # "notify #ops on Slack and email ops@x.com at the same time": with the step before
        stage = out.tasks[-1].stage
    extra = " ".join(x for x in (state.carry, heading) if x)
    state.carry = ""
    for subject in subjects:
        text = original if len(subjects) == 1 else _unmask(f"{verb} {subject}", kept)
        task = Task(text=f"{text} ({extra})" if extra else text, verb=verb, obj=subject,
                    stage=stage, items=tuple(_unmask(i, kept) for i in items), hook=hook,
                    condition=condition, loop_max=loop_max, loop_until=loop_until,
                    tune_trials=tune_trials, tune_sampler=tune_sampler, unconditional=either,
                    shards=shards)
        _apply(task, mods)
        out.tasks.append(task)
    if condition is not None and not condition.otherwise and not either:
        state.last_condition, state.condition_stage = condition, stage
    if stage >= state.stage:
        state.stage = stage + 1
    if after_text:
        v, o = _first_verb(after_text)
        out.tasks.append(Task(_unmask(after_text, kept), v, _unmask(o, kept), state.stage,
                              hook=hook))
        state.stage += 1
    return sentence_condition, scope


def _negate(comp: tuple[str, str, str]) -> Condition:
    """The condition under which "unless METRIC OP VALUE" runs the step."""
    metric, op, value = comp
    return Condition(metric, _NEGATED_OPS[op], value)


_NEGATED_OPS = {">": "<=", ">=": "<", "<": ">=", "<=": ">", "==": "!=", "!=": "=="}
_SCOPE = re.compile(
    r"^(?:for|in|across|over|on)\s+(?:each|every|all)?\s*(?:one\s+)?(?:of\s+)?(?:the|our|these|"
    r"those|its|their)?\s*(?:(\d+|" + _NUM[1:-1] + r")\s+)?((?:[\w-]+\s+){0,3}?[\w-]+?)\s*"
    r"(?:\(([^)]*)\))?\s*(?:,\s*|$)", re.I)


_SCOPE_OPEN = re.compile(_SCOPE.pattern.replace(r"(?:,\s*|$)", r"(?:(?<=\))\s+|\s+(?=\w+\s))"),
                         re.I)


def _scope_without_comma(clause: str) -> re.Match[str] | None:
    """A scope phrase the clause goes on from without a comma: "for each plant (A, B, C)
    resample …", "for each type run …" -- it ends at its parenthesized list, or before a
    verb."""
    if re.match(r"in\s+(?:the\s+meantime|that\s+case|parallel|turn|addition|the\s+end)\b", clause,
                re.I):
        return None  # a sequence phrase, not a scope
    m = _SCOPE_OPEN.match(clause)
    if m is None or not clause[m.end():].split():
        return None
    if not m.group(3) and not verb_form(clause[m.end():].split(maxsplit=1)[0]):
        return None
    return m


def _scope_first(clause: str) -> str:
    """A scope inside the clause, moved before it: "train a model for each market (br, mx,
    cl)" reads as "for each market (br, mx, cl) train a model"; "summarize each of the 20
    largest topics with an LLM" as "for each of the 20 largest topics, summarize it with an
    LLM"."""
    m = re.match(r"^(\w[\w-]*)\s+each\s+of\s+(?:the|our|these|those|its|their)\s+((?:\d+|"
                 + _NUM[1:-1] + r")\s+(?:[\w-]+\s+){0,2}?[\w-]+s)\b(.*)$", clause, re.I)
    if m is not None and verb_form(m.group(1)):
        rest = m.group(3)
        listed = re.search(r"\s*\(([^()]*,[^()]*)\)", rest)
        count = _num(m.group(2).split()[0])
        if listed is not None and len(_split_list(listed.group(1))) == count:
            # "train each of the five models on the wine data (forest, …, knn)": the list
            # names the items
            return (f"for each of the {m.group(2)} ({listed.group(1)}), {m.group(1)} it"
                    f"{rest[: listed.start()]}{rest[listed.end():]}")
        return f"for each of the {m.group(2)}, {m.group(1)} it{rest}"
    m = re.match(r"^(\w[\w-]*\s.*?)\s+(for\s+(?:each|every)\s+(?:[\w-]+\s+){0,2}?[\w-]+\s*"
                 r"\([^()]*,[^()]*\))(.*)$", clause, re.I)
    if m is not None and verb_form(m.group(1).split()[0]):
        return f"{m.group(2)} {m.group(1)}{m.group(3)}"
    return clause


def _scope_phrase(clause: str, state: _State, kept: list[str]) -> tuple[list[str] | None, str]:
    """Items of a leading "for each of the 7 call centers," / "across the three regions
    (NA, EMEA and APAC)," / "for every site," phrase, and the clause after it."""
    m = _SCOPE.match(clause)
    bare = _scope_without_comma(clause)
    if (m is not None and bare is not None and bare.end() < m.end()
            and any(verb_form(w) for w in m.group(2).split()[1:])):
        m = bare  # "for each store run the ranker, …": the phrase ends before its verb
    m = m or bare
    if m is None or not re.match(r"^(?:for|in|across|over|on)\s+(?:each|every|all|the\s+\d|"
                                 r"the\s+(?:two|three|four|five|six|seven|eight|nine|ten)\b|"
                                 r"\w+(?:\s+\w+)*\s*\()", clause, re.I):
        return None, clause
    if not re.search(r"\b(?:each|every|all)\b|\(|\d|\b(?:two|three|four|five|six|seven|eight|"
                     r"nine|ten|twelve)\b", m.group(0), re.I):
        return None, clause
    rest = clause[m.end():]
    if m.group(3):
        listed = _unmask(m.group(3), kept)
        span = re.fullmatch(r"\s*([A-Za-z][\w-]*?)(\d+)\s+(?:through|to|thru|-|\u2013)\s+"
                            r"\1(\d+)\s*", listed)
        if span is not None and 2 <= int(span.group(3)) - int(span.group(2)) + 1 <= 1000:
            # "(PS-01 through PS-06)": every name of the range
            width = len(span.group(2))
            return [f"{span.group(1)}{i:0{width}d}" for i in range(
                int(span.group(2)), int(span.group(3)) + 1)], rest
        items = [_unmask(i, kept) for i in _split_list(m.group(3))]
        if len(items) >= 2:
            return items, rest
        if not m.group(1) or _num(m.group(1)) < 2:
            return None, clause
    if m.group(1):
        n = _num(m.group(1))
        unit = stem(m.group(2).split()[-1])
        state.counts[unit] = n
        return ([f"{unit}-{i}" for i in range(1, n + 1)], rest) if n >= 2 else (None, clause)
    if state.context_items:
        return list(state.context_items), rest
    unit = stem(m.group(2).split()[-1])
    if unit in state.counts:
        return [f"{unit}-{i}" for i in range(1, state.counts[unit] + 1)], rest
    if unit in state.named:
        return list(state.named[unit]), rest
    if _first_verb(rest)[0]:
        # "for every folder run the blur checks": how many is not said; the step runs once
        # over all of them (the caller notes it), it is not dropped
        return [], rest
    return None, clause


_WHOLE_RUN = re.compile(r"\b(?:whole|entire|overall|in\s+total|end[\s-]to[\s-]end|everything|all\s+"
                        r"(?:of\s+it|together)|the\s+(?:workflow|pipeline|run|dag))\b", re.I)


def _note_counts(state: _State, text: str) -> None:
    """Remember "12 distribution centers", "the 40 shards" for a later "for each center"."""
    for count in re.finditer(r"\b(\d+|" + _NUM[1:-1] + r")\s+(?:[\w-]+\s+){0,3}?([a-z][\w-]*s)\b",
                             text, re.I):
        if _num(count.group(1)) >= 2:
            state.counts.setdefault(stem(count.group(2)), _num(count.group(1)))


def _note_named(state: _State, text: str, kept: list[str]) -> None:
    """Remember "market (BR, MX, AR)" for a later "for each market"."""
    for named in re.finditer(r"\b([a-z][\w-]*)\s*\(([^()]*,[^()]*)\)", text, re.I):
        listed = [_unmask(i, kept) for i in _split_list(named.group(2))]
        if len(listed) >= 2 and all(len(i.split()) <= 3 for i in listed):
            state.named[stem(named.group(1))] = listed


def _no_verb(out: Request, state: _State, clause: str, kept: list[str], *, mods: _Mods,
             loop_max: int, loop_until: Condition | None, condition: Condition | None) -> None:
    """A clause without an imperative verb: modifiers of a named step, or context."""
    if (mods.any() or loop_max) and out.tasks:
        target = _referenced(out.tasks, _unmask(f"{clause} {mods.about}", kept)) or out.tasks[-1]
        _apply(target, mods)
        if mods.max_parallel and target.items:
            # "run at most 2 plants at a time": every step fanned out over those items
            for task in out.tasks:
                if task.items == target.items:
                    task.max_parallel = mods.max_parallel
        if loop_max:
            target.loop_max, target.loop_until = loop_max, loop_until
        return
    if loop_max:
        state.loop = (loop_max, loop_until)  # for the steps the sentence goes on to name
        return
    stop = re.search(r"\bstop\s+(?:when|once|as\s+soon\s+as|if)\s+(.+)$", clause, re.I)
    comp = _comparison(stop.group(1)) if stop is not None else None
    looping = [t for t in out.tasks if t.loop_max]
    if comp is not None and looping and looping[-1].loop_until is None:
        looping[-1].loop_until = _condition_text(Condition(*comp), kept)
        return
    if loop_until is not None and out.tasks:
        return
    text = _unmask(clause, kept).strip(" ,")
    if not re.search(r"[A-Za-z]", text):
        return
    if condition is not None:
        out.unplaced.append(text)
        return
    _note_counts(state, clause)
    names = _NAMES.search(clause)
    if names is not None:
        state.context_items = [_unmask(n, kept) for n in _split_list(names.group(1))]
    out.sources.extend(kept[int(i)] for i in re.findall(r"\x00(\d+)\x01", clause)
                       if "://" in kept[int(i)])
    # "Using the local file /data/claims/2023.csv, train …": a path is where the data is
    out.sources.extend(m.group(0) for m in re.finditer(
        r"(?<![\w/:])(?:~|\.{1,2})?/[\w.@+-]+(?:/[\w.@*+-]+)+/?", text))
    if re.search(r"\b(?:data|dataset|table|records|logs|files|images|recordings)\b.*\b(?:comes?|"
                 r"is|are|lives?|sits?|stored|located|kept|landed|lands)\s+(?:from|in|on|at)\b",
                 text, re.I):
        out.data.append(text)  # where the data is, for the step that loads it
    out.context.append(text)


def _fanout(obj: str, mods: _Mods, state: _State, *, scope: list[str], fan_trials: int,
            verb: str, own_scope: bool = False) -> tuple[list[str], str, int]:
    """(items, object without the list, shards this task makes); ``own_scope``: the clause
    itself said "for each …" (an aggregating verb then works per item)."""
    split_into = re.search(r"\b(?:into|in)\s+(\d+|" + _NUM[1:-1] + r")\s+(shards?|chunks?|"
                           r"parts?|partitions?|batches|pieces|splits|folds?)\b", obj, re.I)
    if split_into is not None and verb in ("split", "shard", "partition", "chunk", "divide",
                                           "break", "cut"):
        shards = _num(split_into.group(1))
        state.counts[stem(split_into.group(2))] = shards
        return [], obj, shards
    per = re.search(r"\b(?:one|a|an|separate)\s+" + _FAN_WORDS + r"?\s*(?:per|for\s+each)"
                    r"\s+([\w-]+)|\bper\s+([\w-]+)|\bfor\s+each\s+(?:of\s+the\s+)?"
                    r"(?:(\d+|\w+)\s+)?([\w-]+)|\beach\s+([\w-]+)\b", obj, re.I)
    listed = re.search(r"\b(?:per|for\s+each|each)\s+(?:[\w-]+\s+){0,2}?[\w-]+\s*"
                       r"\(([^()]*,[^()]*)\)", obj, re.I)
    if listed is not None and len(_split_list(listed.group(1))) >= 2:
        # "one DeepAR model per product category (grocery, electronics, …)"
        return _split_list(listed.group(1)), obj[: listed.start(1) - 1] + obj[listed.end():], 0
    fan = _fanout_list(obj)
    if fan is not None and (mods.parallel or per is not None or mods.max_parallel
                            or mods.per_item or re.search(r"\b(?:each|every)\b", obj, re.I)):
        return fan[0], fan[1], 0
    if verb in _AGGREGATE and not (own_scope and scope):
        return [], obj, 0  # "merge the shards", "collate the scores": one step over all
    counted = re.match(r"^\s*(?:the\s+)?(\d+|" + _NUM[1:-1] + r")\s+(?:[\w-]+\s+){0,2}?(folds|"
                       r"shards|partitions|chunks|batches|splits|replicas|seeds|copies|variants|"
                       r"workers)\b", obj, re.I)
    if counted is not None and (mods.parallel or re.search(r"\beach\b", obj, re.I)) \
            and _num(counted.group(1)) >= 2:
        # "train 5 cross-validation folds in parallel, each on 2 A100s"
        n = _num(counted.group(1))
        state.counts[stem(counted.group(2))] = n
        return [f"{stem(counted.group(2))}-{i}" for i in range(1, n + 1)], obj, 0
    batches = re.search(r"\b(?:in|into|as|across|over\s+(?:the\s+|all\s+)?)\s*(\d+|" + _NUM[1:-1]
                        + r")\s+(?:[\w-]+\s+)?"
                        r"(batches|shards|workers|nodes|machines|pods|processes|executors|"
                        r"chunks|parts|partitions|waves|groups|pieces|folds|jobs|splits)\b",
                        obj, re.I)
    if batches is not None and _num(batches.group(1)) >= 2:
        state.counts[stem(batches.group(2))] = _num(batches.group(1))
        rest = (obj[: batches.start()] + obj[batches.end():]).strip()
        return [str(i) for i in range(_num(batches.group(1)))], rest, 0
    if scope:
        return list(scope), obj, 0
    if fan_trials:
        return [f"trial-{i}" for i in range(1, fan_trials + 1)], obj, 0
    items = _count(obj, state.counts, per)
    if not items and per is not None and state.context_items:
        items = list(state.context_items)
    if not items and (mods.max_parallel or per is not None):
        # "the 200 recordings, 25 at a time", "the 6 regional models, one job per region"
        many = re.search(r"(?:\b(?:the|all|these|our|its|their|for)\s+(?:all\s+)?|\()(\d[\d,]*|"
                         + _NUM[1:-1] + r")\s+(?:[\w-]+\s+){0,3}?([a-z][\w-]*?)s\b", obj, re.I)
        n = _num(many.group(1).replace(",", "")) if many is not None else 0
        if many is not None and 2 <= n <= 1000:
            items = [f"{stem(many.group(2))}-{i}" for i in range(1, n + 1)]
    return items, obj, 0


def _count(obj: str, counts: dict[str, int], per: re.Match[str] | None) -> list[str]:
    """Items of a fan-out given by a count: "per substation (there are 9 of them)",
    "10-fold … one job per fold", "score the shards" after "split into 16 shards"."""
    fold = re.search(r"\b(\d+)[\s-]fold\b", obj, re.I)
    if fold is not None and (per is not None or re.search(r"cross[\s-]?validat", obj, re.I)):
        # "5-fold cross-validation": one run per fold
        return [f"fold-{i}" for i in range(int(fold.group(1)))]
    if per is not None:
        unit = next((g for g in per.groups()[1:] if g and not g.isdigit()
                     and g.lower() not in _NUM_WORDS), per.group(1) or "")
        unit = per.group(1) or per.group(2) or per.group(4) or per.group(5) or unit
        n = re.search(r"\(?\s*there\s+are\s+(\d+|\w+)|\b(\d+|" + _NUM[1:-1] + r")\s+(?:of\s+"
                      r"them|" + re.escape(unit) + r"(?:e?s)?)\b", obj, re.I)
        if per.group(3):
            n = re.match(r"(\d+|\w+)", per.group(3))
        if n is not None:
            count = _num(next(g for g in n.groups() if g))
            if count > 1:
                return [f"{stem(unit)}-{i}" for i in range(1, count + 1)]
        if stem(unit) in counts:
            return [str(i) for i in range(counts[stem(unit)])]
    for unit, size in counts.items():
        if re.search(r"\b(?:the|each|every|all)\s+(?:\w+\s+)?" + re.escape(unit) + r"(?:e?s)?\b",
                     obj, re.I):
            return [str(i) for i in range(size)]
    return []


#: The bound of a loop the request gives no bound for ("keep training until …").
DEFAULT_LOOP_MAX = 10
_GIVE_UP = re.compile(r"^\s*(?:and\s+)?(?:give\s+up|stop(?:\s+trying)?|quit|bail(?:\s+out)?|abort)"
                      r"\s+after\s+(?:the\s+)?(\d+|\w+?)(?:st|nd|rd|th)?\s+(?:attempts?|tries|"
                      r"rounds?|iterations?|times|cycles?|passes|chunks?)\s*\.?\s*$", re.I)


def _loop(clause: str) -> tuple[int, Condition | None, str]:
    """"in rounds of 3 epochs; … stop as soon as it passes 0.95 or after the 8th round"."""
    m = next((c for c in re.finditer(
        r"\b(?:or\s+)?(?:after|at\s+most|up\s+to|(?:no|not|never)\s+more\s+than|"
        r"a\s+maximum\s+of|max(?:imum)?)\s+(?:the\s+)?(\d+|\w+?)(?:st|nd|rd|th)?\s+(rounds?|"
        r"iterations?|cycles?|passes|attempts|repetitions|times|chunks)\b", clause, re.I)
        if _ORDINAL.get(c.group(1).lower()) or _num(c.group(1))), None)
    rest = clause if m is None else clause[: m.start()] + clause[m.end():]
    until = re.search(r"\b(?:stop|until|till)\b(?:\s+or)?(?:\s+as\s+soon\s+as)?\s+(.*?)"
                      r"(?=\s+or\s+after|\s*,|\s*$)", rest, re.I)
    if m is None:
        # "keep fine-tuning … until WER is under 0.2": a loop whose bound may come later
        # ("give up after 10 attempts"); DEFAULT_LOOP_MAX until then
        if until is None or _comparison(until.group(1)) is None or not re.search(
                r"^\s*(?:and\s+)?(?:keep|continue|repeat|iterate|loop)\b", clause, re.I):
            return 0, None, clause
        n = DEFAULT_LOOP_MAX
    elif not (until or re.search(r"\brounds?\b|\brepeat|\biterat|\bloop\b", clause, re.I)):
        return 0, None, clause
    else:
        word = m.group(1).lower()
        n = _ORDINAL.get(word) or _num(word)
    if not n:
        return 0, None, clause
    condition = None
    if until is not None:
        comp = _comparison(until.group(1))
        if comp is not None:
            condition = Condition(comp[0], comp[1], comp[2])
        rest = re.sub(r"\b(?:and\s+)?(?:stop|until|till)\b.*$", "", rest, flags=re.I)
    rest = re.sub(r"\b(?:after\s+each\s+\w+\s*,?\s*)?(?:check|measure|evaluate)\b.*$", "", rest,
                  flags=re.I) if condition is not None else rest
    return n, condition, rest


def _tuning(clause: str) -> tuple[int, str, int, str]:
    """(tune trials, sampler, fan-out trials, clause): "30 Optuna trials using the TPE
    sampler" tunes; "50 hyperparameter trials as separate jobs" fans out."""
    m = re.search(r"\b(\d+|" + _NUM[1:-1] + r")\s+(?:\w+\s+){0,2}?(?:trials?|configurations|"
                  r"settings|candidates)\b", clause, re.I)
    if m is None:
        return 0, "", 0, clause
    n = _num(m.group(1))
    if re.search(r"\bseparate\s+(?:jobs?|pods?|tasks?)\b|\bone\s+(?:job|pod)\s+(?:per|each)\b|"
                 r"\bas\s+(?:separate\s+)?jobs\b|\bat\s+a\s+time\b|\bat\s+once\b|"
                 r"\bown\s+(?:job|pod|task|container)\b", clause, re.I):
        return 0, "", n, clause
    if not re.search(r"\b(?:tun\w+|optuna|bayes\w*|tpe|hyper-?parameter|search|optimi[sz]\w*|"
                     r"random\s+search|trials?)\b", clause, re.I):
        return 0, "", 0, clause
    sampler = ("random" if re.search(r"\brandom\b", clause, re.I) else
               "grid" if re.search(r"\bgrid\b", clause, re.I) else
               "cmaes" if re.search(r"\bcma-?es\b", clause, re.I) else "tpe")
    return n, sampler, 0, clause


def _apply(task: Task, mods: _Mods) -> None:
    task.gpu = mods.gpu or task.gpu
    task.memory = mods.memory or task.memory
    task.cpu = mods.cpu or task.cpu
    task.retries = mods.retries or task.retries
    task.timeout = mods.timeout or task.timeout
    task.max_parallel = mods.max_parallel or task.max_parallel


def _content(text: str) -> set[str]:
    return {stem(w) for w in words(text) if w not in _STOP and len(w) > 2}


def _referenced(tasks: list[Task], text: str) -> Task | None:
    """The task a modifier sentence names ("the embedding step", "the scraper")."""
    want = _content(text) - {"step", "job", "task", "run", "workflow", "pipeline"}
    best: tuple[int, int] | None = None
    for i, t in enumerate(tasks):
        have = _content(t.text) | {stem(t.verb)}
        score = sum(1 for w in want if any(h.startswith(w[:5]) or w.startswith(h[:5])
                                           for h in have if len(h) >= 4))
        if score and (best is None or score > best[0]):
            best = (score, i)
    return tasks[best[1]] if best else None

"""A POSIX ``sh`` entrypoint that retries a step inside its container, by failure class.

Engines without back-off or retry-by-cause (Tekton, KFP) run the step's command
through the script :func:`script` generates. It

* runs the command, its stderr teed to a log (the container's stderr still shows it)
  and its stdout passed through, or written to ``stdout_path``;
* classifies each failed attempt with the classes of :mod:`couler.failures`: the sh
  tests are *generated from* :data:`couler.failures.PATTERNS` -- a log pattern's regex
  becomes a ``grep -Ei`` pattern (:func:`grep_pattern`), a traceback pattern's
  exception names a ``case`` over the last exception of the last traceback (found with
  ``awk``), the exit-code and signal patterns tests of ``$rc``; memory evidence is the
  cgroup's ``oom_kill`` counter rising during the attempt. Patterns the engine decides
  (``source == "engine reason"``: OOMKilled, evictions, the step's timeout) are not
  visible from inside the container and are skipped (:data:`ENGINE_ONLY`). The repeat
  rule is the same: an unknown failure is ``transient`` once and ``user`` when the
  attempt before ended with the same exit code and error line (numbers blanked);
* retries when the class is in the policy's ``on`` (or ``on`` has ``any``) and the
  limit is not reached, sleeping ``base * factor**n`` seconds (capped) first -- the
  delays are computed here, so the script does no floating-point arithmetic;
* writes ``attempts=N``, ``class=C`` (empty on success), ``pattern=P`` and ``exit=RC``
  lines to ``status_path`` and exits with the last attempt's exit code.

Why sh and not the Python classifier itself: step images need not have Python (alpine,
distroless shells); ``sh``, ``grep -E``, ``awk``, ``sed``, ``tail`` and ``tee`` are in
every image that has a shell (busybox included). Translating the patterns rather than
copying them keeps one source of truth: :func:`grep_pattern` refuses a regex construct
it cannot translate, so a new pattern in :mod:`couler.failures` fails the tests here
until it is handled.

What the wrapper cannot do: raise the memory limit between attempts (the container's
limit is fixed), or retry a pod the platform lost (the engine's own retries do that).
Fractional ``sleep`` needs GNU coreutils or busybox (both accept it).

Pure: builds text, runs nothing.
"""

from __future__ import annotations

import shlex
from collections.abc import Collection, Sequence

from couler import failures, ir

__all__ = [
    "DEFAULT_OOM_FILES",
    "ENGINE_ONLY",
    "argv",
    "delays",
    "fragment",
    "grep_pattern",
    "needs_wrapper",
    "script",
]

#: Where a container reads its cgroup's OOM-kill counter (cgroup v2, then v1).
DEFAULT_OOM_FILES = ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control")

#: Patterns only the engine can decide (what it reports about the pod, not the process).
ENGINE_ONLY = "engine reason"

_LOG_TAIL = 8192  # bytes of stderr classified, as the local engine does
_WORD = "[:alnum:]_"
_LATER_LINE = r"\n(?:.*\n)*?"  # "on a later line" in a multi-line log regex


def needs_wrapper(policy: ir.RetryPolicy | None) -> bool:
    """Whether ``policy`` asks for what only the wrapper does (back-off, classes)."""
    return policy is not None and (policy.backoff is not None
                                   or set(policy.on) != {ir.FailureClass.ANY})


def delays(policy: ir.RetryPolicy) -> list[float]:
    """Seconds slept before each retry: ``base * factor**n``, capped (0 without back-off)."""
    b = policy.backoff
    out = []
    for n in range(policy.limit):
        if b is None:
            out.append(0.0)
            continue
        d = b.base_seconds * b.factor ** n
        out.append(min(d, b.cap_seconds) if b.cap_seconds is not None else d)
    return out


def grep_pattern(regex: str) -> list[str]:
    """A :mod:`couler.failures` log regex as POSIX ERE lines for ``grep -Ei``.

    One ERE per line the regex spans: a multi-line regex ``A\\n(?:.*\\n)*?B`` matches when
    a line matches ``A`` and a later line ``B``.

    Raises:
        ValueError: the regex uses a construct this translation does not know.
    """
    parts = regex.split(_LATER_LINE)
    if len(parts) > 1 and any("|" in p for p in parts):
        raise ValueError(f"cannot translate a multi-line alternation: {regex!r}")
    return [_ere(p, regex) for p in parts]


def _ere(part: str, whole: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(part):
        c = part[i]
        if part.startswith("(?:", i):
            out.append("(")
            i += 3
            continue
        if part.startswith("(?", i):
            raise ValueError(f"cannot translate group {part[i:i + 4]!r} in {whole!r}")
        if part.startswith("[^\\n]", i):
            out.append(".")
            i += 5
            continue
        if c == "\\":
            nxt = part[i + 1:i + 2]
            if nxt == "b":
                prev = "".join(out)[-1:]
                out.append(f"(^|[^{_WORD}])" if prev in ("", "|", "(")
                           else f"([^{_WORD}]|$)")
            elif nxt in (".", "/", "-", "(", ")", "[", "]", "*", "+", "?", "|"):
                out.append("\\" + nxt)
            else:
                raise ValueError(f"cannot translate escape \\{nxt} in {whole!r}")
            i += 2
            continue
        if c in "*+?}" and part[i + 1:i + 2] == "?":
            raise ValueError(f"cannot translate a lazy quantifier in {whole!r}")
        out.append(c)
        i += 1
    return "".join(out)


def _q(text: str) -> str:
    return shlex.quote(text)


def _log_test(regex: str, file: str = '"$couler_d/tail"') -> str:
    lines = grep_pattern(regex)
    if len(lines) == 1:
        return f"grep -Eiq -e {_q(lines[0])} {file}"
    # each later part on a line after the previous part's first match
    test = f"couler_n=$(grep -Ein -e {_q(lines[0])} {file} | head -n 1 | cut -d: -f1)"
    test += ' && [ -n "$couler_n" ]'
    for later in lines[1:]:
        test += (f" && couler_n=$(tail -n +$((couler_n + 1)) {file} | grep -Ein -e "
                 f"{_q(later)} | head -n 1 | cut -d: -f1) && [ -n \"$couler_n\" ]")
    return "{ " + test + "; }"


def _names_test(names: frozenset[str]) -> str:
    alts = "|".join(sorted(names))
    return (f'{{ case "$couler_exc" in {alts}) true;; *) case "$couler_exc_short" in '
            f'{alts}) true;; *) false;; esac;; esac; }}')


def _tests() -> list[tuple[str, str, str]]:
    """(pattern name, class, sh test) for every pattern observable from the container."""
    by_name = {p.name: p for p in failures.PATTERNS}
    memory = by_name["log-oom"].regex
    wrapped = [p for p in failures.PATTERNS if p.source == "log"
               and p.failure_class is ir.FailureClass.INFRA]
    special = {
        "memory-limit": '[ "$couler_oom" -eq 1 ]',
        "sigkill-memory": ('[ "$couler_rc" -eq 137 ] && { [ "$couler_oom" -eq 1 ] || '
                           f"{_log_test(memory)}; }}"),
        "sigkill": '[ "$couler_rc" -eq 137 ]',
        "sigterm": '[ "$couler_rc" -eq 143 ]',
        "python-wrapped-network": '[ -n "$couler_exc" ] && { ' + " || ".join(
            _log_test(p.regex, '"$couler_d/msg"') for p in wrapped) + "; }",
        "python-exception": '[ -n "$couler_exc" ]',
        "command-not-found": '{ [ "$couler_rc" -eq 126 ] || [ "$couler_rc" -eq 127 ]; }',
    }
    out = []
    for p in failures.PATTERNS:
        if p.source == ENGINE_ONLY:
            continue
        if p.regex:
            test = _log_test(p.regex)
        elif p.exceptions:
            test = '[ -n "$couler_exc" ] && ' + _names_test(p.exceptions)
        elif p.name in special:
            test = special[p.name]
        else:
            raise ValueError(f"failure pattern {p.name!r} has no sh translation")
        out.append((p.name, p.failure_class.value, test))
    return out


# The last exception of the last traceback (failures._last_exception): lines from the
# last "Traceback (most recent call last):" on, or the last three lines without one.
_SUFFIXES = ("Error|Exception|Exit|Interrupt|Iteration|Warning|timeout|gaierror|herror"
             "|Unavailable|Exceeded")  # failures._EXCEPTION_LINE's name endings
_AWK_EXCEPTION = r"""{ l[NR] = $0; i = index($0, "Traceback (most recent call last):")
  if (i) { s = NR; o = i } }
END { f = s ? s : NR - 2; if (f < 1) f = 1; e = ""
  for (k = f; k <= NR; k++) { x = l[k]; if (k == s) x = substr(x, o)
    sub(/[ \t\r]+$/, "", x)
    if (x == "" || x ~ /^[ \t]/) continue
    if (x ~ /^[A-Za-z_][A-Za-z0-9_.]*(SUFFIXES)(:.*)?$/) e = x }
  print e }""".replace("SUFFIXES", _SUFFIXES)


def fragment(policy: ir.RetryPolicy, run: str = '"$@"', *, status_path: str,
             stdout_path: str = "", work_dir: str = "/tmp/couler-entrypoint",
             oom_files: Sequence[str] = DEFAULT_OOM_FILES,
             stop_on: Collection[ir.FailureClass] = (), attempts_before: str = "") -> str:
    """sh lines that run ``run`` under ``policy`` and leave its exit code in ``$couler_rc``.

    Args:
        policy: the retry policy (limit, back-off, classes).
        run: the shell command line of one attempt (``"$@"``: the script's arguments).
        status_path: the file the attempt count and final class are written to ("" =
            ``status`` in the scratch directory).
        stdout_path: where each attempt's stdout goes ("" = the wrapper's stdout).
        work_dir: a scratch directory for the log and the exit code ("" = a new one made
            with ``mktemp -d``: for wrappers that may run side by side on one host, as
            kfp.local's steps do).
        oom_files: cgroup files whose ``oom_kill`` counter is memory evidence.
        stop_on: classes that end the attempts here whatever ``policy.on`` says (an
            engine that escalates memory runs the next attempt elsewhere on ``oom``).
        attempts_before: a shell variable holding the attempts already made elsewhere
            (they count against the limit and index the back-off delays); "" = none.
    """
    retry_all = ir.FailureClass.ANY in policy.on
    classes = " ".join(sorted(c.value for c in policy.on))
    sleep = " ".join(f"{d:g}" for d in delays(policy))
    out_fd = f"3>{_q(stdout_path)}" if stdout_path else "3>&1"
    oom = " ".join(_q(f) for f in oom_files)
    lines = [
        f'couler_d={_q(work_dir)}\nmkdir -p "$couler_d"' if work_dir else
        'couler_d=$(mktemp -d "${TMPDIR:-/tmp}/couler-entrypoint.XXXXXX") || exit 125',
        f"couler_delays={_q(sleep)}",
        f"couler_on={_q(classes)}",
        f"couler_attempt=${{{attempts_before}:-0}}" if attempts_before else "couler_attempt=0",
        "couler_prev=",
        "couler_oomkills() { "
        f"cat {oom} 2>/dev/null | awk '$1 == \"oom_kill\" {{ n += $2 }} END {{ print n + 0 }}'; }}",
        "while :; do",
        "  couler_attempt=$((couler_attempt + 1))",
        "  couler_oom0=$(couler_oomkills)",
        f'  {{ {{ {run} 2>&1 1>&3 3>&-; echo $? > "$couler_d/rc"; }} | tee "$couler_d/log" >&2; }}'
        f" {out_fd}",
        '  couler_rc=$(cat "$couler_d/rc")',
        '  couler_class= couler_pattern=',
        '  [ "$couler_rc" -eq 0 ] && break',
        '  couler_oom=0; [ "$(couler_oomkills)" -gt "$couler_oom0" ] && couler_oom=1',
        f'  tail -c {_LOG_TAIL} "$couler_d/log" > "$couler_d/tail"',
        f"  couler_exc=$(awk {_q(_AWK_EXCEPTION)} \"$couler_d/tail\")",
        '  couler_exc_msg=${couler_exc#*:}',
        '  [ "$couler_exc_msg" = "$couler_exc" ] && couler_exc_msg=',
        '  couler_exc=${couler_exc%%:*}; couler_exc_short=${couler_exc##*.}',
        '  printf \'%s\\n\' "$couler_exc_msg" > "$couler_d/msg"',
    ]
    first = True
    for name, cls, test in _tests():
        kw = "if" if first else "elif"
        lines.append(f"  {kw} {test}; then couler_class={cls} couler_pattern={name}")
        first = False
    lines += [
        "  fi",
        '  couler_err=$(grep -v \'^[[:space:]]*$\' "$couler_d/tail" | tail -n 1 | '
        "sed -e 's/^[[:space:]]*//' -e 's/[[:space:]]*$//' "
        "-e 's/0x[0-9a-fA-F][0-9a-fA-F]*/#/g' -e 's/[0-9][0-9]*/#/g' | cut -c 1-300)",
        '  if [ -z "$couler_class" ]; then',
        '    if [ "$couler_prev" = "$couler_rc $couler_err" ]; then',
        "      couler_class=user couler_pattern=same-error-twice",
        "    else couler_class=transient couler_pattern=unknown-exit; fi",
        "  fi",
        '  couler_prev="$couler_rc $couler_err"',
        '  echo "couler: attempt $couler_attempt failed (exit $couler_rc): $couler_class'
        ' ($couler_pattern)" >&2',
        f"  [ \"$couler_attempt\" -gt {policy.limit} ] && break",
    ]
    if stop_on:
        stop = " ".join(sorted(c.value for c in stop_on))
        lines.append(f'  case " {stop} " in *" $couler_class "*) break;; esac')
    if not retry_all:
        lines.append('  case " $couler_on " in *" $couler_class "*) ;; *) break;; esac')
    lines += [
        '  couler_delay=$(echo "$couler_delays" | cut -d " " -f "$couler_attempt")',
        '  [ "$couler_delay" = 0 ] || sleep "$couler_delay"',
        "done",
        'printf \'attempts=%s\\nclass=%s\\npattern=%s\\nexit=%s\\n\' "$couler_attempt" '
        '"$couler_class" "$couler_pattern" "$couler_rc" > '
        + (_q(status_path) if status_path else '"$couler_d/status"'),
    ]
    return "\n".join(lines) + "\n"


def script(policy: ir.RetryPolicy, run: str = '"$@"', *, status_path: str,
           stdout_path: str = "", work_dir: str = "/tmp/couler-entrypoint",
           oom_files: Sequence[str] = DEFAULT_OOM_FILES,
           stop_on: Collection[ir.FailureClass] = (), attempts_before: str = "") -> str:
    """A whole ``#!/bin/sh`` script: :func:`fragment`, then exit with the last exit code."""
    body = fragment(policy, run, status_path=status_path, stdout_path=stdout_path,
                    work_dir=work_dir, oom_files=oom_files, stop_on=stop_on,
                    attempts_before=attempts_before)
    return "#!/bin/sh\n" + body + 'exit "$couler_rc"\n'


def argv(policy: ir.RetryPolicy, command: Sequence[str], *, status_path: str,
         stdout_path: str = "") -> list[str]:
    """``["/bin/sh", "-c", SCRIPT, "couler-entrypoint", *command]``: a container command."""
    return ["/bin/sh", "-c", script(policy, status_path=status_path, stdout_path=stdout_path),
            "couler-entrypoint", *command]



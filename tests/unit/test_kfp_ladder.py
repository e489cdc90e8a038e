"""The pure parts of memory escalation on KFP (no kfp needed): the memory levels (shared with
Tekton), the quantities the rungs set, and the local-mode rung script run by /bin/sh.

tests/integration/test_kfp_memory.py compiles the ladder with the kfp SDK and runs it on
kfp.local; here the rung script's hand-over rule is run directly, case by case.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from couler import ir
from couler.compilers import kfp
from couler.compilers.kfp._helpers import _binary_quantity, _ladder_levels, _rung_script
from couler.compilers.kube import memory_levels
from couler.engines.base import Feature, Support

C = ir.FailureClass
POLICY = ir.RetryPolicy(limit=3, on=(C.OOM, C.TRANSIENT), memory_factor=2.0,
                        memory_ceiling="4Gi")

# argv: COUNTER OOMS KIND. Attempt n: killed for memory while n <= OOMS, then KIND
# ("ok": prints, "user": a ValueError, "transient": an unknown exit, once).
COMMAND = r'''
c=$(cat "$1" 2>/dev/null || echo 0); c=$((c + 1)); echo "$c" > "$1"
if [ "$c" -le "$2" ]; then echo 'Killed: out of memory' >&2; exit 137; fi
case "$3" in
  user) echo 'ValueError: learning rate must be positive' >&2; exit 1;;
  transient) if [ ! -e "$1.once" ]; then : > "$1.once"; exit 3; fi;;
esac
echo "trained at attempt $c"
'''


def rung(tmp_path: Path, *, last: bool, before: int, ooms: int, kind: str = "ok",
         policy: ir.RetryPolicy = POLICY, env: dict[str, str] | None = None
         ) -> tuple[int, str, str, str]:
    """Run one rung: (exit code, class output, attempts output, stdout)."""
    out = tmp_path / f"out-{before}-{last}"
    proc = subprocess.run(
        ["/bin/sh", "-c", _rung_script(policy, last=last), "couler-rung", str(out / "class"),
         str(out / "attempts"), str(before), "/bin/sh", "-c", COMMAND, "cmd",
         str(tmp_path / "count"), str(ooms), kind],
        capture_output=True, text=True, timeout=60, check=False, env=env)
    return (proc.returncode, (out / "class").read_text(), (out / "attempts").read_text(),
            proc.stdout)


def test_memory_levels_are_shared_and_capped() -> None:
    res = ir.Resources(memory_request="512Mi", memory_limit="1Gi")
    levels = memory_levels(POLICY, res)
    # the limit stops at the ceiling; the request goes on growing up to it: a 4th level
    assert [lv["limits"]["memory"] for lv in levels] == [
        "1Gi", str(2 << 30), str(4 << 30), str(4 << 30)]
    assert [lv["requests"]["memory"] for lv in levels] == [
        "512Mi", str(1 << 30), str(2 << 30), str(4 << 30)]
    limit_only = memory_levels(POLICY, ir.Resources(memory_limit="1Gi"))
    assert [lv["limits"]["memory"] for lv in limit_only] == ["1Gi", str(2 << 30), str(4 << 30)]
    assert memory_levels(ir.RetryPolicy(limit=3, on=(C.OOM,)), res) == []  # no factor
    assert len(memory_levels(ir.RetryPolicy(limit=1, memory_factor=2.0), res)) == 2  # limit+1


def test_binary_quantity() -> None:
    assert [_binary_quantity(q) for q in (str(2 << 30), str(3 << 20), "1536", "1000", "1Gi")] \
        == ["2Gi", "3Mi", "1536", "1000", "1Gi"]  # 1536 = 1.5Ki: left in bytes


def test_capability_is_a_documented_rewrite() -> None:
    cap = kfp.CAPABILITIES[Feature.MEMORY_ESCALATION]
    assert cap.support is Support.REWRITTEN
    assert "dsl.If" in cap.note and "OneOf" in cap.note


def test_a_rung_hands_over_at_an_oom_and_the_next_one_trains(tmp_path: Path) -> None:
    assert rung(tmp_path, last=False, before=0, ooms=1) == (0, "oom", "1", "")
    assert rung(tmp_path, last=False, before=1, ooms=1) == (0, "", "2",
                                                             "trained at attempt 2\n")


def test_a_user_error_fails_the_rung_with_its_exit_code(tmp_path: Path) -> None:
    assert rung(tmp_path, last=False, before=0, ooms=0, kind="user")[:3] == (1, "user", "1")


def test_a_transient_failure_is_retried_inside_the_rung(tmp_path: Path) -> None:
    code, cls, attempts, out = rung(tmp_path, last=False, before=0, ooms=0, kind="transient")
    assert (code, cls, attempts, out) == (0, "", "2", "trained at attempt 2\n")


def test_no_hand_over_when_the_attempts_are_used_up(tmp_path: Path) -> None:
    # 3 attempts made before: the 4th (limit 3 → 4 in all) is the last, even out of memory
    assert rung(tmp_path, last=False, before=3, ooms=9)[:3] == (137, "oom", "4")


def test_the_last_rung_retries_an_oom_in_place_to_the_limit(tmp_path: Path) -> None:
    assert rung(tmp_path, last=True, before=2, ooms=9)[:3] == (137, "oom", "4")
    assert (tmp_path / "count").read_text().strip() == "2"  # attempts 3 and 4 ran here


def test_a_policy_not_retrying_oom_builds_no_ladder() -> None:
    res = ir.Resources(memory_limit="1Gi")
    policy = ir.RetryPolicy(limit=2, on=(C.TRANSIENT,), memory_factor=2.0)
    assert memory_levels(policy, res)  # memory levels exist, but an OOM is not retried
    assert _ladder_levels(policy, res) == []
    assert len(_ladder_levels(ir.RetryPolicy(limit=2, memory_factor=2.0), res)) == 3  # any


def test_a_later_rung_first_waits_the_back_off_of_the_attempts_before(tmp_path: Path) -> None:
    """The rung before stopped at the OOM before sleeping; this one sleeps that delay."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "sleep"  # records the delays instead of sleeping
    fake.write_text(f'#!/bin/sh\necho "$1" >> {tmp_path / "slept"}\n')
    fake.chmod(0o755)
    policy = ir.RetryPolicy(limit=3, on=(C.OOM,), memory_factor=2.0,
                            backoff=ir.Backoff(base_seconds=5, factor=2, cap_seconds=15))
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}")
    assert rung(tmp_path, last=False, before=0, ooms=1, policy=policy, env=env)[:3] == (
        0, "oom", "1")
    assert not (tmp_path / "slept").exists()  # the hand-over does not sleep
    assert rung(tmp_path, last=True, before=2, ooms=2, policy=policy, env=env)[:3] == (
        0, "", "4")
    # delays 5, 10, 15 (capped): 10 before attempt 3 (after attempt 2, in the rung before),
    # 15 before attempt 4 (an OOM retried in place by the last rung)
    assert (tmp_path / "slept").read_text().split() == ["10", "15"]

"""``couler cache ...`` and ``couler status RUN`` against a ``couler up`` stack (issue 10,
item 6).

``python -m couler up`` in a temporary ``COULER_HOME``; a program submitted and waited
for, so that the cache commits its steps; ``couler cache ls / show / pin / unpin / stats``
on them; the program submitted again, every step reused, and ``couler status RUN`` saying
how much compute that saved; the errors a user meets; ``couler cache evict``. The tests of
this module run in file order on one stack.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from couler_runtime import stack

from .conftest import leftovers, recorded_pids, wait_until

pytestmark = [pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
PROGRAM = """\
import couler.argo as couler

couler.run_container(image="alpine", command=["sh", "-c", "sleep 1; echo prepared"],
                     step_name="prepare")
couler.run_container(image="alpine", command=["sh", "-c", "sleep 2; echo trained"],
                     step_name="train")
"""


@dataclass
class CliStack:
    home: Path
    env: dict[str, str]
    program: Path
    runs: dict[str, str] = field(default_factory=dict)
    keys: dict[str, str] = field(default_factory=dict)  # step -> cache key

    def couler(self, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "couler", *args], env=self.env,
                              cwd=REPO, capture_output=True, text=True, timeout=timeout,
                              check=False)

    def json(self, *args: str) -> Any:
        done = self.couler(*args, "--json")
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)


@pytest.fixture(scope="module")
def cli(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CliStack]:
    home = tmp_path_factory.mktemp("couler-home")
    program = tmp_path_factory.mktemp("program") / "pipeline.py"
    program.write_text(PROGRAM)
    env = {k: v for k, v in os.environ.items() if not k.startswith("COULER_")}
    env["COULER_HOME"] = str(home)
    up = subprocess.run([sys.executable, "-m", "couler", "up"], env=env, cwd=REPO,
                        capture_output=True, text=True, timeout=120, check=False)
    assert up.returncode == 0, up.stderr
    try:
        yield CliStack(home, env, program)
    finally:
        pids = recorded_pids(home)
        stack.down(home)
        assert leftovers(home, pids) == []


def test_a_first_run_fills_the_cache(cli: CliStack) -> None:
    record = cli.json("submit", str(cli.program), "--wait")
    assert record["state"] == "succeeded" and record["cached_steps"] == []
    assert record["cache_saved_seconds"] == 0
    cli.runs["first"] = record["run_id"]

    entries: list[dict[str, Any]] = []

    def committed() -> bool:
        entries[:] = cli.json("cache", "ls", "--workflow", "pipeline")["entries"]
        return len(entries) == 2

    wait_until(committed, "the cache commits both steps")
    cli.keys = {e["step"]: e["key"] for e in entries}
    assert sorted(cli.keys) == ["prepare", "train"]


def test_ls_shows_a_table_and_orders(cli: CliStack) -> None:
    done = cli.couler("cache", "ls")
    assert done.returncode == 0, done.stderr
    header, *rows, footer = done.stdout.splitlines()
    assert header.split() == ["KEY", "WORKFLOW/STEP", "SIZE", "COST", "HITS", "LAST", "USED",
                              "PINNED"]
    assert {row.split()[1] for row in rows} == {"pipeline/prepare", "pipeline/train"}
    for row in rows:
        assert row.split()[0] in (cli.keys["prepare"][:12], cli.keys["train"][:12])
        assert re.search(r"\b\d+(\.\d)?s\b", row), row  # the cost, as people read it
    assert footer.startswith("2 entries shown of 2 (") and "next to be evicted first" in footer

    by_cost = cli.json("cache", "ls", "--order", "cost")["entries"]
    assert [e["step"] for e in by_cost] == ["train", "prepare"]  # slept 2 s against 1 s
    assert by_cost[0]["cost_seconds"] >= 2 and by_cost[1]["cost_seconds"] >= 1
    assert cli.json("cache", "ls", "--step", "train")["entries"][0]["key"] == cli.keys["train"]
    limited = cli.json("cache", "ls", "--limit", "1")
    assert len(limited["entries"]) == 1 and limited["more"] is True


def test_show_and_stats_count_no_hit(cli: CliStack) -> None:
    before = cli.json("cache", "stats")
    train = cli.keys["train"]
    done = cli.couler("cache", "show", train[:10])
    assert done.returncode == 0, done.stderr
    assert re.search(rf"^key:\s+{train}$", done.stdout, re.M), done.stdout
    assert re.search(r"^step:\s+train$", done.stdout, re.M)
    assert re.search(r"^cost:\s+\d+(\.\d)?s of compute$", done.stdout, re.M), done.stdout
    assert re.search(r"^outputs:$", done.stdout, re.M) or "hits:" in done.stdout
    shown = cli.json("cache", "show", train)
    assert shown["key"] == train and shown["hits"] == 0 and not shown["pinned"]
    after = cli.json("cache", "stats")
    assert after["entries"] == 2 and after["policy"] == "value"
    assert (after["hits"], after["misses"]) == (before["hits"], before["misses"])


def test_pin_and_unpin(cli: CliStack) -> None:
    prepare = cli.keys["prepare"]
    done = cli.couler("cache", "pin", prepare[:8])
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"pinned 1 entry: {prepare[:12]}"
    victims = cli.json("cache", "ls")["entries"]
    assert [e["key"] for e in victims][-1] == prepare and victims[-1]["pinned"]
    assert re.search(rf"^{prepare[:12]}\s.*\spinned$", cli.couler("cache", "ls").stdout, re.M)
    done = cli.couler("cache", "unpin", prepare)
    assert done.returncode == 0 and done.stdout.startswith("unpinned 1 entry: ")
    assert not cli.json("cache", "show", prepare)["pinned"]


def test_a_second_run_reuses_every_step_and_status_says_what_it_saved(cli: CliStack) -> None:
    costs = {e["step"]: e["cost_seconds"] for e in cli.json("cache", "ls")["entries"]}
    record = cli.json("submit", str(cli.program), "--wait")
    assert record["state"] == "succeeded"
    assert record["cached_steps"] == ["prepare", "train"]
    saved = {s["name"]: s["cache_saved_seconds"] for s in record["steps"]}
    assert saved == costs
    run_id = cli.runs["second"] = record["run_id"]

    done = cli.couler("status", run_id)
    assert done.returncode == 0, done.stderr
    assert re.search(r"^  train\s+cached \(reused from cache, saved \d+(\.\d)?s of compute\)$",
                     done.stdout, re.M), done.stdout
    assert re.search(r"^reused 2 of 2 steps from the cache, saved \d+(\.\d)?s of compute$",
                     done.stdout, re.M), done.stdout
    status = cli.json("status", run_id)
    assert status["reused_steps"] == 2
    assert status["cache_saved_seconds"] == pytest.approx(sum(costs.values()))
    first = cli.couler("status", cli.runs["first"])
    assert "reused 0 of 2 steps from the cache" in first.stdout
    assert cli.json("cache", "show", cli.keys["train"])["hits"] == 1


def test_errors_are_one_line_and_name_what_is_wrong(cli: CliStack) -> None:
    done = cli.couler("cache", "show", "ffffffffff")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "couler: error: show: field 'key': no cache entry has the key or key prefix "
        "'ffffffffff'"]
    done = cli.couler("cache", "show", cli.keys["train"][:5])
    assert done.returncode == 2 and "at least 8 hex digits" in done.stderr
    done = cli.couler("cache", "evict", "ffffffffff", cli.keys["train"])
    assert done.returncode == 2 and "'ffffffffff'" in done.stderr
    assert cli.json("cache", "stats")["entries"] == 2  # nothing evicted: all or nothing
    done = cli.couler("cache", "ls", "--address", "127.0.0.1:1")
    assert done.returncode == 2
    assert done.stderr.startswith("couler: error: the cache at 127.0.0.1:1 is not reachable")
    assert len(done.stderr.strip().splitlines()) == 1
    done = cli.couler("cache", "evict")
    assert done.returncode == 2 and "give KEY... and/or --free-bytes" in done.stderr


def test_evict_by_key_then_by_bytes(cli: CliStack) -> None:
    train = cli.keys["train"]
    done = cli.couler("cache", "evict", train[:12])
    assert done.returncode == 0, done.stderr
    assert re.fullmatch(rf"evicted 1 entry, freed \d+(\.\d)? \w+: {train[:12]}\n",
                        done.stdout), done.stdout
    (left,) = cli.json("cache", "ls")["entries"]
    assert left["key"] == cli.keys["prepare"]
    gone = cli.json("cache", "evict", "--free-bytes", "1")
    assert gone == {"evicted": [left["key"]], "freed_bytes": left["size_bytes"]}
    done = cli.couler("cache", "ls")
    assert (done.returncode, done.stdout) == (0, "no cache entries\n")

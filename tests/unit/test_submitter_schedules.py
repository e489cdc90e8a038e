"""The submitter's schedule and trigger logic without services: cron ticks in a time zone,
missed ticks, and the event filter language (``couler_submitter.schedules`` / ``.triggers``)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from couler import ir
from couler_submitter.schedules import due_ticks, next_tick
from couler_submitter.triggers import filter_matches


def test_ticks_follow_the_time_zone() -> None:
    nine_tokyo = ir.CronSchedule("0 9 * * *", timezone="Asia/Tokyo")
    start = datetime(2026, 3, 1, 12, 0, tzinfo=UTC).timestamp()
    # 09:00 in Tokyo is 00:00 UTC the next day
    assert next_tick(nine_tokyo, start) == datetime(2026, 3, 2, 0, 0, tzinfo=UTC).timestamp()
    utc = ir.CronSchedule("0 9 * * *")
    assert next_tick(utc, start) == datetime(2026, 3, 2, 9, 0, tzinfo=UTC).timestamp()
    ticks, dropped = due_ticks(ir.CronSchedule("* * * * *"), start, start + 600, limit=3)
    assert ticks == [start + 480, start + 540, start + 600] and dropped == 7


def test_trigger_filters() -> None:
    body = {"rows": "12", "kind": "csv", "partial": "false", "tag": "v10"}
    assert filter_matches("", body) and filter_matches("  ", {})
    assert filter_matches("body.rows > 9", body)  # numerically: "12" > 9, not "12" > "9"
    assert not filter_matches("body.rows < 9", body)
    assert filter_matches("body['kind'] == 'csv' and not body.partial", body)
    assert filter_matches("body.kind in ('csv', 'tsv') or body.rows == 0", body)
    assert not filter_matches("body.kind not in ['csv']", body)
    assert filter_matches("body.tag > 'v1'", body)  # strings compare as strings
    assert not filter_matches("body.missing == 'x'", body)  # a field it lacks: false
    assert not filter_matches("body.missing != 'x'", body)
    for bad in ("__import__('os').system('true')", "body.rows.real", "len(body)",
                "body.rows + 1 > 2", "[x for x in body]", "body["):
        with pytest.raises(ValueError):
            filter_matches(bad, body)

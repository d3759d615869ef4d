"""Events (docs/language.md §1): ts formats, optional id, flat attributes, null = absent, nesting rejected."""

from __future__ import annotations

import pytest

from profiles.errors import EventError, ManyErrors
from profiles.events import parse_event_line, read_events

pytestmark = pytest.mark.fast  # in-process: `make test-fast` runs it


def test_ts_rfc3339_with_offset_or_epoch_seconds() -> None:
    assert parse_event_line('{"ts": "2024-03-01T22:15:00Z"}', 1).ts == 1709331300.0
    assert parse_event_line('{"ts": "2024-03-01T23:15:00+01:00"}', 1).ts == 1709331300.0
    assert parse_event_line('{"ts": 1709331300}', 1).ts == 1709331300.0
    assert parse_event_line('{"ts": 1709331300.5}', 1).ts == 1709331300.5


def test_id_is_optional_and_defaults_to_the_line_number() -> None:
    assert parse_event_line('{"id": "e7", "ts": 1}', 4).id == "e7"
    assert parse_event_line('{"ts": 1}', 4).id == "#4"
    evs = read_events(['{"ts": 1}\n', "\n", '{"ts": 2, "id": "x"}\n', '{"ts": 3}\n'])
    assert [e.id for e in evs] == ["#1", "x", "#4"]  # 1-based, blank lines still counted


def test_attributes_are_flat_scalars_and_null_means_absent() -> None:
    ev = parse_event_line(
        '{"ts": 1, "room": "273", "value": 31.5, "n": 2, "ok": true, "battery": null}', 1
    )
    assert ev.attrs == {"room": "273", "value": 31.5, "n": 2, "ok": True}
    assert "battery" not in ev.attrs


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        ('{"ts": 1, "loc": {"x": 1}}', "key 'loc' holds a nested object"),
        ('{"ts": 1, "tags": ["a"]}', "key 'tags' holds a nested array"),
        ('{"ts": "2024-03-01T22:15:00"}', "no zone offset"),
        ('{"ts": "yesterday"}', "RFC 3339"),
        ('{"ts": true}', "not a boolean"),
        ('{"ts": null}', "missing required key 'ts'"),
        ('{"k": "A"}', "missing required key 'ts'"),
        ('{"ts": 1, "id": 5}', "key 'id' must be a string"),
        ('{"ts": NaN}', "NaN is not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        ("{not json", "invalid JSON"),
    ],
)
def test_bad_events_are_rejected_with_line_and_reason(line: str, needle: str) -> None:
    with pytest.raises(EventError) as e:
        parse_event_line(line, 9)
    assert needle in str(e.value) and "line 9" in str(e.value)


def test_read_events_reports_every_bad_line() -> None:
    with pytest.raises(ManyErrors) as e:
        read_events(['{"ts": 1}\n', '{"ts": 2, "loc": {"x": 1}}\n', "oops\n"])
    text = [str(x) for x in e.value.errors]
    assert len(text) == 2 and "line 2" in text[0] and "'loc'" in text[0] and "line 3" in text[1]


@pytest.mark.parametrize("ts", ["1709331300000", "1709331300000.5", "-1709331300000"])
def test_epoch_milliseconds_are_rejected_not_taken_as_seconds(ts: str) -> None:
    with pytest.raises(EventError) as e:
        parse_event_line(f'{{"ts": {ts}}}', 3)
    assert "looks like epoch milliseconds; send seconds" in str(e.value) and "line 3" in str(
        e.value
    )
    assert (
        parse_event_line('{"ts": 99999999999}', 1).ts == 99999999999.0
    )  # year 5138: still seconds

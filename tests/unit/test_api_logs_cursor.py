"""The log cursor's text form at the REST boundary."""

from __future__ import annotations

import pytest

from trainforge_services.api.logs import format_cursor, parse_cursor
from trainforge_services.common.errors import InvalidArgument


def test_cursor_round_trips_in_a_stable_order():
    cursor = {"10:1": 3, "1:2": 60, "1:1": 57, "0:1": 5}
    text = format_cursor(cursor)
    assert text == "0:1=5,1:1=57,1:2=60,10:1=3"
    assert parse_cursor(text) == cursor
    assert parse_cursor("") == {} and parse_cursor(None) == {} and format_cursor({}) == ""


@pytest.mark.parametrize("bad", ["garbage", "0:1", "0=5", "a:1=2", "0:1=5,", "0:1=-1"])
def test_bad_cursors_name_the_after_parameter(bad):
    with pytest.raises(InvalidArgument) as e:
        parse_cursor(bad)
    assert e.value.details[0]["field"] == "after"

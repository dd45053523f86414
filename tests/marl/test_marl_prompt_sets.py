"""Prompt sets as data: the built-in sets' messages, loading and validation of a set file, the importer."""

from __future__ import annotations

import json

from prompt_cases import FIXTURE, all_messages


def test_builtin_sets_send_the_recorded_messages_byte_for_byte():
    """default and paper send, in every built-in workflow and task kind, the messages recorded before the
    wordings moved from code into prompt files."""
    recorded = json.loads(FIXTURE.read_text())
    now = all_messages()
    assert sorted(now) == sorted(recorded)
    for case, turns in recorded.items():
        assert now[case] == turns, case

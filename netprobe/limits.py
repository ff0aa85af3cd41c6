"""Bounds that more than one layer applies: the spec's validator (which a server runs on
every request) and the command line's types, so that both refuse the same values.

Nothing here imports anything: the CLI reads it before it loads the schema.
"""

from __future__ import annotations

LONGEST_S = 7 * 86_400.0
"""The longest time a test's durations (``-t``, ``-O``, ``-i``) or a command's waits may
take: a week. Past any one test, and far inside what the waits built on them can take
(poll() counts milliseconds in a C int, 24.8 days; a timed wait's time_t overflows at
about 1e19 s, which is where a huge ``-i`` used to end in a traceback mid-test)."""

"""A test run's outcome from its JUnit XML report (what pytest ``--junitxml``, CTest, Maven and
most CI tools write), read with the standard library's ``xml.etree``.

The root is ``<testsuites>`` or a single ``<testsuite>``; each ``<testcase>`` counts once, and
it failed when it holds ``<failure>``, errored when it holds ``<error>``, was skipped with
``<skipped>``. The counts are taken from the test cases themselves, not from the suites'
``tests=``/``failures=`` attributes, which some writers leave out or get wrong. The run is
``pass`` when at least one test passed and none failed or errored (``result_of``).
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

from turnout.oracle.yamlpos import read_input

#: The largest report read, bytes (a report of 100,000 cases is a few tens of MB).
MAX_BYTES = 64 * 1024 * 1024


class JUnitError(ValueError):
    """A file that is not a JUnit report; the message says why."""


def result_of(num_tests: int, num_failures: int, num_errors: int, num_skipped: int) -> str:
    """``pass`` when no test failed or errored and at least one passed, else ``fail``: a run of
    no test, or of skipped tests only, proves nothing. The service refuses evidence whose
    ``result`` disagrees with its counts by this rule (``EvidenceIn``)."""
    passed = num_tests - num_failures - num_errors - num_skipped
    return "pass" if num_failures == 0 and num_errors == 0 and passed >= 1 else "fail"


@dataclass(frozen=True)
class JUnitRun:
    num_tests: int
    num_failures: int
    num_errors: int
    num_skipped: int
    suites: tuple[str, ...]  # the ``name`` of each test suite, in order
    failed: tuple[str, ...]  # ``classname::name`` of failed and errored cases (the first 20)

    @property
    def result(self) -> str:
        """``pass`` or ``fail`` (``result_of``)."""
        return result_of(self.num_tests, self.num_failures, self.num_errors, self.num_skipped)

    def summary(self) -> str:
        """``3 failed, 1 errored, 2 skipped of 120 tests``."""
        parts = [
            f"{n} {what}"
            for n, what in (
                (self.num_failures, "failed"),
                (self.num_errors, "errored"),
                (self.num_skipped, "skipped"),
            )
            if n
        ]
        return (", ".join(parts) + " of " if parts else "") + f"{self.num_tests} tests"


def parse_junit(text: bytes) -> JUnitRun:
    """The run of a JUnit report's bytes. Raises JUnitError: not XML, or its root is neither
    ``testsuites`` nor ``testsuite``."""
    try:
        root = ET.fromstring(text)
    except ET.ParseError as err:
        raise JUnitError(f"not XML: {err}") from None
    if root.tag not in ("testsuites", "testsuite"):
        raise JUnitError(
            f"the root element is <{root.tag}>, not <testsuites> or <testsuite>: not a JUnit report"
        )
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    counts = {"failure": 0, "error": 0, "skipped": 0}
    failed: list[str] = []
    num = 0
    for case in root.iter("testcase"):
        num += 1
        outcome = next((c.tag for c in case if c.tag in counts), None)
        if outcome is not None:
            counts[outcome] += 1
        if outcome in ("failure", "error") and len(failed) < 20:
            failed.append(f"{case.get('classname', '')}::{case.get('name', '')}")
    return JUnitRun(
        num,
        counts["failure"],
        counts["error"],
        counts["skipped"],
        tuple(s.get("name", "") for s in suites),
        tuple(failed),
    )


def read_junit(path: Path) -> JUnitRun:
    """The run of the report at ``path``. Raises JUnitError: missing, unreadable, larger than
    :data:`MAX_BYTES`, or not a JUnit report."""
    try:
        text = read_input(path, MAX_BYTES)  # a FIFO, a device or a huge file: refused
    except OSError as err:
        raise JUnitError(f"{path}: {err.strerror or err}") from None
    try:
        return parse_junit(text)
    except JUnitError as err:
        raise JUnitError(f"{path}: {err}") from None

"""What the browser tests of the pages share: Debian's chromium (the ``browser`` fixture of
tests/dashboard/conftest.py launches one per test module), and a page signed in through the sign-in form that records every console
error and page error (and, when asked, every HTTP error response) it meets."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from service_helpers import LiveService

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
#: Mark a module's tests: they need chromium (scripts/ensure-chromium.sh installs it).
needs_chromium = pytest.mark.skipif(
    not Path(CHROMIUM).exists(), reason="chromium is not installed (scripts/ensure-chromium.sh)"
)


def signed_in(
    browser: Any,
    svc: LiveService,
    token: str,
    *,
    from_root: bool = False,
    http_errors: bool = False,
) -> tuple[Any, list[str]]:
    """A 1280x900 page signed in with ``token`` and the problems it records.

    ``from_root``: open ``/`` first and check it redirects to the sign-in form;
    ``http_errors``: record responses with a status >= 400 as problems too.
    """
    context = browser.new_context(viewport={"width": 1280, "height": 900}, accept_downloads=True)
    page = context.new_page()
    problems: list[str] = []
    page.on(
        "console",
        lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None,
    )
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    if http_errors:
        page.on(
            "response",
            lambda r: problems.append(f"HTTP {r.status} {r.url}") if r.status >= 400 else None,
        )
    if from_root:
        page.goto(svc.url + "/")
        assert page.url.endswith("/login")
    else:
        page.goto(svc.url + "/login")
    page.fill("input[name=token]", token)
    page.click("button[type=submit]")
    page.wait_for_url(svc.url + "/")
    return page, problems

#!/usr/bin/env bash
# Page tests drive Debian's chromium through Playwright (no browser download). Install it when
# it is missing and we may use apt; otherwise say so, and the page tests skip with that message.
set -u
if command -v chromium >/dev/null 2>&1; then exit 0; fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    (apt-get install -y -q chromium >/dev/null 2>&1 || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium >/dev/null 2>&1; }) \
        && exit 0
fi
echo "ensure-chromium: chromium is not installed and could not be installed; page tests will skip" >&2
exit 0

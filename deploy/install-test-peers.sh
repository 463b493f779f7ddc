#!/usr/bin/env bash
# Installs the outside peers the test suite talks to (INTERFACES.md §1).
# Nothing is needed yet beyond the Python test extras; SIP peers (sipp, baresip) and Redis join
# here as the issues that use them land. Under CI=true a missing peer must fail the run.
set -euo pipefail
exit 0

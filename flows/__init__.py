"""Prefect flows and the `embforge` command line: composition only, no maths."""

import os

# Prefect's temporary server (used when no PREFECT_API_URL is set) can take longer than its
# default 20 s to start on a busy 2-core machine.
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
# Prefect's server sends usage telemetry by default; offline it only produces errors.
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

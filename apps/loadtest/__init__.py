"""``edgerun loadtest``: a bounded load generator for OpenAI-compatible servers on this machine.

It streams completions (SSE) from N concurrent clients for S seconds and reports TTFT and
end-to-end latency percentiles, aggregate decode tokens/s, and the count of each outcome
(answered, 429 rejected, 504 timed out, errors). With a latency target it searches for the
highest concurrency that meets it. It talks to loopback only, and each loop is bounded in
count and in time.

    target.py    the loopback-only base URL and endpoint paths
    workload.py  prompts (built in or from a file) and the priority mix
    client.py    one streamed request and what came of it
    run.py       the timed run, its statistics, and the capacity search
"""

from apps.loadtest.run import Capacity, LoadSpec, Report, find_capacity, run_load
from apps.loadtest.target import loopback_base

__all__ = ["Capacity", "LoadSpec", "Report", "find_capacity", "loopback_base", "run_load"]

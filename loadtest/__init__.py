"""Load tests that measure what a listener feels: TTFA, E2E, RTF, underrun, throughput, 503s.

`python -m loadtest run | compare | report` (see loadtest/README.md); `loadtest/hey.sh` for a
quick status-code and throughput check with `hey`.
"""

"""jobkit's benchmarks: `make bench` (python -m bench). See docs/internals/benchmarks.md."""

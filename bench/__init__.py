"""jobkit's benchmarks: `make bench` (python -m bench). See README, section Benchmarks."""

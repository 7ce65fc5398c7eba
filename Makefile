# The README's commands. `make demo` and `make test` work from a clean clone.
.PHONY: demo test bench setup generate

setup:
	scripts/setup.sh

demo: setup
	.venv/bin/pgjobkit demo

test:
	scripts/test.sh

bench: setup
	.venv/bin/python -m bench

generate:  # the blocking twins of the async sources (make test fails when one is stale)
	.venv/bin/python tools/async_to_sync.py

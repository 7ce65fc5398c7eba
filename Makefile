# The README's commands. `make demo` and `make test` work from a clean clone.
.PHONY: demo test bench setup

setup:
	scripts/setup.sh

demo: setup
	.venv/bin/jobkit demo

test:
	scripts/test.sh

bench: setup
	.venv/bin/python -m bench

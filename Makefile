# The README's commands. `make demo` and `make test` work from a clean clone.
.PHONY: demo test bench setup generate docs

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

docs: setup  # the manual (mkdocs.yml, docs/) at http://127.0.0.1:8000, rebuilt on each edit
	.venv/bin/mkdocs serve

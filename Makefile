# The two entry points of the README. Both run the idempotent set-up first.
.PHONY: setup demo test lint
setup:
	@scripts/setup.sh
demo: setup
	.venv/bin/cdc demo
test: setup
	.venv/bin/ruff check .
	.venv/bin/lint-imports --no-cache
	.venv/bin/python -m pytest
lint: setup
	.venv/bin/ruff check . && .venv/bin/ruff format --check .

# The two entry points of the README. Both run the idempotent set-up first.
.PHONY: setup demo test test-slow lint docs
setup:
	@scripts/setup.sh
demo: setup
	.venv/bin/cdc demo
test: setup
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/lint-imports --no-cache
	.venv/bin/mypy  # settings and checked folders: pyproject.toml [tool.mypy]
	# two sessions side by side, a test module each at a time: a lone session kept the 2 cores
	# 60% busy (waits on services and subprocesses); two kept them 92% busy and a slice of four
	# modules took 766 s instead of 972 s (docs/development.md "Test sessions")
	.venv/bin/python -m pytest -m "not slow" -n 2 --dist loadfile
# Long campaigns (crash rounds, load tests): run before resolving an issue
# whose code they exercise; not part of CI's time budget.
test-slow: setup
	.venv/bin/python -m pytest -m slow
lint: setup
	.venv/bin/ruff check . && .venv/bin/ruff format --check .
# The documentation site (docs/, mkdocs.yml) into site/; the reference pages are regenerated first.
docs: setup
	.venv/bin/python scripts/gen_docs.py
	.venv/bin/mkdocs build --strict

"""Derived views (docs/derived-views.md): SQL analysis (sql.py with scope.py, the plan and its rewrites in plan.py, check.py), the view stage (state.py, base.py, maintain.py)."""

"""Derived views (docs/derived-views.md): SQL analysis (sql.py, check.py), the view stage (state.py, base.py, maintain.py)."""

"""Derived views (README "Derived views"): SQL analysis (sql.py, check.py), the view stage (state.py, base.py, maintain.py)."""

"""The dashboard's pages and htmx fragments (session + CSRF). The integration API is api/ (config/api.py
assembles it)."""

"""The dashboard's pages and htmx fragments (session + CSRF). The integration API is api/ (assembled by config/api.py)."""

"""The dashboard's pages and htmx fragments (session + CSRF). The integration API is runs/api.py."""

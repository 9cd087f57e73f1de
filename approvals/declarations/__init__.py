"""Declarations as code: a project's tools, MCP servers, classifications, agents, workflows, policies and
waivers kept in files, applied and exported (docs/declarations.md)."""

"""Agents, model prices and versions: shared configuration (the workflows' admin is the engine's, in
runs/admin.py: its action starts runs)."""

from django.contrib import admin

from tenancy.admin_scope import GlobalConfigAdmin

from .models import Agent, ModelPrice, ModelVersion


@admin.register(Agent)
class AgentAdmin(GlobalConfigAdmin):
    """Agents are shared by every project (their tools are trusted configuration): superusers edit them."""

    list_display = ["slug", "name", "provider", "model", "is_planner", "max_attempts"]
    list_filter = ["provider", "is_planner"]
    search_fields = ["slug", "name", "instructions"]


@admin.register(ModelPrice)
class ModelPriceAdmin(GlobalConfigAdmin):
    list_display = ["provider", "model", "input_usd_per_mtok", "output_usd_per_mtok"]
    list_filter = ["provider"]
    search_fields = ["model"]


@admin.register(ModelVersion)
class ModelVersionAdmin(GlobalConfigAdmin):
    list_display = ["slug", "name"]
    search_fields = ["slug", "name"]

from django.contrib import admin

from .models import Agent, Workflow


@admin.register(Agent)
class AgentAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "provider", "model", "is_planner", "max_attempts"]
    list_filter = ["provider", "is_planner"]
    search_fields = ["slug", "name", "instructions"]


@admin.register(Workflow)
class WorkflowAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "planner", "planner_agent", "max_tasks", "max_concurrent_tasks"]
    list_filter = ["planner"]
    search_fields = ["slug", "name", "description"]

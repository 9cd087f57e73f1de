"""Admin of the reference evaluations: suites and their cases (edited by the project's admins), their
passes, results and reviewers' annotations (read-only: written by the services)."""

from django import forms
from django.contrib import admin

from runs.admin import RunData
from tenancy.admin_scope import ScopedAdmin, ScopedInline

from .checks import checks_refusal
from .models import Annotation, EvalCase, EvalResult, EvalRun, EvalSuite
from .suites import rerun_on_refusal


class EvalCaseForm(forms.ModelForm):
    """Checks are validated as the API validates them: a bad one is refused here, not found failing later."""

    class Meta:
        model = EvalCase
        fields = ["name", "workflow", "baseline_workflow", "goal", "input", "checks"]

    def clean_checks(self):
        checks = self.cleaned_data["checks"]
        errors = checks_refusal(checks)
        if errors:
            raise forms.ValidationError([error["message"] for error in errors])
        return checks


class EvalCaseInline(ScopedInline, admin.StackedInline):
    model = EvalCase
    form = EvalCaseForm
    extra = 0
    fields = ["name", "workflow", "baseline_workflow", "goal", "input", "checks"]


class EvalSuiteForm(forms.ModelForm):
    class Meta:
        model = EvalSuite
        fields = ["slug", "name", "description", "project", "rerun_on", "quarantine"]
        widgets = {"quarantine": forms.CheckboxSelectMultiple}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # Only this suite's own cases can be its known failures (a new suite has none yet).
        if "quarantine" in self.fields:  # absent where the admin shows the suite read-only
            self.fields["quarantine"].queryset = (
                self.instance.cases.all() if self.instance.pk else EvalCase.objects.none()
            )

    def clean_rerun_on(self):
        rerun_on = self.cleaned_data["rerun_on"]
        errors = rerun_on_refusal(rerun_on)
        if errors:
            raise forms.ValidationError([error["message"] for error in errors])
        return rerun_on


@admin.register(EvalSuite)
class EvalSuiteAdmin(ScopedAdmin):
    """Suites are a project's configuration: its admins write them (and their cases)."""

    form = EvalSuiteForm
    project_path = "project"
    change_action = add_action = delete_action = "administer"
    list_display = ["slug", "name", "project", "rerun_on"]
    list_filter = ["project"]
    search_fields = ["slug", "name", "description"]
    inlines = [EvalCaseInline]


@admin.register(EvalCase)
class EvalCaseAdmin(ScopedAdmin):
    project_path = "suite__project"
    change_action = add_action = delete_action = "administer"
    form = EvalCaseForm
    list_display = ["name", "suite", "workflow", "from_run"]
    list_filter = ["suite"]


@admin.register(EvalRun)
class EvalRunAdmin(RunData):
    project_path = "suite__project"
    list_display = ["id", "suite", "version", "baseline", "trigger", "started_by", "created_at", "accepted"]
    list_filter = ["suite"]


@admin.register(EvalResult)
class EvalResultAdmin(RunData):
    project_path = "run__project"
    list_display = ["eval_run", "case", "run", "passed", "judge_cost_micros"]
    list_filter = ["passed"]


@admin.register(Annotation)
class AnnotationAdmin(RunData):
    """Reviewers' scores and comments: written from the run page or the API (annotation_create), kept."""

    list_display = ["run", "target", "target_id", "score", "author", "created_at"]
    list_filter = ["target"]
    search_fields = ["=run__id", "comment"]

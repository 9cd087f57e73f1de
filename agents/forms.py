"""The agent's form: the admin and declarations as code (approvals/declarations) check an agent with it."""

from django import forms

from tools.secrets import SECRET_NAME

from .models import Agent
from .providers import endpoint_key_problems


class AgentForm(forms.ModelForm):
    base_url = forms.URLField(
        required=False, max_length=500, assume_scheme="https", help_text=Agent._meta.get_field("base_url").help_text
    )

    class Meta:
        model = Agent
        fields = "__all__"

    def clean(self):
        data = super().clean()
        name, project = data.get("api_key_secret") or "", data.get("project")
        openai = Agent.Provider.OPENAI in (data.get("provider"), data.get("fallback_provider"))
        for field in ("base_url", "api_key_secret", "send_max_tokens"):
            if data.get(field) and not openai:
                self.add_error(field, "only an OpenAI-compatible provider (or fallback) has its own endpoint")
        if name and not SECRET_NAME.fullmatch(name):
            self.add_error("api_key_secret", "a secret's name: upper case letters, digits and _")
        elif name and project is None:
            self.add_error("project", f"the project the key {name} is granted to")
        elif name and not self.errors:
            endpoint = {"api_key_secret": name, "project_id": project.id}
            for problem in endpoint_key_problems(endpoint, project_id=project.id):
                self.add_error("api_key_secret", problem)
        return data

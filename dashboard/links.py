"""The dashboard's pages as the layers below it name them (core.links): provided once, in apps.py."""

from django.urls import reverse


class DashboardPages:
    def run(self, run_id: int) -> str:
        return reverse("runs:detail", args=[run_id])

    def approval(self, request_id: int) -> str:
        return f"{reverse('approvals-queue')}#request-{request_id}"

    def decision_link(self, token: str) -> str:
        return reverse("approvals-link", args=[token])

    def breakers(self) -> str:
        return f"{reverse('inbox')}?kind=breaker"

"""Switch a shadow of a workflow's live runs on or off, or print its differences so far (docs/replay.md,
"Shadow runs")."""

import json

from django.core.management.base import BaseCommand, CommandError

from agents.models import Workflow
from core.errors import WardenError
from replay.management.commands.replay import edits_read
from replay.services import replay_diff
from replay.shadows import shadow_get, shadow_off, shadow_on
from tenancy.access import default_project
from tenancy.models import Project


class Command(BaseCommand):
    help = "Shadow a workflow's new runs with a candidate agent (zero effects), switch a shadow off, or show one."

    def add_arguments(self, parser):
        parser.add_argument("--workflow", default="", help="Switch a shadow of this workflow on")
        parser.add_argument("--project", default="", help="Its project's slug (default: the workflow's)")
        parser.add_argument("--agent", default="", help="The agent whose candidate follows (its slug)")
        parser.add_argument("--agent-version", type=int, default=None, help="One of the agent's version numbers")
        parser.add_argument("--edits", default="", help="...or a JSON file of a draft's fields")
        parser.add_argument("--off", type=int, default=None, help="Switch this shadow off (its twins stop now)")
        parser.add_argument("--show", type=int, default=None, help="Print this shadow's differences so far")
        parser.add_argument("--json", action="store_true", help="With --show: as JSON, as the API returns them")

    def handle(self, *, workflow, project, agent, agent_version, edits, off, show, **options):
        try:
            if off is not None:
                shadow = shadow_off(shadow=shadow_get(off), via="command")
                self.stdout.write(f"shadow {shadow.id} is off")
            elif show is not None:
                self._show(shadow_get(show), as_json=options["json"])
            elif workflow and agent:
                shadow = shadow_on(project=self._project(project, workflow), workflow=workflow, agent=agent,
                                   version=agent_version, edits=edits_read(edits), via="command")  # fmt: skip
                self.stdout.write(f"shadow {shadow.id}: new runs of {workflow} start a twin on {agent} "
                                  f"v{shadow.replay.candidate['version']}")  # fmt: skip
            else:
                raise CommandError("choose --workflow with --agent, --off ID or --show ID", returncode=2)
        except WardenError as exc:
            raise CommandError(str(exc), returncode=2) from exc

    def _project(self, slug: str, workflow: str) -> Project:
        if slug:
            found = Project.objects.filter(slug=slug).first()
            if found is None:
                raise CommandError(f"no project {slug!r}", returncode=2)
            return found
        wf = Workflow.objects.filter(slug=workflow).select_related("project").first()
        return (wf.project if wf and wf.project_id else None) or default_project()

    def _show(self, shadow, *, as_json: bool) -> None:
        diff = replay_diff(shadow.replay, latest=100)
        if as_json:
            self.stdout.write(json.dumps(diff, default=str))
            return
        total = diff["total"]
        self.stdout.write(
            f"shadow {shadow.id} of {shadow.workflow.slug} ({'on' if shadow.on else 'off'}): {total['runs']} "
            f"twin(s), {total['settled']} finished with their run, {total['differing']} differing; calls added "
            f"{total['calls_added']} (irreversible {total['irreversible_added']}), removed {total['calls_removed']}"
        )

"""The workers page's and GET /api/v1/workers' read: the worker processes and the tasks they hold."""

from core.errors import Forbidden
from runs.workers import WorkerRow, workers_list
from tenancy.access import authorize_token, project_ids
from tenancy.audit import audit


def workers_visible(user, *, token=None, request=None) -> list[WorkerRow]:
    """The worker processes, for someone who may operate in some project (workers are shared by all);
    the tasks each holds only of the projects they may see. Forbidden (audited) for anyone else."""
    if project_ids(user, "operate") == []:
        audit(actor=user, action="denied:operate", target="the workers", outcome="denied",
              detail={"why": "operates in no project"}, request=request)  # fmt: skip
        raise Forbidden("only someone who operates a project may see the workers")
    authorize_token(token, "read", what="the workers", request=request)  # a read, as every GET
    return workers_list(project_ids=project_ids(user, "view"))

"""An operator's verdict on an artifact: a rejected one is not used by any task that joins it."""

from core import bus
from core.errors import NotFound
from tenancy.audit import audited

from ..models import Artifact


def artifact_reject(
    *, artifact_id: int, reason: str = "rejected by an operator", actor=None, via: str = "", request=None
) -> Artifact:
    """Downstream tasks that have not started stop at the join (runs/services/execution.py) and the run
    needs attention; the artifact's provenance keeps who rejected it and why (the audit log too)."""
    who = {"actor": actor, "via": via, "request": request}
    with audited("artifact_reject", **who, target=f"artifact {artifact_id}", detail={"reason": reason}) as act:
        artifact = Artifact.objects.select_for_update().select_related("run").filter(id=artifact_id).first()
        if artifact is None:
            raise NotFound(f"artifact {artifact_id} does not exist")
        act.update(run_id=artifact.run_id, project_id=artifact.run.project_id)
        artifact.verification = Artifact.Verification.REJECTED
        artifact.provenance = {**artifact.provenance, "rejected": reason[:1000]}
        artifact.save(update_fields=["verification", "provenance"])
        bus.run_changed(artifact.run_id)
    return artifact

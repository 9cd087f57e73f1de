"""Allow rules revoked by reviewers (audited). They are created in approvals/rules.py, which checks the
tool's declaration; whether a rule may stand in for a reviewer at a call is policy/verdicts.py's."""

from django.utils import timezone

from core.errors import NotFound
from tenancy.access import authorize
from tenancy.audit import audit

from .models import AllowRule


def allow_rule_revoke(*, user, rule_id: int, token=None, request=None) -> AllowRule:
    rule = AllowRule.objects.select_related("project").filter(id=rule_id).first()
    if rule is None:
        raise NotFound(f"allow rule {rule_id} does not exist")
    authorize(user, rule.project_id, "decide", what=f"allow rule {rule_id}", token=token, request=request)
    if rule.revoked_at is None:
        AllowRule.objects.filter(id=rule.id, revoked_at__isnull=True).update(revoked_at=timezone.now(), revoked_by=user)
        audit(
            actor=user,
            action="allow_rule_revoke",
            project_id=rule.project_id,
            target=str(rule)[:200],
            request=request,
            detail={"rule": rule.id},
        )
    rule.refresh_from_db()
    return rule

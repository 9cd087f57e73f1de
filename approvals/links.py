"""Signed one-time decision links, sent in a request's e-mail and chat notifications.

The link carries a signed token (Django's signing, keyed by SECRET_KEY) naming a DecisionLink row. It
opens the request's card after login (a GET changes nothing); a POST from that page decides, through the
same service as the queue (role, separation of duties, quorum, the arguments hash the message showed),
and spends the link. It is refused once spent, once the request is decided, withdrawn or expired, and
after LINK_MAX_AGE_DAYS. Whoever holds a link still needs a login that may decide."""

import secrets

from django.conf import settings
from django.core import signing
from django.db import transaction
from django.utils import timezone

from core.errors import Conflict, NotFound

from .models import ApprovalRequest, DecisionLink

SALT = "warden.approvals.decision-link"
LINK_MAX_AGE_DAYS = 14


def decision_link(request: ApprovalRequest) -> str:
    """A new link to ``request`` (its top-level card), recorded so that it can be spent once."""
    top = ApprovalRequest.objects.get(id=request.parent_id) if request.parent_id else request
    link = DecisionLink.objects.create(nonce=secrets.token_urlsafe(24), request=top, arguments_hash=top.arguments_hash)
    token = signing.dumps({"n": link.nonce, "r": top.id}, salt=SALT, compress=True)
    return f"{settings.WARDEN['BASE_URL'].rstrip('/')}/approvals/link/{token}"


def link_open(token: str) -> DecisionLink:
    """The link a token names, if it may still decide; NotFound for a forged or unknown token (nothing
    learned), Conflict with the reason for one that is spent or whose request is no longer pending."""
    try:
        data = signing.loads(token, salt=SALT, max_age=LINK_MAX_AGE_DAYS * 86400)
    except signing.SignatureExpired:
        raise Conflict("this decision link has expired: decide from the reviewer queue") from None
    except signing.BadSignature:
        raise NotFound("no such decision link") from None
    link = DecisionLink.objects.select_related("request__run").filter(nonce=data.get("n"), request_id=data.get("r"))
    link = link.first()
    if link is None:
        raise NotFound("no such decision link")
    request = link.request
    if link.used_at is not None:
        raise Conflict(f"this link was used at {link.used_at:%Y-%m-%d %H:%M} UTC: it decides once")
    if request.status != ApprovalRequest.Status.PENDING:
        raise Conflict(f"approval request {request.id} is {request.status}: there is nothing left to decide")
    if request.expires_at and request.expires_at <= timezone.now():
        raise Conflict(f"approval request {request.id} has expired, and its links with it")
    return link


def link_decide(*, token: str, user, approve: bool, note: str = "", request=None) -> ApprovalRequest:
    """Decide through a link, once: the link row is locked and spent in the decision's transaction."""
    from .services import approval_decide

    with transaction.atomic():
        link = link_open(token)
        spent = DecisionLink.objects.filter(id=link.id, used_at__isnull=True).update(
            used_at=timezone.now(), used_by=user
        )
        if not spent:
            raise Conflict("this link was used a moment ago: it decides once")
        return approval_decide(
            request_id=link.request_id,
            user=user,
            approve=approve,
            note=note,
            seen_hash=link.arguments_hash,
            request=request,
        )

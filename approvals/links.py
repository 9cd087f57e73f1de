"""Signed one-time decision links, sent in a request's e-mail and chat notifications.

The link carries a signed token (Django's signing, keyed by SECRET_KEY) naming a DecisionLink row. It
opens the request's card after login (a GET changes nothing); a POST from that page decides, through the
same service as the queue (role, separation of duties, quorum, the arguments hash the message showed),
and spends the link. It is refused once spent, once the request is decided, withdrawn or expired, and
after LINK_MAX_AGE_DAYS. Whoever holds a link still needs a login that may decide, and someone outside
the request's project learns nothing from it, whatever state it is in."""

import secrets

from django.core import signing
from django.utils import timezone

from core import links
from core.errors import Conflict, NotFound
from policy.models import ApprovalRequest
from tenancy.access import authorize

from .models import DecisionLink

SALT = "warden.approvals.decision-link"
LINK_MAX_AGE_DAYS = 14
NO_SUCH_LINK = "no such decision link"


def decision_link(request: ApprovalRequest) -> str:
    """A new link to ``request`` (its top-level card), recorded so that it can be spent once."""
    top = ApprovalRequest.objects.get(id=request.parent_id) if request.parent_id else request
    link = DecisionLink.objects.create(nonce=secrets.token_urlsafe(24), request=top, arguments_hash=top.arguments_hash)
    token = signing.dumps({"n": link.nonce, "r": top.id}, salt=SALT, compress=True)
    return links.decision_link_url(token)


def link_open(token: str, *, user, request=None) -> DecisionLink:
    """The link a token names, if ``user`` may decide its request and it may still decide.

    Access is checked before anything about the link's state: a forged token, and any token of a
    project ``user`` is not a member of (valid, spent, aged or expired alike), is the same NotFound.
    A member whose role may not decide gets Forbidden; then Conflict says why a link is dead."""
    signer = signing.TimestampSigner(salt=SALT)
    try:
        data = signer.unsign_object(token)  # the signature only: the age is judged after access
    except signing.BadSignature:
        raise NotFound(NO_SUCH_LINK) from None
    approval = ApprovalRequest.objects.select_related("run").filter(id=data.get("r")).first()
    if approval is None:
        raise NotFound(NO_SUCH_LINK)
    try:
        authorize(user, approval.run.project_id, "decide", what=f"approval request {approval.id}", request=request)
    except NotFound:
        raise NotFound(NO_SUCH_LINK) from None
    try:
        signer.unsign(token, max_age=LINK_MAX_AGE_DAYS * 86400)
    except signing.SignatureExpired:
        raise Conflict("this decision link has expired: decide from the reviewer queue") from None
    link = DecisionLink.objects.select_related("request__run").filter(nonce=data.get("n"), request=approval).first()
    if link is None:
        raise NotFound(NO_SUCH_LINK)
    if link.used_at is not None:
        raise Conflict(f"this link was used at {link.used_at:%Y-%m-%d %H:%M} UTC: it decides once")
    if approval.status != ApprovalRequest.Status.PENDING:
        raise Conflict(f"approval request {approval.id} is {approval.status}: there is nothing left to decide")
    if approval.expires_at and approval.expires_at <= timezone.now():
        raise Conflict(f"approval request {approval.id} has expired, and its links with it")
    return link

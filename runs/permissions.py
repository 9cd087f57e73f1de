"""Who may do what. Django permissions for now; projects and roles refine this (approvals issue)."""

from .errors import Forbidden


def require(user, permission: str, action: str) -> None:
    if user is None or not user.is_active or not user.has_perm(permission):
        raise Forbidden(f"you may not {action} (needs the {permission} permission)")

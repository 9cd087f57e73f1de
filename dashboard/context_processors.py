"""What every page's template needs: which of the nav's pages the person may open."""

from django.utils.functional import SimpleLazyObject

from tenancy.access import actions_anywhere


def nav(request) -> dict:
    """``nav.start``, ``nav.operate``, ``nav.admin``…: lazy, so a page that draws no nav (a fragment, a JSON
    answer) asks nothing, and one that does asks once (tenancy.access.actions_anywhere). The pages check
    again; this only keeps out of the nav what would answer 403 or offer nothing to do."""
    user = getattr(request, "user", None)

    def links() -> dict:
        if user is None or not user.is_authenticated:
            return {}
        may = actions_anywhere(user)
        return {
            "start": "start" in may,  # Start a run: only workflows they may start are offered
            "operate": "operate" in may,  # Workers: operators of some project
            "admin": user.is_active and user.is_staff,  # the admin site lets in staff only
        }

    return {"nav": SimpleLazyObject(links)}

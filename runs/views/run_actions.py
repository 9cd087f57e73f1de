from django.http import HttpResponse


def _todo(request, **kwargs):  # placeholder until the run actions land
    return HttpResponse(status=501)


cancel = resume = compensate = task_retry = operation_resolve = _todo

from django.http import HttpResponse


def run_list(request):  # placeholder until the runs list lands
    return HttpResponse(status=501)


def run_bulk(request):
    return HttpResponse(status=501)

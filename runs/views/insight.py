from django.http import HttpResponse


def insight(request):  # placeholder until the insight page lands
    return HttpResponse(status=501)

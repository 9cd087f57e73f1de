from django.urls import path

from dashboard.consumers import InboxConsumer, RunConsumer, RunListConsumer

websocket_urlpatterns = [
    path("ws/inbox/", InboxConsumer.as_asgi()),
    path("ws/runs/", RunListConsumer.as_asgi()),
    path("ws/runs/<int:run_id>/", RunConsumer.as_asgi()),
]

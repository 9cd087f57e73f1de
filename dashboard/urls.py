from django.urls import path

from .views import evals, insight, replays, run_actions, run_page, run_start, runs_list

app_name = "runs"

urlpatterns = [
    path("runs/", runs_list.run_list, name="list"),
    path("runs/bulk", runs_list.run_bulk, name="bulk"),
    path("runs/start", run_start.run_start, name="start"),
    path("runs/<int:run_id>/", run_page.run_detail, name="detail"),
    path("runs/<int:run_id>/live", run_page.run_live, name="live"),
    path("runs/<int:run_id>/timeline", run_page.run_timeline, name="timeline"),
    path("runs/<int:run_id>/spans/<int:span_id>/children", run_page.span_children, name="span-children"),
    path("runs/<int:run_id>/spans/<int:span_id>/payload", run_page.span_payload, name="span-payload"),
    path("runs/<int:run_id>/artifacts/<int:artifact_id>", run_page.artifact_download, name="artifact"),
    path("runs/<int:run_id>/cancel", run_actions.cancel, name="cancel"),
    path("runs/<int:run_id>/resume", run_actions.resume, name="resume"),
    path("runs/<int:run_id>/compensate", run_actions.compensate, name="compensate"),
    path("runs/<int:run_id>/tasks/<int:task_id>/retry", run_actions.task_retry, name="task-retry"),
    path("runs/<int:run_id>/fork", run_actions.fork, name="fork"),
    path(
        "runs/<int:run_id>/operations/<int:operation_id>/resolve",
        run_actions.operation_resolve,
        name="operation-resolve",
    ),
    path(
        "runs/<int:run_id>/blackboard/<int:entry_id>/decide",
        run_actions.blackboard_decide,
        name="blackboard-decide",
    ),
    path("insight/", insight.insight, name="insight"),
    path("runs/<int:run_id>/annotate", evals.run_annotate, name="annotate"),
    path("runs/<int:run_id>/eval-case", evals.run_to_case, name="eval-case"),
    path("evals/", evals.eval_list, name="evals"),
    path("evals/new", evals.eval_new, name="eval-new"),
    path("evals/<int:suite_id>/", evals.eval_suite, name="eval-suite"),
    path("evals/<int:suite_id>/run", evals.eval_run, name="eval-run"),
    path("replays/", replays.replay_list, name="replays"),
    path("replays/new", replays.replay_new, name="replay-new"),
    path("replays/<int:replay_id>/", replays.replay_detail, name="replay"),
    path("replays/<int:replay_id>/runs/<int:original_id>", replays.replay_pair, name="replay-pair"),
]

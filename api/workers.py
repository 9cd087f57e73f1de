"""Integration API for the worker processes (dashboard/ops.py): who runs attempts, and what each holds."""

from datetime import datetime
from typing import Literal

from ninja import Field, Router, Schema
from pydantic import ConfigDict

from runs.selectors.workers import workers_visible

router = Router(tags=["operations"])


class HeldTaskOut(Schema):
    task_id: int
    run_id: int
    key: str
    lease_expires_at: datetime | None


class WorkerOut(Schema):
    name: str = Field(description="host:pid, the start of the lease owner of every task it holds")
    host: str
    pid: int
    kind: Literal["worker", "embedded"]
    threads: int
    started_at: datetime
    heartbeat_age: float = Field(description="Seconds since its sweeper last stamped it")
    state: Literal["live", "gone", "stopped"] = Field(
        description="gone: not stamped for a lease's time (dead or frozen); stopped: a clean stop"
    )
    tasks: list[HeldTaskOut] = Field(description="The running tasks it holds, of the projects the caller can see")

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "name": "worker-1:4242",
                    "host": "worker-1",
                    "pid": 4242,
                    "kind": "worker",
                    "threads": 4,
                    "started_at": "2026-12-02T09:00:00Z",
                    "heartbeat_age": 1.8,
                    "state": "live",
                    "tasks": [
                        {"task_id": 311, "run_id": 42, "key": "worker-3", "lease_expires_at": "2026-12-02T09:14:30Z"}
                    ],
                }
            ]
        }
    )


@router.get("/workers", response=list[WorkerOut], summary="The worker processes, live first, and the tasks each holds")
def list_workers(request):
    return [row.__dict__ for row in workers_visible(request.auth.user, token=request.auth, request=request)]

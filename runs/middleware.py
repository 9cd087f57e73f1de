"""Dramatiq middleware: every worker process also runs the recovery sweeper."""

from dramatiq.middleware import Middleware


class RecoverySweeperMiddleware(Middleware):
    def after_worker_boot(self, broker, worker):
        from .services.recovery import sweeper

        sweeper.start()

    def before_worker_shutdown(self, broker, worker):
        from .services.recovery import sweeper

        sweeper.stop()

"""draftyard data plane: Celery app, tasks, supervisor, and the pipeline core in `stages/`."""

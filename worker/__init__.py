"""autofusion's job workers.

``tasks`` (the Celery task, a thin adapter) -> ``execute`` (one attempt at a job: claim,
plan, fetch, run, store, finish) -> ``supervise`` (the child process, its limits and
progress) -> ``sandbox`` (the child itself: runs fusion_core, no database). ``plan``
merges strategies and checks configs, ``snapshots`` caches compiled registry versions,
``reaper`` requeues jobs whose worker died, ``embedded`` runs all of it in the API process.
"""

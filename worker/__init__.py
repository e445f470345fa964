"""autofusion's job workers.

``tasks`` (the Celery task, a thin adapter) -> ``execute`` (one attempt at a job: claim,
plan, fetch, run, store, finish) -> ``supervise`` (runs the sandbox, with its progress
and heartbeat) -> ``sandbox`` (the job's sandbox: runs fusion_core, no database; both
sides of it are ``app.services.sandbox``'s, shared with the API). ``plan``
merges strategies and checks configs, ``snapshots`` caches compiled registry versions,
``reaper`` requeues jobs whose worker died, ``embedded`` runs all of it in the API process.
"""

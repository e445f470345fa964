"""The service's Alembic environment (``env.py``) and its revisions (``versions/``).

A package so that it ships in the wheel and ``app.migrate`` finds it with
``importlib.resources``, installed or in a checkout; Alembic loads the files by path, so
nothing here is imported by the service itself.
"""

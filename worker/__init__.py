"""autofusion's job workers (Celery tasks arrive with issue 3)."""

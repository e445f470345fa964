"""autofusion's service: the REST API and dashboard (``api``, ``ui``), the service logic
(``services``), settings and the database (``core``, ``db``, ``models``) and the CLI
(``cli``, the composition root that also starts the embedded worker)."""

"""autofusion's service: the REST API and dashboard (``api``, ``ui``), the service logic
(``services``), settings and the database (``core``, ``db``, ``models``), the CLI
(``cli``, the composition root that also starts the embedded worker) and the typed client
(``client``, which installs without the rest: stdlib and httpx only). Importing this
package imports nothing: the base install (the client) runs it too."""

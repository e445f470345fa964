"""Receiving ``POST /v1/optimize``: stream, check, store, then create the job.

1. ``receive_upload`` (``_receive.py``) streams the multipart body into a fresh folder
   under ``data_dir/uploads/`` with python-multipart's streaming parser, counting bytes
   as they arrive (413 as soon as ``max_upload_bytes`` is passed, and up front from
   ``Content-Length``). File parts go straight to disk (``_form.py``); the only part held
   in memory is ``config``, bounded to ``MAX_CONFIG_BYTES``.
2. ``parse_options`` (``_accept.py``, as are steps 3 and 4) validates ``config`` against
   ``OptimizeOptions``.
3. ``inspect_upload`` (``model_work``) parses the ModelProto alone, in a sandbox, and
   refuses what a hostile model could abuse, before anything in ``fusion_core`` loads it.
4. ``store_upload`` puts the model and data files in the artifact store.

The upload folder is removed whatever happens; ``accept_upload`` runs steps 1-4.

Data files too big for one body go first, each as a *data upload* (issue 29:
``POST /v1/uploads``, then ``PATCH``es that resume where the last stopped; ``_staged.py``
holds the rows, ``_parts.py`` the parts and the whole file they make); the form names
them with ``data_upload`` fields, which join the job's data files (``_using.py``).

No step holds a database session: the route creates the job (``create_job_for_upload``)
with a session of its own once the upload is stored, for one short write. While it
streams, an upload holds one of ``UploadSlots`` (``_slots.py``): at most
``max_concurrent_uploads`` per process and ``max_concurrent_uploads_per_tenant`` per
tenant, 429 with Retry-After beyond. Size and time limits on the body itself are
``app/api/limits.py``'s.
"""

from autofusion.app.services.uploads._accept import (
    StoredUpload,
    accept_received,
    accept_upload,
    create_job_for_upload,
    parse_options,
    store_upload,
)
from autofusion.app.services.uploads._form import (
    MAX_CONFIG_BYTES,
    MAX_DATA_FILES,
    Upload,
    check_file_name,
)
from autofusion.app.services.uploads._parts import OFFSET_MEDIA_TYPE, receive_part
from autofusion.app.services.uploads._receive import (
    ClientGone,
    IncomingBody,
    receive_upload,
    remove_folder,
)
from autofusion.app.services.uploads._slots import UploadSlots
from autofusion.app.services.uploads._staged import (
    UPLOADS_PATH,
    DataUploadCreate,
    DataUploadPublic,
    create_data_upload,
    delete_data_upload,
    expire_data_uploads,
    get_data_upload,
    public_view,
    upload_digests,
)

__all__ = [
    "MAX_CONFIG_BYTES",
    "MAX_DATA_FILES",
    "OFFSET_MEDIA_TYPE",
    "UPLOADS_PATH",
    "ClientGone",
    "DataUploadCreate",
    "DataUploadPublic",
    "IncomingBody",
    "StoredUpload",
    "Upload",
    "UploadSlots",
    "accept_received",
    "accept_upload",
    "check_file_name",
    "create_data_upload",
    "create_job_for_upload",
    "delete_data_upload",
    "expire_data_uploads",
    "get_data_upload",
    "parse_options",
    "public_view",
    "receive_part",
    "receive_upload",
    "remove_folder",
    "store_upload",
    "upload_digests",
]

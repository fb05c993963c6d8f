"""``fx console``: a read-only web console over a cluster's records (server-rendered pages).

* :mod:`console.views`: pure view models, from decoded records to what a page shows;
* :mod:`console.store`: the only part that reads the broker (each workload's log kept in memory
  and extended from where it was read up to, never read whole per request);
* :mod:`console.app`: the FastAPI application and its routes (Jinja2 templates beside it);
* :mod:`console.cli`: ``fx console``.

The ``why`` walk is :func:`workload_sdk._why.why`, the receipt checks are
:func:`executor.verify_workload.verify_records`: the console calls them, it repeats neither.
"""

"""The Apache Airflow 3 adapter: submit, observe and cancel runs through the REST API v2.

See :mod:`couler_runtime.airflow.adapter` for the run id, the state mapping and what
the deployment must share with the adapter (its DAGs folder).
"""

from .adapter import CANCEL_NOTE, AirflowAdapter, Transport, run_status, urllib_transport

__all__ = ["CANCEL_NOTE", "AirflowAdapter", "Transport", "run_status", "urllib_transport"]

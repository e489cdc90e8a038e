"""The open-source SDK's ``couler.steps``: distributed training and tuning as steps.

* :mod:`~couler.steps.tensorflow`: ``train`` creates a ``TFJob``;
* :mod:`~couler.steps.pytorch`: ``train`` creates a ``PyTorchJob``;
* :mod:`~couler.steps.mpi`: ``train`` creates an ``MPIJob``;
* :mod:`~couler.steps.katib`: ``run`` creates a Katib ``Experiment``.

Each call adds one resource step (:func:`couler.run_job`) that creates the
custom resource and waits until its status says it succeeded or failed; the
Kubeflow training operator (or Katib) must run in the cluster. Not to be
confused with :mod:`couler.api.steps`, which holds ``run_container`` and friends.
"""

from couler.steps import katib, mpi, pytorch, tensorflow

__all__ = ["katib", "mpi", "pytorch", "tensorflow"]

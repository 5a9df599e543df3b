"""Triton's ``triton_python_backend_utils``, one concern a module; model.py files see it whole as
:mod:`flowserve.nodes.backends.pb_utils` (installed as ``triton_python_backend_utils``)."""

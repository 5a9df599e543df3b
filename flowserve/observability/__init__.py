"""Observability: Prometheus metrics, the web page, request traces (a translator layer, beside
the front ends; it reads the data plane and never imports a front end)."""

"""Layer 2: pure graph algorithms: compile a spec into a plan, validate it, the drawable view of
a plan (drawing it is presentation: flowserve/observability/render)."""

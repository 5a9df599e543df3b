"""Layer 2: pure graph algorithms: compile a spec into a plan, validate it, render it."""

"""The deployment's Python nodes (graphs name them nodes.<module>:<Class>)."""

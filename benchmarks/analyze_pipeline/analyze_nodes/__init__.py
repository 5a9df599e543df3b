"""Python nodes of the benchmark pipeline of ``flowserve analyze`` (graphs/embed.yaml)."""

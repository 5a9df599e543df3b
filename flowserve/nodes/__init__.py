"""Layer 4: concrete node kinds (python, switch, model/graph steps, backends) and their factory."""

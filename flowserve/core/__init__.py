"""Layer 0: tensors, node contract, errors, clock. Depends on nothing but numpy."""

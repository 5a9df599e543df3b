"""Layer 6: transport front ends (HTTP/REST, gRPC), thin translators over the data plane."""

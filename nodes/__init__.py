"""User Python nodes that graphs reference as "nodes.<module>:<Class>"."""

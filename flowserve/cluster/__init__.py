"""Many worker processes as one server (issue 19)."""

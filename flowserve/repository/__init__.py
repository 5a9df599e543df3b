"""The repository layer: scanning, loading and retiring what is served (see repository.py)."""

from flowserve.repository.repository import Repository
from flowserve.repository.settings import RepositorySettings

__all__ = ["Repository", "RepositorySettings"]

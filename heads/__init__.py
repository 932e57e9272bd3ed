"""specheads.heads: draft heads and their on-disk format."""

from .medusa import MedusaConfig, MedusaHeads, ResidualBlock, check_compatible

__all__ = ["MedusaConfig", "MedusaHeads", "ResidualBlock", "check_compatible"]

"""specheads.heads: draft heads and their on-disk format."""

from .eagle import EagleConfig, EagleDraft
from .medusa import MedusaConfig, MedusaHeads, ResidualBlock, check_compatible

__all__ = ["EagleConfig", "EagleDraft", "MedusaConfig", "MedusaHeads", "ResidualBlock", "check_compatible"]

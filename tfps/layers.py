"""Public tf-keras layers of tfps: `tfps.layers.DynamicEmbedding` (raw ids to rows on the ps, no collisions)."""

from tfps.models.dynamic_embedding import DynamicEmbedding

__all__ = ["DynamicEmbedding"]

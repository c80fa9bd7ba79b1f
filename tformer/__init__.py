"""tformer: Transformer sequence-to-sequence models in PyTorch."""

__version__ = "0.1.0"

"""Models: layers (pre/post norm) and the encoder-decoder Transformer."""

from tformer.model.transformer import Attentions, EncoderOutput, ModelOutput, Transformer, build_model

__all__ = ["Attentions", "EncoderOutput", "ModelOutput", "Transformer", "build_model"]

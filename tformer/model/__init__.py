"""Models: embeddings, layers (pre/post norm), encoders and decoders (a stack of layers, or the universal
transformer's ACT stack), the layouts they run on, the decoder cache, and the Transformer composing them."""

from tformer.model.cache import DecoderCache
from tformer.model.transformer import Attentions, EncoderOutput, ModelOutput, Transformer, build_model, upgrade_state

__all__ = ["Attentions", "DecoderCache", "EncoderOutput", "ModelOutput", "Transformer", "build_model", "upgrade_state"]

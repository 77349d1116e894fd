"""polarstack: prove that Polar's inference path through SGLang yields trainable tokens."""

__version__ = "0.1.0"

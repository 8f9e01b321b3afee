"""tdrl.models."""

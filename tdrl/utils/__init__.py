"""tdrl.utils."""

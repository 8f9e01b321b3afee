"""tdrl.launch."""

"""tdrl.train."""

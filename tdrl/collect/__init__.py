"""tdrl.collect."""

"""tdrl.log."""

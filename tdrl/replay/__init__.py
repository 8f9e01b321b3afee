"""tdrl.replay."""
